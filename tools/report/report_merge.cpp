// Reading the JSON report back (report_json.cpp writes it): a case for the
// reports, and the shards of one suite merged into one result.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "report/report.hpp"

namespace headgrad::runner {

namespace {

using nlohmann::json;

// The key's value; std::invalid_argument naming the key when it is absent.
const json& at(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) throw std::invalid_argument(std::string("no '") + key + "' key");
  return j.at(key);
}

template <class T>
T value_of(const json& j, const char* key) {
  try {
    return at(j, key).get<T>();
  } catch (const json::exception& e) {
    throw std::invalid_argument(std::string("'") + key + "': " + e.what());
  }
}

// null (a NaN or Inf in JSON text) reads as NaN.
double number_of(const json& j) { return j.is_null() ? std::numeric_limits<double>::quiet_NaN() : j.get<double>(); }
double number_at(const json& j, const char* key) { return number_of(at(j, key)); }
std::vector<double> numbers_at(const json& j, const char* key) {
  std::vector<double> v;
  for (const auto& x : at(j, key)) v.push_back(number_of(x));
  return v;
}
std::string text_or_empty(const json& j, const char* key) {
  const json& v = at(j, key);
  return v.is_null() ? std::string() : v.get<std::string>();
}

// The enum value whose name is `text` (the names the reports write).
template <class E, class Name>
E named(const json& j, const char* key, std::initializer_list<E> all, Name name) {
  const std::string text = value_of<std::string>(j, key);
  for (E e : all)
    if (name(e) == text) return e;
  throw std::invalid_argument(std::string("'") + key + "': unknown value '" + text + "'");
}

CaseStatus case_status_at(const json& j, const char* key) {
  return named(j, key, {CaseStatus::pass, CaseStatus::fail, CaseStatus::error, CaseStatus::xfail, CaseStatus::xpass},
               case_status_name);
}

Tolerance tolerance_of(const json& j) { return {value_of<double>(j, "atol"), value_of<double>(j, "rtol")}; }

HypothesisFit fit_of(const json& f) {
  HypothesisFit fit;
  fit.bug = value_of<std::string>(f, "bug");
  fit.side = value_of<std::string>(f, "side");
  fit.worst_ratio = number_at(f, "worst_ratio");
  fit.max_abs = number_at(f, "max_abs");
  fit.explanation = f.value("explanation", "");  // absent from older reports
  fit.fix = f.value("fix", "");
  return fit;
}

Diagnosis diagnosis_of(const json& d) {
  Diagnosis out;
  for (const auto& f : at(d, "fits")) out.fits.push_back(fit_of(f));
  if (d.contains("near"))
    for (const auto& f : d.at("near")) out.near.push_back(fit_of(f));
  out.judged_side = text_or_empty(d, "judged_side");
  out.correct_side = text_or_empty(d, "correct_side");
  out.ruled_out = value_of<std::vector<std::string>>(d, "ruled_out");
  if (d.contains("evidence")) out.evidence = value_of<std::vector<std::string>>(d, "evidence");
  out.sentence = value_of<std::string>(d, "sentence");
  return out;
}

Localization localization_of(const json& l) {
  Localization out;
  for (const auto& row : at(l, "rows"))
    out.rows.push_back({value_of<std::string>(row, "change"), value_of<std::string>(row, "shape"),
                        case_status_at(row, "status"), number_at(row, "max_abs"), value_of<std::string>(row, "cause")});
  out.depends_on = value_of<std::vector<std::string>>(l, "depends_on");
  out.independent_of = value_of<std::vector<std::string>>(l, "independent_of");
  out.sentence = value_of<std::string>(l, "sentence");
  out.where = value_of<std::string>(l, "where");
  for (const auto& s : at(l, "spread"))
    out.spread.push_back({value_of<std::string>(s, "tensor"), numbers_at(s, "per_head"), numbers_at(s, "per_position"),
                          numbers_at(s, "per_batch"), number_at(s, "tolerance")});
  return out;
}

std::vector<TensorErrorMaps> error_maps_of(const json& a) {
  std::vector<TensorErrorMaps> out;
  for (const auto& t : a) {
    TensorErrorMaps m;
    m.tensor = value_of<std::string>(t, "tensor");
    m.shape = value_of<Shape>(t, "shape");
    m.allclose = value_of<bool>(t, "allclose");
    m.vmax = number_at(t, "vmax");
    m.non_finite = value_of<bool>(t, "non_finite");
    m.axes = value_of<std::string>(t, "axes");
    m.batches = value_of<std::int64_t>(t, "batches");
    for (const auto& e : at(t, "maps")) {
      ErrorMap map;
      map.title = value_of<std::string>(e, "title");
      map.rows = value_of<std::int64_t>(e, "rows");
      map.cols = value_of<std::int64_t>(e, "cols");
      map.row_step = value_of<std::int64_t>(e, "row_step");
      map.col_step = value_of<std::int64_t>(e, "col_step");
      map.cell_rows = value_of<std::int64_t>(e, "cell_rows");
      map.cell_cols = value_of<std::int64_t>(e, "cell_cols");
      map.cells = numbers_at(e, "cells");
      map.row_block = value_of<std::int64_t>(e, "row_block");
      map.col_block = value_of<std::int64_t>(e, "col_block");
      map.position_rows = value_of<bool>(e, "position_rows");
      m.maps.push_back(std::move(map));
    }
    out.push_back(std::move(m));
  }
  return out;
}

TensorComparison tensor_of(const json& t) {
  TensorComparison c;
  c.name = value_of<std::string>(t, "name");
  c.shape = value_of<Shape>(t, "shape");
  c.tolerance = tolerance_of(at(t, "tolerance"));
  c.allclose = value_of<bool>(t, "allclose");
  c.max_abs = number_at(t, "max_abs");
  c.max_rel = number_at(t, "max_rel");
  c.numel = value_of<std::int64_t>(t, "numel");
  c.mismatched = value_of<std::int64_t>(t, "mismatched");
  c.problem = text_or_empty(t, "problem");
  const json& b = at(t, "baseline");
  if (!b.is_null()) {
    BaselineCheck base;
    base.side = value_of<std::string>(b, "side");
    base.err = number_at(b, "error");
    base.baseline_err = number_at(b, "baseline_error");
    base.ratio = number_at(b, "ratio");
    base.k = number_at(b, "k");
    base.floor = number_at(b, "floor");
    base.bound = number_at(b, "bound");
    base.normwise = number_at(b, "normwise");
    base.baseline_normwise = number_at(b, "baseline_normwise");
    base.position_axis = text_or_empty(b, "position_axis");
    base.err_by_position = numbers_at(b, "error_by_position");
    base.baseline_by_position = numbers_at(b, "baseline_error_by_position");
    for (const auto& head : at(b, "error_by_head_position")) {
      std::vector<double> profile;
      for (const auto& x : head) profile.push_back(number_of(x));
      base.err_by_head_position.push_back(std::move(profile));
    }
    c.baseline = std::move(base);
  }
  const json& w = at(t, "worst");
  if (!w.is_null())
    c.worst = ElementRef{value_of<Shape>(w, "index"), value_of<std::string>(w, "where"), number_at(w, "lhs"),
                         number_at(w, "rhs")};
  return c;
}

std::optional<RopeCase> rope_of(const json& j) {
  if (!j.contains("rope") || j.at("rope").is_null()) return std::nullopt;
  const json& r = j.at("rope");
  RopeCase rope;
  rope.theta = value_of<double>(r, "theta");
  rope.style = value_of<std::string>(r, "style") == "half" ? RopeStyle::half : RopeStyle::interleaved;
  rope.rotary_dim = value_of<std::int64_t>(r, "rotary_dim");
  rope.offset = value_of<std::int64_t>(r, "offset");
  rope.rows = value_of<std::vector<std::vector<std::int64_t>>>(r, "positions");
  rope.per_row = value_of<bool>(r, "per_row");
  rope.generator = value_of<std::string>(r, "generator");
  rope.start = value_of<std::int64_t>(r, "start");
  rope.q_offset = value_of<std::int64_t>(r, "q_offset");
  return rope;
}

// What the reports read of a case's spec (suite.hpp), from its JSON.
CaseSpec spec_of(const json& j) {
  CaseSpec c;
  c.name = value_of<std::string>(j, "name");
  c.base_name = value_of<std::string>(j, "base_name");
  for (const auto& [d, v] : at(j, "sweep").items()) c.sweep_point.emplace_back(d, v.get<std::int64_t>());
  const json& src = at(j, "source_at");
  c.source = {value_of<std::string>(src, "file"), value_of<int>(src, "line"), value_of<int>(src, "column")};
  c.compare = value_of<std::vector<std::string>>(j, "compare");
  c.reference_text = text_or_empty(j, "reference");
  c.reference = c.reference_text;
  c.level = named(j, "level", {Level::mha, Level::core, Level::rope}, level_name);
  for (const auto& [d, v] : at(j, "shape").items()) {
    std::int64_t* dim = c.dims.find(d);
    if (!dim) throw std::invalid_argument("'shape': unknown dim '" + d + "'");
    *dim = v.get<std::int64_t>();
  }
  try {
    c.dtype = dtype_from_name(value_of<std::string>(j, "dtype"));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("'dtype': ") + e.what());
  }
  c.causal = value_of<bool>(j, "causal");
  if (c.causal)
    c.causal_alignment = named(j, "causal_alignment", {CausalAlignment::top_left, CausalAlignment::bottom_right},
                               causal_alignment_name);
  if (!at(j, "scale").is_null()) c.scale = value_of<double>(j, "scale");
  c.mask_file = text_or_empty(j, "mask");
  c.rope = rope_of(j);
  c.taps = value_of<std::vector<std::string>>(j, "taps");
  c.layout = named(j, "input_layout", {InputLayout::contiguous, InputLayout::transposed, InputLayout::sliced},
                   layout_name);
  c.seed = value_of<std::uint64_t>(j, "seed");
  c.bias = j.contains("bias") && value_of<bool>(j, "bias");  // reports before biases have none
  if (j.contains("tolerance_rule"))
    c.tolerance_rule = value_of<std::string>(j, "tolerance_rule") == "relative_to_baseline"
                           ? ToleranceRule::relative_to_baseline
                           : ToleranceRule::allclose;
  c.tolerance = tolerance_of(at(j, "default_tolerance"));
  for (const auto& [name, t] : at(j, "tolerance").items()) c.tensor_tolerance[name] = tolerance_of(t);
  c.check = value_of<std::vector<std::string>>(j, "check");
  const json& expect = at(j, "expect");
  c.expect_fail = value_of<bool>(expect, "fail");
  c.expect_diagnosis = text_or_empty(expect, "diagnosis");
  c.timeout_s = value_of<double>(j, "timeout");
  return c;
}

}  // namespace

