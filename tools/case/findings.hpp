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

// What the evidence shows outside the catalog, for one side (analysis/findings.hpp):
//   computation       which part of attention is wrong, from which tensors differ and which match
//   relation          an exact relation between the side and the correct attention (a factor
//                     matched to a shape expression, heads permuted, one head wrong, a shift or
//                     reversal along T, a weight transposed, two inputs exchanged, a row
//                     normalization missing, a projection's path into dx missing)
//   pair              two bugs at once (catalog bugs or relations) that reproduce the side
//                     exactly where neither alone does
//   missing_gradient  the side returned no gradient for an input
//   reference         a reference side's own tensors against the correct attention
struct Finding {
  std::string kind;                   // computation | relation | pair | missing_gradient
  std::string relation;               // for relations and pairs: a stable id ("grad_factor", "heads_permuted", ...)
  std::string side;                   // the side it speaks of
  std::vector<std::string> tensors;   // the tensors it rests on
  std::string figure;                 // the measured figure: "2 = sqrt(d)", "rotated by 1", "head 3"
  std::vector<std::string> confirmed_at;  // localization variants where it held again
  std::string sentence;               // one plain sentence
};

struct Diagnosis {
  std::vector<HypothesisFit> fits;  // the hypotheses that reproduce a side, best first
  std::string judged_side;          // the side found buggy ("" when none fits)
  std::string correct_side;         // the side the correct attention reproduces, if any
  std::string reference_side;       // a reference case: the reference's label (its tensors are diagnosed too)
  std::string sentence;             // the verdict in words (says so when none fits)
  std::vector<std::string> ruled_out;  // "bug: why", hypotheses that fit the failing shape but not the localization
  std::vector<HypothesisFit> near;     // no fit: the nearest hypothesis when within 10x of the tolerance
  // Re-runs of a failing side on transformed inputs, and what they showed
  // ("re-run of X with its query heads in tile order matches ...").
  std::vector<std::string> evidence;
  // When no catalog bug fits: what the evidence shows instead (empty when a bug fits or a side is correct).
  std::vector<Finding> findings;
  std::string best() const { return fits.empty() ? std::string() : fits.front().bug; }
};

// ---- weak suites ----

struct WeakSuiteWarning {
  std::string condition;             // "every case has H = 1"
  std::vector<std::string> bugs;     // what it cannot expose
  std::string message;               // one line for the terminal
};

}  // namespace headgrad::runner
