// The JSON report: everything the terminal shows, for machines.
#include <cmath>

#include <nlohmann/json.hpp>

#include "report/report.hpp"

#ifndef HEADGRAD_VERSION
#define HEADGRAD_VERSION "unknown"
#endif

namespace headgrad::runner {

namespace {

using nlohmann::json;

// exact: NaN and Inf kept as numbers, for the binary form a -j worker sends
// (CBOR holds them; JSON text has no such numbers: null there).
thread_local bool t_exact = false;

json number(double x) { return std::isfinite(x) || t_exact ? json(x) : json(nullptr); }

json numbers_json(const std::vector<double>& v) {
  json a = json::array();
  for (double x : v) a.push_back(number(x));
  return a;
}

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
  if (t.baseline) {
    const BaselineCheck& b = *t.baseline;
    json profile = json::array(), base_profile = json::array();
    for (double e : b.err_by_position) profile.push_back(number(e));
    for (double e : b.baseline_by_position) base_profile.push_back(number(e));
    json head_profiles = json::array();
    for (const auto& head : b.err_by_head_position) head_profiles.push_back(numbers_json(head));
    j["baseline"] = {{"side", b.side},
                     {"error", number(b.err)},
                     {"baseline_error", number(b.baseline_err)},
                     {"ratio", number(b.ratio)},
                     {"k", b.k},
                     {"floor", number(b.floor)},
                     {"bound", number(b.bound)},
                     {"normwise", number(b.normwise)},
                     {"baseline_normwise", number(b.baseline_normwise)},
                     {"position_axis", b.position_axis.empty() ? json(nullptr) : json(b.position_axis)},
                     {"error_by_position", profile},
                     {"baseline_error_by_position", base_profile},
                     {"error_by_head_position", head_profiles}};
  } else {
    j["baseline"] = nullptr;
  }
  if (t.worst)
    j["worst"] = {{"index", t.worst->index}, {"where", t.worst->where}, {"lhs", number(t.worst->lhs)},
                  {"rhs", number(t.worst->rhs)}};
  else
    j["worst"] = nullptr;
  return j;
}

json fit_json(const HypothesisFit& f) {
  return {{"bug", f.bug},   {"side", f.side}, {"worst_ratio", number(f.worst_ratio)}, {"max_abs", number(f.max_abs)},
          {"explanation", f.explanation}, {"fix", f.fix}};
}

json diagnosis_json(const Diagnosis& d) {
  json fits = json::array(), near = json::array();
  for (const auto& f : d.fits) fits.push_back(fit_json(f));
  for (const auto& f : d.near) near.push_back(fit_json(f));
  return {{"best", d.best().empty() ? json(nullptr) : json(d.best())},
          {"fits", fits},
          {"near", near},
          {"judged_side", d.judged_side.empty() ? json(nullptr) : json(d.judged_side)},
          {"correct_side", d.correct_side.empty() ? json(nullptr) : json(d.correct_side)},
          {"ruled_out", d.ruled_out},
          {"evidence", d.evidence},
          {"sentence", d.sentence}};
}

json localization_json(const Localization& loc) {
  json rows = json::array();
  for (const auto& row : loc.rows)
    rows.push_back({{"change", row.change}, {"shape", row.shape}, {"status", case_status_name(row.status)},
                    {"max_abs", number(row.max_abs)}, {"cause", row.cause}});
  json spread = json::array();
  for (const auto& s : loc.spread)
    spread.push_back({{"tensor", s.tensor}, {"per_head", numbers_json(s.per_head)},
                      {"per_position", numbers_json(s.per_position)}, {"per_batch", numbers_json(s.per_batch)},
                      {"tolerance", number(s.tolerance)}});
  return {{"rows", rows},           {"depends_on", loc.depends_on}, {"independent_of", loc.independent_of},
          {"sentence", loc.sentence}, {"where", loc.where},           {"spread", spread}};
}

json error_maps_json(const std::vector<TensorErrorMaps>& all) {
  json a = json::array();
  for (const auto& t : all) {
    json maps = json::array();
    for (const auto& m : t.maps)
      maps.push_back({{"title", m.title},         {"rows", m.rows},           {"cols", m.cols},
                      {"row_step", m.row_step},   {"col_step", m.col_step},   {"cell_rows", m.cell_rows},
                      {"cell_cols", m.cell_cols}, {"cells", numbers_json(m.cells)}, {"row_block", m.row_block},
                      {"col_block", m.col_block}, {"position_rows", m.position_rows}});
    a.push_back({{"tensor", t.tensor}, {"shape", t.shape}, {"allclose", t.allclose}, {"vmax", number(t.vmax)},
                 {"non_finite", t.non_finite}, {"axes", t.axes}, {"batches", t.batches}, {"maps", maps}});
  }
  return a;
}

json rope_json(const std::optional<RopeCase>& rope) {
  if (!rope) return nullptr;
  const RopeCase& r = *rope;
  return {{"theta", r.theta}, {"style", rope_style_name(r.style)}, {"rotary_dim", r.rotary_dim},
          {"offset", r.offset}, {"positions", r.rows},  {"per_row", r.per_row},
          {"generator", r.generator}, {"start", r.start}, {"q_offset", r.q_offset},
          {"description", r.describe()}};
}

json case_json(const CaseResult& r) {
  const CaseSpec& c = r.spec;
  json dims = json::object();
  for (const auto& d : dim_names(c.level))
    if (c.dims.get(d) > 0) dims[d] = c.dims.get(d);
  for (const auto& d : optional_dim_names(c.level))  // Hkv and an mha-level d, when given
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
          {"causal_alignment", c.causal ? json(causal_alignment_name(c.causal_alignment)) : json(nullptr)},
          {"scale", c.scale ? json(*c.scale) : json(nullptr)},
          {"mask", c.mask_file.empty() ? json(nullptr) : json(c.mask_file.string())},
          {"input_layout", layout_name(c.layout)},
          {"bias", c.bias},
          {"seed", c.seed},
          {"compare", c.compare},
          {"reference", c.is_reference() ? json(c.reference_text) : json(nullptr)},
          {"lhs", r.lhs_label},
          {"rhs", r.rhs_label},
          {"check", c.check},
          {"tolerance", tolerances},
          {"tolerance_rule", c.relative_rule() ? "relative_to_baseline" : "allclose"},
          {"golden", r.golden_label.empty() ? json(nullptr) : json(r.golden_label)},
          {"baseline", r.baseline_label.empty() ? json(nullptr) : json(r.baseline_label)},
          {"expect", {{"fail", c.expect_fail},
                      {"diagnosis", c.expect_diagnosis.empty() ? json(nullptr) : json(c.expect_diagnosis)}}},
          {"max_abs", number(r.max_abs())},
          {"seconds", r.seconds},
          {"sides", sides},
          {"tensors", tensors},
          {"mutant", r.mutant.empty() ? json(nullptr) : json(r.mutant)},
          {"diagnosis", r.diagnosis ? diagnosis_json(*r.diagnosis) : json(nullptr)},
          {"localization", r.localization ? localization_json(*r.localization) : json(nullptr)},
          // what merging shard reports (report_merge.cpp) rebuilds a case from
          {"source_at", {{"file", c.source.file}, {"line", c.source.line}, {"column", c.source.column}}},
          {"default_tolerance", tolerance_json(c.tolerance)},
          {"rope", rope_json(c.rope)},
          {"taps", c.taps},
          {"timeout", c.timeout_s},
          {"error_maps", error_maps_json(r.error_maps)}};
}