CaseResult case_result_from_json(const json& j, const CaseSpec* spec) {
  CaseResult r;
  r.spec = spec ? *spec : spec_of(j);
  r.spec.files.reset();
  r.status = case_status_at(j, "status");
  r.cause = text_or_empty(j, "cause");
  r.lhs_label = value_of<std::string>(j, "lhs");
  r.rhs_label = value_of<std::string>(j, "rhs");
  for (const auto& s : at(j, "sides")) {
    SideResult side;
    side.plugin = value_of<std::string>(s, "plugin");
    side.status = named(s, "status",
                        {SideStatus::ok, SideStatus::not_loaded, SideStatus::threw, SideStatus::crashed,
                         SideStatus::timed_out, SideStatus::bad_output, SideStatus::non_finite},
                        side_status_name);
    side.cause = text_or_empty(s, "cause");
    side.seconds = value_of<double>(s, "seconds");
    side.compute_seconds = value_of<double>(s, "compute_seconds");
    r.sides.push_back(std::move(side));
  }
  for (const auto& t : at(j, "tensors")) r.tensors.push_back(tensor_of(t));
  r.error_maps = error_maps_of(at(j, "error_maps"));
  r.seconds = value_of<double>(j, "seconds");
  r.mutant = text_or_empty(j, "mutant");
  if (j.contains("golden")) r.golden_label = text_or_empty(j, "golden");
  if (j.contains("baseline")) r.baseline_label = text_or_empty(j, "baseline");
  if (!at(j, "diagnosis").is_null()) r.diagnosis = diagnosis_of(j.at("diagnosis"));
  if (!at(j, "localization").is_null()) r.localization = localization_of(j.at("localization"));
  return r;
}

