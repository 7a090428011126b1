// The analysis: a layer above judging. It runs cases through run_case
// (judge/run_case.hpp), and for each case that fails a comparison says where the
// error lives, which dimensions it depends on, and which known bug reproduces
// it; before a suite runs, which bug classes it cannot expose.
//
//   CaseResult r = check_case(c, registry, options);     // run, and analyzed if it failed
//   // or step by step:
//   CaseInputs in;
//   CaseResult r = run_case(c, registry, options, &in);   // runner: failed
//   Diagnosis dx = diagnose(r, in);                       // bug hypotheses on the same inputs
//   Localization loc = localize(r, registry, options);   // re-runs with one dim changed
//   for (auto& w : weak_suite_warnings(cases)) std::cout << w.message;
//
// Signatures used (the bug catalog, analysis/catalog.hpp): a head-layout bug
// is invisible at H = 1 and at T = 1; a wrong scale at T = 1; a batch mix-up
// at B = 1; a wrong causal mask without causal; a bottom-right causal mask at
// Tq = Tk; a finite mask fill without a fully masked row; a softmax without
// the max subtracted without large logits; a RoPE bug without a rope block
// (and most at T = 1, r = 2 or constant positions; a uniform position shift
// everywhere but in the taps and at the rope level).
//
// Shape legend: B batch, T sequence, D model width, H heads, d = D / H.
#pragma once

#include <string>
#include <vector>

#include <headgrad/loader.hpp>

#include "case/findings.hpp"
#include "judge/run_case.hpp"

namespace headgrad::analysis {

using runner::CaseInputs;
using runner::CaseResult;
using runner::CaseSpec;
using runner::Diagnosis;
using runner::Localization;
using runner::RunOptions;
using runner::WeakSuiteWarning;

// ---- one case ----

// One case as run_suite (job/run_suite.hpp) runs it: run_case, then for a
// failed comparison the diagnosis, the localization, their confirmation and
// the clues; an `expect: {diagnosis: NAME}` is checked against the diagnosis.
CaseResult check_case(const CaseSpec& spec, const PluginRegistry& registry, const RunOptions& options);

// ---- localization ----

// Re-runs the failing case's pair with one thing changed (same seed recipe):
// B; at mha level T and H (d kept, D kept); at core level Tq = Tk, Tq = 1,
// Tq > Tk, Tq = Tk = 1, H, d = 1, the mask file off; causal off; with grouped
// kv heads G = 1 and Hkv = 1; with a rope block the rotation off, rotary_dim = 2
// and every position constant (the rope level: B, T and those two). Reads the
// spread from its tensors (failed.lhs, failed.rhs). Variants that cannot run
// (a mask file fixes B, Tq and Tk) are listed as such. A reference case
// cannot be re-run at other shapes: its localization holds the spread alone.
Localization localize(const CaseResult& failed, const PluginRegistry& registry, const RunOptions& options);

// ---- diagnosis ----

// Runs every catalog hypothesis on the inputs the case's sides got and keeps
// those that reproduce one side's output and gradients within the case's
// tolerance, at this one shape. check_case goes further: a hypothesis is kept
// only if it also reproduces that side at every localization variant that ran
// (the others are listed in Diagnosis::ruled_out, with the variant that refutes them);
// in a grouped-kv case it re-runs the failing plugin under the tile permutation
// of query heads (Diagnosis::evidence), which confirms or rules out kv_map_tile;
// and when no catalog bug is left, it adds the findings outside the catalog
// (analysis/findings.hpp). A reference's own tensors are a side like a
// plugin's (Diagnosis::reference_side): a buggy function that wrote it is named.
Diagnosis diagnose(const CaseResult& failed, const CaseInputs& inputs);

// Under relative_to_baseline, what the errors are worth in the case's dtype,
// tensor by tensor: "as accurate as the oracle in this dtype" for a ratio near 1
// (up to kAsAccurateRatio), else how many times the oracle's own error, with the
// figures; check_case appends it to the diagnosis. Empty for allclose cases.
std::string precision_sentence(const CaseResult& r);

// ---- weak suites ----

std::vector<WeakSuiteWarning> weak_suite_warnings(const std::vector<const CaseSpec*>& cases);

// The blind spots that depend on what the suite's plugins declare (mutants left
// out): a plugin that declares bool_mask while no case has a boolean mask.
// run_suite adds these to weak_suite_warnings'.
std::vector<WeakSuiteWarning> capability_warnings(const std::vector<const CaseSpec*>& cases,
                                                  const PluginRegistry& registry);

}  // namespace headgrad::analysis
