#include "analysis/analyze.hpp"
#include "analysis/internal.hpp"
#include "analysis/findings.hpp"

#include <chrono>

namespace headgrad::analysis {

using namespace runner;

CaseResult check_case(const CaseSpec& spec, const PluginRegistry& registry, const RunOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  CaseInputs inputs;
  CaseResult res = run_case(spec, registry, options, &inputs);
  const bool failed = res.status == CaseStatus::fail || res.status == CaseStatus::xfail;
  if (failed && !res.tensors.empty()) {
    res.diagnosis = diagnose(res, inputs);
    const std::vector<VariantRun> runs =
        spec.is_reference() ? std::vector<VariantRun>{} : run_variants(spec, registry, options);
    res.localization = localize_from(res, runs);
    confirm_with_variants(*res.diagnosis, runs);
    rerun_under_tile_permutation(*res.diagnosis, res, inputs, registry, options);
    if (res.diagnosis->fits.empty()) {  // outside the catalog: what the evidence still shows
      std::vector<VariantEvidence> evidence;
      for (const auto& run : runs)
        if (run.error.empty()) evidence.push_back({run.variant.change, &run.variant.spec, &run.result, &run.inputs});
      find_outside_catalog(*res.diagnosis, res, inputs, evidence);
      write_verdict(*res.diagnosis);
    }
    for (const auto& clue : rope_clues(res, inputs)) res.diagnosis->sentence += " " + clue;
    if (const std::string p = precision_sentence(res); !p.empty()) res.diagnosis->sentence += " " + p;
    const std::string named = res.diagnosis->best();
    const bool as_expected = spec.expect_diagnosis == "none" ? named.empty() : named == spec.expect_diagnosis;
    if (res.status == CaseStatus::xfail && !spec.expect_diagnosis.empty() && !as_expected) {
      res.status = CaseStatus::fail;
      res.cause += (res.cause.empty() ? "" : "; ") + std::string("expected the diagnosis ") +
                   spec.expect_diagnosis + ", got " + (named.empty() ? "none" : named);
    }
  }
  keep_report_data(res, options.keep_tensors);
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace headgrad::analysis