namespace {

struct ShardReport {
  std::filesystem::path file;
  json report;
  ShardSpec shard;
  SuiteIdentity identity;
  std::vector<std::size_t> indices;
};

ShardReport read_shard_report(const std::filesystem::path& file) {
  auto refuse = [&](const std::string& why) { return MergeError(file.string() + ": " + why); };
  std::ifstream in(file, std::ios::binary);
  if (!in) throw refuse("cannot be read");
  ShardReport s;
  s.file = file;
  try {
    s.report = json::parse(in);
  } catch (const json::exception& e) {
    throw refuse(std::string("is not a JSON report of headgrad run (") + e.what() + ")");
  }
  if (!s.report.is_object() || !s.report.contains("headgrad_version") || !s.report.contains("cases"))
    throw refuse("is not a JSON report of headgrad run (no 'headgrad_version' or 'cases')");
  if (!s.report.contains("shard") || !s.report.contains("suite_identity"))
    throw refuse("is a report without 'shard' and 'suite_identity' (written by an older headgrad): run it again");
  try {
    const json& sh = s.report.at("shard");
    s.shard = {value_of<std::size_t>(sh, "index"), value_of<std::size_t>(sh, "count")};
    s.indices = value_of<std::vector<std::size_t>>(sh, "cases");
    const json& id = s.report.at("suite_identity");
    s.identity = {value_of<std::string>(id, "file_hash"), value_of<std::string>(id, "cases_hash"),
                  value_of<std::size_t>(id, "selected")};
  } catch (const std::invalid_argument& e) {
    throw refuse(std::string("bad shard fields: ") + e.what());
  }
  if (s.shard.count == 0 || s.shard.index == 0 || s.shard.index > s.shard.count)
    throw refuse("holds shard " + s.shard.str() + ", which is no shard K/N with 1 <= K <= N");
  if (s.indices.size() != s.report.at("cases").size())
    throw refuse("lists " + std::to_string(s.indices.size()) + " case indices for " +
                 std::to_string(s.report.at("cases").size()) + " cases");
  return s;
}

}  // namespace

