// The JSON report: everything the terminal shows, for machines.
#include <cmath>

#include <nlohmann/json.hpp>

#include "runner/report.hpp"

#ifndef HEADGRAD_VERSION
#define HEADGRAD_VERSION "unknown"
#endif

namespace headgrad::runner {

namespace {

using nlohmann::json;

json number(double x) { return std::isfinite(x) ? json(x) : json(nullptr); }

json tolerance_json(const Tolerance& t) { return {{"atol", t.atol}, {"rtol", t.rtol}}; }

json tensor_json(const TensorComparison& t) {
  json j = {{"name", t.name},
            {"shape", t.shape},
            {"tolerance", tolerance_json(t.tolerance)},
            {"allclose", t.allclose},
            {"max_abs", number(t.max_abs)},
            {"max_rel", number(t.max_rel)},
            {"numel", t.numel},
            {"mismatched", t.mismatched},
            {"problem", t.problem.empty() ? json(nullptr) : json(t.problem)}};
  if (t.worst)
    j["worst"] = {{"index", t.worst->index}, {"where", t.worst->where}, {"lhs", number(t.worst->lhs)},
                  {"rhs", number(t.worst->rhs)}};
  else
    j["worst"] = nullptr;
  return j;
}

json case_json(const CaseResult& r) {
  const CaseSpec& c = r.spec;
  json dims = json::object();
  for (const auto& d : dim_names(c.level))
    if (c.dims.get(d) > 0) dims[d] = c.dims.get(d);
  json sweep = json::object();
  for (const auto& [d, v] : c.sweep_point) sweep[d] = v;
  json tolerances = json::object();
  for (const auto& name : c.check) tolerances[name] = tolerance_json(c.tolerance_for(name));
  json sides = json::array();
  for (const auto& s : r.sides)
    sides.push_back({{"plugin", s.plugin},
                     {"status", side_status_name(s.status)},
                     {"cause", s.cause.empty() ? json(nullptr) : json(s.cause)},
                     {"seconds", s.seconds},
                     {"compute_seconds", s.compute_seconds}});
  json tensors = json::array();
  for (const auto& t : r.tensors) tensors.push_back(tensor_json(t));
  return {{"name", c.name},
          {"base_name", c.base_name},
          {"status", case_status_name(r.status)},
          {"passed", is_success(r.status)},
          {"cause", r.cause.empty() ? json(nullptr) : json(r.cause)},
          {"source", c.source.str()},
          {"level", level_name(c.level)},
          {"shape", dims},
          {"sweep", sweep},
          {"description", describe_case(c)},
          {"dtype", dtype_name(c.dtype)},
          {"causal", c.causal},
          {"scale", c.scale ? json(*c.scale) : json(nullptr)},
          {"mask", c.mask_file.empty() ? json(nullptr) : json(c.mask_file.string())},
          {"input_layout", layout_name(c.layout)},
          {"seed", c.seed},
          {"compare", c.compare},
          {"reference", c.is_reference() ? json(c.reference_text) : json(nullptr)},
          {"lhs", r.lhs_label},
          {"rhs", r.rhs_label},
          {"check", c.check},
          {"tolerance", tolerances},
          {"expect", {{"fail", c.expect_fail},
                      {"diagnosis", c.expect_diagnosis.empty() ? json(nullptr) : json(c.expect_diagnosis)}}},
          {"max_abs", number(r.max_abs())},
          {"seconds", r.seconds},
          {"sides", sides},
          {"tensors", tensors}};
}

}  // namespace

nlohmann::json json_report(const SuiteResult& result) {
  json cases = json::array();
  for (const auto& r : result.cases) cases.push_back(case_json(r));
  json counts = json::object();
  for (CaseStatus s : {CaseStatus::pass, CaseStatus::fail, CaseStatus::error, CaseStatus::xfail, CaseStatus::xpass})
    counts[std::string(case_status_name(s))] = result.count(s);
  return {{"headgrad_version", HEADGRAD_VERSION},
          {"suite", result.name},
          {"file", result.file.string()},
          {"summary",
           {{"cases", result.cases.size()},
            {"passed", result.passed()},
            {"failed", result.failed()},
            {"counts", counts},
            {"seconds", result.seconds},
            {"exit_code", result.exit_code()}}},
          {"cases", cases}};
}

}  // namespace headgrad::runner