json mutation_json(const MutationScore& m) {
  if (m.mutants == 0) return nullptr;
  return {{"mutants", m.mutants}, {"caught", m.caught}, {"named", m.named}};
}

json warnings_json(const std::vector<WeakSuiteWarning>& warnings) {
  json a = json::array();
  for (const auto& w : warnings) a.push_back({{"condition", w.condition}, {"bugs", w.bugs}, {"message", w.message}});
  return a;
}

// Replaces invalid UTF-8 in every string value (dump() would throw on it); returns how many bytes.
std::size_t make_valid_utf8(json& j) {
  std::size_t replaced = 0;
  if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    std::size_t here = 0;
    std::string fixed = valid_utf8(s, &here);
    if (here) j = std::move(fixed);
    replaced += here;
  } else if (j.is_structured()) {
    for (auto& item : j) replaced += make_valid_utf8(item);
  }
  return replaced;
}

}  // namespace

nlohmann::json case_report_json(const CaseResult& r, bool exact) {
  const bool was = t_exact;
  t_exact = exact;
  json j = case_json(r);
  t_exact = was;
  return j;
}

nlohmann::json json_report(const SuiteResult& result) {
  json cases = json::array();
  for (const auto& r : result.cases) cases.push_back(case_json(r));
  json counts = json::object();
  for (CaseStatus s : {CaseStatus::pass, CaseStatus::fail, CaseStatus::error, CaseStatus::xfail, CaseStatus::xpass})
    counts[std::string(case_status_name(s))] = result.count(s);
  json report = {{"headgrad_version", HEADGRAD_VERSION},
          {"suite", result.name},
          {"file", result.file.string()},
          {"summary",
           {{"cases", result.cases.size()},
            {"passed", result.passed()},
            {"failed", result.failed()},
            {"counts", counts},
            {"seconds", result.seconds},
            {"exit_code", result.exit_code()}}},
          {"mutation_score", mutation_json(result.mutation_score())},
          {"warnings", warnings_json(result.warnings)},
          {"shard", {{"index", result.shard.index}, {"count", result.shard.count}, {"cases", result.case_indices}}},
          {"suite_identity", {{"file_hash", result.identity.file_hash}, {"cases_hash", result.identity.cases_hash},
                              {"selected", result.identity.selected}}},
          {"cases", cases}};
  json notes = json::array();
  if (const std::size_t replaced = make_valid_utf8(report)) notes.push_back(text_replaced_note(replaced));
  report["notes"] = notes;
  return report;
}

}  // namespace headgrad::runner