SuiteResult merge_shard_reports(const std::vector<std::filesystem::path>& files) {
  if (files.empty()) throw MergeError("no report to merge");
  std::vector<ShardReport> shards;
  for (const auto& f : files) shards.push_back(read_shard_report(f));
  const ShardReport& first = shards.front();
  const std::string suite = first.report.value("suite", "");
  const std::string suite_file = first.report.value("file", "");
  std::map<std::size_t, const ShardReport*> by_index;  // shard K -> its report
  for (const ShardReport& s : shards) {
    const std::string name = s.report.value("suite", ""), file = s.report.value("file", "");
    if (s.identity != first.identity || name != suite || s.shard.count != first.shard.count)
      throw MergeError(s.file.string() + ": is shard " + s.shard.str() + " of suite '" + name + "' (" + file +
                       ", hash " + s.identity.file_hash + "/" + s.identity.cases_hash + ", " +
                       std::to_string(s.identity.selected) + " cases), not of the suite of " + first.file.string() +
                       ": '" + suite + "' (" + suite_file + ", hash " + first.identity.file_hash + "/" +
                       first.identity.cases_hash + ", " + std::to_string(first.identity.selected) + " cases), shard " +
                       first.shard.str());
    const auto [it, inserted] = by_index.emplace(s.shard.index, &s);
    if (!inserted)
      throw MergeError(s.file.string() + ": is shard " + s.shard.str() + " again (so is " + it->second->file.string() +
                       ")");
  }
  std::vector<std::string> missing;
  for (std::size_t k = 1; k <= first.shard.count; ++k)
    if (!by_index.count(k)) missing.push_back(std::to_string(k) + "/" + std::to_string(first.shard.count));
  if (!missing.empty())
    throw MergeError("shard" + std::string(missing.size() > 1 ? "s " : " ") + join(missing) + " of suite '" + suite +
                     "' missing (given: " + std::to_string(shards.size()) + " of " +
                     std::to_string(first.shard.count) + ")");

  // Cases by their index in the suite: that is suite order.
  std::map<std::size_t, std::pair<const json*, const ShardReport*>> cases;
  SuiteResult result;
  for (const ShardReport& s : shards) {
    const json& list = s.report.at("cases");
    for (std::size_t i = 0; i < s.indices.size(); ++i)
      if (!cases.emplace(s.indices[i], std::make_pair(&list[i], &s)).second)
        throw MergeError(s.file.string() + ": holds case " + std::to_string(s.indices[i]) +
                         " of the suite, which another shard holds too");
    result.seconds += s.report.contains("summary") ? s.report["summary"].value("seconds", 0.0) : 0.0;
  }
  if (cases.size() != first.identity.selected)
    throw MergeError("the shards hold " + std::to_string(cases.size()) + " cases, but suite '" + suite + "' selects " +
                     std::to_string(first.identity.selected));
  result.name = suite;
  result.file = suite_file;
  result.identity = first.identity;
  for (const auto& [index, where] : cases) {
    try {
      result.cases.push_back(case_result_from_json(*where.first));
    } catch (const std::invalid_argument& e) {
      throw MergeError(where.second->file.string() + ": case " + std::to_string(index) + ": " + e.what());
    }
    result.case_indices.push_back(index);
  }
  try {
    for (const auto& w : first.report.at("warnings"))
      result.warnings.push_back({value_of<std::string>(w, "condition"), value_of<std::vector<std::string>>(w, "bugs"),
                                 value_of<std::string>(w, "message")});
  } catch (const std::exception& e) {
    throw MergeError(first.file.string() + ": bad 'warnings': " + e.what());
  }
  return result;
}

}  // namespace headgrad::runner
