// The whole run of a suite: select (--filter), warn about what the selection
// cannot catch, shard, run each case (serially or in -j workers) through the
// analysis's check_case, and record what the reports need.
//
//   Suite suite = load_suite("configs/mutants.yaml");
//   SuiteResult result = run_suite(suite, registry, {});
//   std::cout << result.mutation_score().named;
#pragma once

#include <headgrad/loader.hpp>

#include "case/suite.hpp"
#include "judge/run_case.hpp"

namespace headgrad::runner {

// The selected cases of `suite` (options.filter), each run, analyzed when it
// fails a comparison (an `expect: {diagnosis: NAME}` is checked against the
// diagnosis), then cut down to what the reports need (keep_report_data).
// Only options.shard's part of them runs, options.jobs at once (run_cases).
SuiteResult run_suite(const Suite& suite, const PluginRegistry& registry, const RunOptions& options);

}  // namespace headgrad::runner
