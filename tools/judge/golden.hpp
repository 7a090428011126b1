// The golden and the baseline of the relative_to_baseline rule (suite.hpp):
// the oracle plugin run in float64 (the golden) and in the case's dtype (the
// baseline), on the case's inputs, each in its own child like the other sides.
//
//   GoldenRun g = run_golden(c, inputs, registry, exec);   // c.relative_rule()
//   if (!g.cause.empty()) ...                              // an oracle run failed
//   judge_sides(cmps, c, g, lhs, rhs, "per_head", "batched");
//
// The oracle is per_head; a case without it (and without golden/) is refused. A
// reference directory with a golden/ folder brings its own pair instead: the
// golden is golden/'s float64 tensors and the baseline the directory's tensors
// in the case's dtype (the same math in both precisions; no oracle runs).
// Without golden/ the reference's tensors are judged like a side.
#pragma once

#include <string>
#include <vector>

#include <headgrad/loader.hpp>

#include "judge/compare.hpp"
#include "exec/execute.hpp"
#include "case/inputs.hpp"
#include "case/suite.hpp"

namespace headgrad::runner {

struct GoldenRun {
  std::string oracle;          // the plugin that ran: "per_head"
  std::string golden_label;    // "per_head in float64" or "refs/x/golden"
  std::string baseline_label;  // "per_head in float32"
  TensorSet golden, baseline;
  std::vector<SideResult> runs;  // the oracle's runs (one or two)
  std::string cause;             // why a run gave no tensors; empty when both are here
  bool plugin_error = false;     // that run could not run at all (exit code 3)
};

// per_head: never one of the compared plugins in its place (the side under
// test would judge itself).
std::string oracle_name(const CaseSpec& c, const PluginRegistry& registry);

// Why a case judged relative_to_baseline has no golden (per_head not loaded,
// and no reference golden/ folder), naming what is missing; empty when it has one.
std::string missing_golden(const CaseSpec& c, const PluginRegistry& registry);
// ConfigError (exit 2) at the first such case, before any case runs.
void check_goldens(const std::vector<const CaseSpec*>& cases, const PluginRegistry& registry);

// The same values in `dtype`, contiguous (a float32 input is exact in float64).
CaseInputs inputs_in_dtype(const CaseInputs& in, DType dtype);

GoldenRun run_golden(const CaseSpec& c, const CaseInputs& in, const PluginRegistry& registry,
                     const ExecOptions& exec);

// Each comparison of `cmps` judged by the rule with every side against the golden:
// both plugins, or the plugin and the reference's own tensors.
void judge_sides(std::vector<TensorComparison>& cmps, const CaseSpec& c, const GoldenRun& g, const TensorSet& lhs,
                 const TensorSet& rhs, const std::string& lhs_label, const std::string& rhs_label);

}  // namespace headgrad::runner
