// What the analysis of a failing case found (tools/analysis computes it; the
// reports print it, needing nothing else of the analysis): where the error lives, what it depends on, which known
// bug reproduces it; and what a suite cannot expose.
#pragma once

#include <string>
#include <vector>

#include "case/suite.hpp"

namespace headgrad::runner {

enum class CaseStatus;

// ---- localization ----

struct LocalizationRow {
  std::string change;    // "B = 1", "H = 1 (d kept)", "H = 2 (D kept)", "as failed"
  std::string shape;     // describe_case() of the variant
  CaseStatus status{};  // of the variant's run
  double max_abs = 0;
  std::string cause;     // when the variant errored
};

// How the error spreads over one tensor's slots: the max |a - b| per head
// block, per position, per batch item (empty where the tensor has no such dim).
struct ErrorSpread {
  std::string tensor;
  std::vector<double> per_head;
  std::vector<double> per_position;
  std::vector<double> per_batch;
  double tolerance = 0;  // atol + rtol * max|b|: a slot above it "differs"
};

struct Localization {
  std::vector<LocalizationRow> rows;
  std::vector<std::string> depends_on;      // dims whose = 1 variant passes: "H", "T", "B"
  std::vector<std::string> independent_of;  // dims whose = 1 variant still fails
  std::string sentence;                     // the dependence in words
  std::vector<ErrorSpread> spread;          // one per differing tensor
  std::string where;                        // heads, positions, batch items, in words
};

// ---- diagnosis ----

struct HypothesisFit {
  std::string bug;       // catalog name
  std::string explanation, fix;  // the catalog's lines for it
  std::string side;      // the plugin whose tensors it reproduces
  double worst_ratio = 0;  // max over tensors of |a - b| / (atol + rtol |b|): <= 1 fits
  double max_abs = 0;
};

struct Diagnosis {
  std::vector<HypothesisFit> fits;  // the hypotheses that reproduce a side, best first
  std::string judged_side;          // the side found buggy ("" when none fits)
  std::string correct_side;         // the side the correct attention reproduces, if any
  std::string sentence;             // the verdict in words (says so when none fits)
  std::vector<std::string> ruled_out;  // "bug: why", hypotheses that fit the failing shape but not the localization
  std::vector<HypothesisFit> near;     // no fit: the nearest hypothesis when within 10x of the tolerance
  // Re-runs of a failing side on transformed inputs, and what they showed
  // ("re-run of X with its query heads in tile order matches ...").
  std::vector<std::string> evidence;
  std::string best() const { return fits.empty() ? std::string() : fits.front().bug; }
};

// ---- weak suites ----

struct WeakSuiteWarning {
  std::string condition;             // "every case has H = 1"
  std::vector<std::string> bugs;     // what it cannot expose
  std::string message;               // one line for the terminal
};

}  // namespace headgrad::runner
