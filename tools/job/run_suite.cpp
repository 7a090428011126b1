#include "job/run_suite.hpp"

#include <chrono>

#include "analysis/analyze.hpp"
#include "analysis/catalog.hpp"
#include "case/select.hpp"
#include "job/workers.hpp"

namespace headgrad::runner {

SuiteResult run_suite(const Suite& suite, const PluginRegistry& registry, const RunOptions& options) {
  diagnosis::check_expected_diagnoses(suite);
  const auto t0 = std::chrono::steady_clock::now();
  SuiteResult result;
  result.name = suite.name;
  result.file = suite.file;
  const std::vector<const CaseSpec*> selected = select_cases(suite, options.filter);
  result.warnings = analysis::weak_suite_warnings(selected);  // the whole selection's, in every shard alike
  for (auto& w : analysis::capability_warnings(selected, registry)) result.warnings.push_back(std::move(w));
  result.identity = suite_identity(suite, selected);
  result.shard = options.shard;
  const std::vector<const CaseSpec*> cases = shard_cases(selected, options.shard);
  for (const CaseSpec* c : cases) result.case_indices.push_back(static_cast<std::size_t>(c - suite.cases.data()));
  result.cases = run_cases(
      cases, [&](const CaseSpec& c, const RunOptions& o) { return analysis::check_case(c, registry, o); }, options);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace headgrad::runner
