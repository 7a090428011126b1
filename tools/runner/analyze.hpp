// After a case fails: where the error lives, which dimensions it depends on,
// and which known bug reproduces it. Before a suite runs: which bug classes it
// cannot expose.
//
//   CaseResult r = run_case(c, registry, options);           // failed
//   Localization loc = localize(r, registry, options);      // re-runs at B/T/H = 1 and > 1
//   Diagnosis dx = diagnose(r);                             // bug hypotheses on the same inputs
//   for (auto& w : weak_suite_warnings(suite)) std::cout << w.message;
//
// Signatures used (docs/design.md, the bug catalog in tools/diagnosis): a
// head-layout bug is invisible at H = 1 and at T = 1; a wrong scale at T = 1;
// a batch mix-up at B = 1; a wrong causal mask without causal.
//
// Shape legend: B batch, T sequence, D model width, H heads, d = D / H.
#pragma once

#include <string>
#include <vector>

#include <headgrad/loader.hpp>

#include "runner/findings.hpp"
#include "runner/run.hpp"

namespace headgrad::runner {

// ---- localization ----

// Re-runs the failing case's pair at changed shapes (same seed recipe) and
// reads the spread from its tensors. A reference case cannot be re-run at other
// shapes: its localization holds the spread alone.
Localization localize(const CaseResult& failed, const PluginRegistry& registry,
                      const RunOptions& options);

// ---- diagnosis ----

// Runs every catalog hypothesis on the case's inputs and keeps those that
// reproduce one side's output and gradients within the case's tolerance.
Diagnosis diagnose(const CaseResult& failed);

// ---- weak suites ----

std::vector<WeakSuiteWarning> weak_suite_warnings(const std::vector<const CaseSpec*>& cases);

}  // namespace headgrad::runner
