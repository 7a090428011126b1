// After a case fails: where the error lives, which dimensions it depends on,
// and which known bug reproduces it. Before a suite runs: which bug classes it
// cannot expose.
//
//   CaseResult r = run_case(c, registry, options);           // failed
//   Localization loc = localize(r, registry, options);      // re-runs at B/T/H = 1 and > 1
//   Diagnosis dx = diagnose(r);                             // bug hypotheses on the same inputs
//   for (auto& w : weak_suite_warnings(suite)) std::cout << w.message;
//
// Signatures used (shared/DESIGN.md, the bug catalog in tools/diagnosis): a
// head-layout bug is invisible at H = 1 and at T = 1; a wrong scale at T = 1;
// a batch mix-up at B = 1; a wrong causal mask without causal.
//
// Shape legend: B batch, T sequence, D model width, H heads, d = D / H.
#pragma once

#include <string>
#include <vector>

#include <headgrad/loader.hpp>

#include "runner/run.hpp"

namespace headgrad::runner {

// ---- localization ----

struct LocalizationRow {
  std::string change;    // "B = 1", "H = 1 (d kept)", "H = 2 (D kept)", "as failed"
  std::string shape;     // describe_case() of the variant
  CaseStatus status = CaseStatus::pass;
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

// Re-runs the failing case's pair at changed shapes (same seed recipe) and
// reads the spread from its tensors. A reference case cannot be re-run at other
// shapes: its localization holds the spread alone.
Localization localize(const CaseResult& failed, const PluginRegistry& registry,
                      const RunOptions& options);

// ---- diagnosis ----

struct HypothesisFit {
  std::string bug;       // catalog name
  std::string side;      // the plugin whose tensors it reproduces
  double worst_ratio = 0;  // max over tensors of |a - b| / (atol + rtol |b|): <= 1 fits
  double max_abs = 0;
};

struct Diagnosis {
  std::vector<HypothesisFit> fits;  // the hypotheses that reproduce a side, best first
  std::string judged_side;          // the side found buggy ("" when none fits)
  std::string correct_side;         // the side the correct attention reproduces, if any
  std::string sentence;             // the verdict in words (says so when none fits)
  std::string best() const { return fits.empty() ? std::string() : fits.front().bug; }
};

// Runs every catalog hypothesis on the case's inputs and keeps those that
// reproduce one side's output and gradients within the case's tolerance.
Diagnosis diagnose(const CaseResult& failed);

// ---- weak suites ----

struct WeakSuiteWarning {
  std::string condition;             // "every case has H = 1"
  std::vector<std::string> bugs;     // what it cannot expose
  std::string message;               // one line for the terminal
};

std::vector<WeakSuiteWarning> weak_suite_warnings(const std::vector<const CaseSpec*>& cases);

}  // namespace headgrad::runner
