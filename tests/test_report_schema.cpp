// The JSON report's schema (tools/report/report_json.cpp) in process: a
// result with every field set to a distinct, non-default value is written,
// read back and compared field by field; NaN and Inf survive the exact (CBOR)
// form; every value of a report replaced by a wrong type, or every key
// removed, is refused naming the source and that value's JSON path, never
// with a bare nlohmann exception; several report files are written all or
// none. The field counts below fail to compile
// when a struct gains a field: write and read it in the schema, then here.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <algorithm>
#include <functional>
#include <limits>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "report/report.hpp"

namespace test_report_schema {  // this file's names: test files share unity builds (tests/meson.build)

// How many fields an aggregate has (it is brace-initialized from that many
// values, not one more). Outside the anonymous namespace: its conversions are
// declared, never defined (only unevaluated operands use them), which clang
// flags for a type of internal linkage.
struct AnyField {
  template <class T>
  operator T&() const;
  template <class T>
  operator T&&() const;
};

namespace {

using namespace headgrad::runner;
using headgrad::DType;
using headgrad::RopeStyle;
using headgrad::CausalAlignment;
using nlohmann::json;

template <class T, class... A>
constexpr std::size_t field_count() {
  if constexpr (requires { T{A{}..., AnyField{}}; }) return field_count<T, A..., AnyField>();
  else return sizeof...(A);
}

// Every field of these is in the report, except those named: a new field
// stops the build here until the schema writes and reads it.
static_assert(field_count<Tolerance>() == 2);
static_assert(field_count<ElementRef>() == 4);
static_assert(field_count<BaselineCheck>() == 13);
static_assert(field_count<TensorComparison>() == 11);
static_assert(field_count<HypothesisFit>() == 6);
static_assert(field_count<Diagnosis>() == 9);
static_assert(field_count<Finding>() == 7);
static_assert(field_count<LocalizationRow>() == 5);
static_assert(field_count<ErrorSpread>() == 5);
static_assert(field_count<Localization>() == 6);
static_assert(field_count<ErrorMap>() == 11);
static_assert(field_count<TensorErrorMaps>() == 8);
static_assert(field_count<SideResult>() == 8);        // not: tensors (dropped before any report)
static_assert(field_count<RopeCase>() == 12);         // not: positions_at, rotary_dim_at, q_offset_at (suite locations)
static_assert(field_count<WeakSuiteWarning>() == 3);
static_assert(field_count<SourceLoc>() == 3);
static_assert(field_count<Dims>() == 8);
// not: key_source, expect_diagnosis_at, baseline_k_at (suite locations), reference
// (reference_text, resolved), baseline_k (each tensor's k is in its baseline),
// check_strict, dtype_on_case (parsing rules), files (the inputs)
static_assert(field_count<CaseSpec>() == 38);
static_assert(field_count<headgrad::QkNormSpec>() == 4);
static_assert(field_count<CaseResult>() == 16);       // not: lhs, rhs (tensors)
static_assert(field_count<ShardSpec>() == 2);
static_assert(field_count<SuiteIdentity>() == 5);
static_assert(field_count<SuiteResult>() == 8);

ErrorMap map_of(std::int64_t rows, std::int64_t cols, double base) {
  ErrorMap m;
  m.title = "b=" + std::to_string(rows);
  m.rows = rows;
  m.cols = cols;
  m.row_step = (rows + kMaxMapRows - 1) / kMaxMapRows;
  m.col_step = (cols + kMaxMapCols - 1) / kMaxMapCols;
  m.cell_rows = (rows + m.row_step - 1) / m.row_step;
  m.cell_cols = (cols + m.col_step - 1) / m.col_step;
  for (std::int64_t i = 0; i < m.cell_rows * m.cell_cols; ++i) m.cells.push_back(base + 0.001 * i);
  m.row_block = 2;
  m.col_block = 3;
  m.position_rows = true;
  return m;
}

HypothesisFit fit_of(const std::string& bug, double r) { return {bug, "explains " + bug, "fix " + bug, "side-" + bug, r, r / 3}; }

CaseResult full_case(int n) {
  const std::string s = std::to_string(n);
  CaseResult r;
  CaseSpec& c = r.spec;
  c.name = "case" + s + "[B=2,T=5]";
  c.base_name = "case" + s;
  c.sweep_point = {{"B", 2}, {"T", 5}};  // a JSON object: read back in name order
  c.source = {"suite" + s + ".yaml", 7 + n, 3 + n};
  c.compare = {"plugin_a" + s};
  c.reference_text = "refs/r" + s;
  c.reference = c.reference_text;
  c.level = Level::mha;
  c.dims = {.B = 2, .T = 5, .D = 12, .H = 3, .Tq = 0, .Tk = 0, .d = 4, .Hkv = 1};
  c.dtype = DType::float32;
  c.causal = true;
  c.causal_alignment = CausalAlignment::bottom_right;
  c.scale = 0.25 + n;
  c.mask_file = "masks/m" + s + ".npy";
  RopeCase rope;
  rope.theta = 500000 + n;
  rope.style = RopeStyle::half;
  rope.rotary_dim = 2;
  rope.offset = 3;
  rope.rows = {{1, 2, 3, 4, 5}, {6, 7, 8, 9, 10}};
  rope.per_row = true;
  rope.generator = "gapped";
  rope.start = 77;
  rope.q_offset = 4;
  c.rope = rope;
  c.taps = {"q_rot", "k_rot"};
  c.layout = InputLayout::sliced;
  c.bias = true;
  c.qk_norm = {.enabled = true, .axis = headgrad::QkNormAxis::model, .eps = 1e-5 * (n + 1), .gain = headgrad::QkNormGain::one_plus_w};
  c.cross = true;
  c.window.left = 3 + n;  // the right bound unbounded: written as null
  c.softcap = 0.75 + n;
  c.sinks = true;
  c.seed = (std::uint64_t{1} << 63) + 5 + n;
  c.tolerance = {1e-3, 2e-3};
  c.tensor_tolerance = {{"dx", {3e-3, 4e-3}}};
  c.tolerance_rule = ToleranceRule::relative_to_baseline;
  c.check = {"out", "dx", "dbq", "dbo", "dsinks", "q_rot", "k_rot"};
  c.expect_fail = true;
  c.expect_diagnosis = "scale_one_over_d";
  c.timeout_s = 12.5;

  r.status = CaseStatus::xfail;
  r.cause = "cause " + s;
  r.lhs_label = "plugin_a" + s;
  r.rhs_label = "refs/r" + s;
  r.sides = {{"plugin_a" + s, SideStatus::timed_out, "hung " + s, {}, 1.5, 0.75, 3u << 30, (1ull << 40) + 7}};
  TensorComparison t;
  t.name = "out";
  t.shape = {2, 5, 12};
  t.tolerance = {5e-5, 6e-5};
  t.max_abs = 0.125;
  t.max_rel = 0.5;
  t.numel = 120;
  t.mismatched = 7;
  t.allclose = false;
  t.worst = ElementRef{{1, 4, 11}, "b=1, t=4, head=2, ch=3", 0.75, -0.25};
  t.problem = "";
  BaselineCheck b;
  b.k = 2;
  b.floor = 1e-8;
  b.baseline_err = 2e-7;
  b.bound = 4.1e-7;
  b.side = "plugin_a" + s;
  b.err = 3e-3;
  b.ratio = 15000;
  b.normwise = 1e-3;
  b.baseline_normwise = 1e-7;
  b.position_axis = "t";
  b.err_by_position = {1e-3, 2e-3, 3e-3, 4e-3, 5e-3};
  b.baseline_by_position = {1e-7, 2e-7, 3e-7, 4e-7, 5e-7};
  b.err_by_head_position = {{1, 2, 3, 4, 5}, {6, 7, 8, 9, 10}, {11, 12, 13, 14, 15}};
  t.baseline = b;
  TensorComparison missing;
  missing.name = "dx";
  missing.shape = {2, 5, 12};
  missing.tolerance = {1e-2, 1e-1};
  missing.max_abs = 9;
  missing.max_rel = 8;
  missing.numel = 120;
  missing.mismatched = 120;
  missing.allclose = false;
  missing.problem = "dx missing on plugin_a" + s;
  r.tensors = {t, missing};
  TensorErrorMaps maps;
  maps.tensor = "out";
  maps.shape = {2, 5, 12};
  maps.allclose = false;
  maps.vmax = 0.125;
  maps.non_finite = true;
  maps.axes = "rows: positions t; columns: heads \xc3\x97 channels (d = 4)";
  maps.batches = 7;
  maps.maps = {map_of(5, 12, 0.5), map_of(100, 150, 0.25)};
  r.error_maps = {maps};
  r.seconds = 3.25 + n;
  r.mutant = "mutant_scale_one_over_d";
  r.golden_label = "per_head in float64";
  r.baseline_label = "per_head in float32";
  Localization loc;
  loc.rows = {{"B = 1", "MHA(B=1,T=5,D=12,H=3)", CaseStatus::pass, 1e-16, ""},
              {"T = 1", "MHA(B=2,T=1,D=12,H=3)", CaseStatus::error, 0.5, "plugin crashed"}};
  loc.depends_on = {"B"};
  loc.independent_of = {"T", "H"};
  loc.sentence = "depends on B";
  loc.where = "every head";
  loc.spread = {{"out", {0.1, 0.2, 0.3}, {0.4, 0.5}, {0.6, 0.7}, 1e-5}};
  r.localization = loc;
  Diagnosis d;
  d.fits = {fit_of("scale_one_over_d", 0.5), fit_of("causal_off_by_one", 0.75)};
  d.judged_side = "plugin_a" + s;
  d.correct_side = "refs/r" + s;
  d.sentence = "plugin_a scales by 1/d";
  d.ruled_out = {"mask_ignored: passes at T = 1"};
  d.near = {fit_of("kv_map_tile", 4)};
  d.evidence = {"re-run in tile order matches"};
  d.reference_side = "refs/r" + s;
  d.findings = {{"relation", "grad_factor", "plugin_a" + s, {"dwk", "dx"}, "2 = sqrt(d)", {"B = 1", "T = 1"},
                 "dwk is 2 = sqrt(d) times the expected"}};
  r.diagnosis = d;
  return r;
}

SuiteResult full_result() {
  SuiteResult s;
  s.name = "suite \xce\xb1";
  s.file = "configs/s.yaml";
  s.cases = {full_case(1), full_case(2)};
  s.cases[1].spec.level = Level::core;  // a core case: its dims and no d default
  s.cases[1].spec.dims = {.B = 3, .T = 0, .D = 0, .H = 4, .Tq = 6, .Tk = 7, .d = 8, .Hkv = 2};
  s.cases[1].spec.rope.reset();
  s.cases[1].spec.causal = false;  // causal_alignment then null: the default comes back
  s.cases[1].spec.causal_alignment = CausalAlignment::top_left;
  s.cases[1].spec.scale.reset();
  s.cases[1].diagnosis.reset();
  s.cases[1].localization.reset();
  s.cases[1].tensors[0].baseline.reset();
  s.cases[1].tensors[0].worst.reset();
  s.cases[1].spec.tolerance_rule = ToleranceRule::allclose;
  s.seconds = 42.5;
  s.warnings = {{"every case has H = 1", {"merge_without_transpose", "heads_swapped"}, "weak suite: H = 1"}};
  s.shard = {2, 3};
  s.case_indices = {1, 4};
  s.identity.file_hash = "0123456789abcdef";
  s.identity.cases_hash = "fedcba9876543210";
  s.identity.selected = 6;
  s.identity.expanded = 9;
  s.identity.case_hashes = {"h0", "h1", "h2", "h3", "h4", "h5"};
  return s;
}

void expect_same_spec(const CaseSpec& a, const CaseSpec& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.base_name, b.base_name);
  EXPECT_EQ(a.sweep_point, b.sweep_point);
  EXPECT_EQ(a.source.file, b.source.file);
  EXPECT_EQ(a.source.line, b.source.line);
  EXPECT_EQ(a.source.column, b.source.column);
  EXPECT_EQ(a.compare, b.compare);
  EXPECT_EQ(a.reference, b.reference);
  EXPECT_EQ(a.reference_text, b.reference_text);
  EXPECT_EQ(a.level, b.level);
  for (const char* d : {"B", "T", "D", "H", "Tq", "Tk", "d", "Hkv"}) EXPECT_EQ(a.dims.get(d), b.dims.get(d)) << d;
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.causal, b.causal);
  EXPECT_EQ(a.causal_alignment, b.causal_alignment);
  EXPECT_EQ(a.scale, b.scale);
  EXPECT_EQ(a.mask_file, b.mask_file);
  ASSERT_EQ(a.rope.has_value(), b.rope.has_value());
  if (a.rope) {
    EXPECT_EQ(a.rope->theta, b.rope->theta);
    EXPECT_EQ(a.rope->style, b.rope->style);
    EXPECT_EQ(a.rope->rotary_dim, b.rope->rotary_dim);
    EXPECT_EQ(a.rope->offset, b.rope->offset);
    EXPECT_EQ(a.rope->rows, b.rope->rows);
    EXPECT_EQ(a.rope->per_row, b.rope->per_row);
    EXPECT_EQ(a.rope->generator, b.rope->generator);
    EXPECT_EQ(a.rope->start, b.rope->start);
    EXPECT_EQ(a.rope->q_offset, b.rope->q_offset);
  }
  EXPECT_EQ(a.taps, b.taps);
  EXPECT_EQ(a.layout, b.layout);
  EXPECT_EQ(a.bias, b.bias);
  EXPECT_EQ(a.qk_norm.enabled, b.qk_norm.enabled);
  EXPECT_EQ(a.qk_norm.axis, b.qk_norm.axis);
  EXPECT_EQ(a.qk_norm.eps, b.qk_norm.eps);
  EXPECT_EQ(a.qk_norm.gain, b.qk_norm.gain);
  EXPECT_EQ(a.cross, b.cross);
  EXPECT_EQ(a.window.left, b.window.left);
  EXPECT_EQ(a.window.right, b.window.right);
  EXPECT_EQ(a.softcap, b.softcap);
  EXPECT_EQ(a.sinks, b.sinks);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.tolerance.atol, b.tolerance.atol);
  EXPECT_EQ(a.tolerance.rtol, b.tolerance.rtol);
  for (const auto& name : a.check) {  // the report holds each checked tensor's tolerance
    EXPECT_EQ(a.tolerance_for(name).atol, b.tolerance_for(name).atol) << name;
    EXPECT_EQ(a.tolerance_for(name).rtol, b.tolerance_for(name).rtol) << name;
  }
  EXPECT_EQ(a.relative_rule(), b.relative_rule());
  EXPECT_EQ(a.check, b.check);
  EXPECT_EQ(a.expect_fail, b.expect_fail);
  EXPECT_EQ(a.expect_diagnosis, b.expect_diagnosis);
  EXPECT_EQ(a.timeout_s, b.timeout_s);
  EXPECT_EQ(describe_case(a), describe_case(b));
  EXPECT_EQ(case_hash(a), case_hash(b));  // what merge checks each case by
}

void expect_same_fit(const HypothesisFit& a, const HypothesisFit& b) {
  EXPECT_EQ(a.bug, b.bug);
  EXPECT_EQ(a.explanation, b.explanation);
  EXPECT_EQ(a.fix, b.fix);
  EXPECT_EQ(a.side, b.side);
  EXPECT_EQ(a.worst_ratio, b.worst_ratio);
  EXPECT_EQ(a.max_abs, b.max_abs);
}

void expect_same_case(const CaseResult& a, const CaseResult& b) {
  expect_same_spec(a.spec, b.spec);
  EXPECT_EQ(a.status, b.status);
  EXPECT_EQ(a.cause, b.cause);
  EXPECT_EQ(a.lhs_label, b.lhs_label);
  EXPECT_EQ(a.rhs_label, b.rhs_label);
  ASSERT_EQ(a.sides.size(), b.sides.size());
  for (std::size_t i = 0; i < a.sides.size(); ++i) {
    EXPECT_EQ(a.sides[i].plugin, b.sides[i].plugin);
    EXPECT_EQ(a.sides[i].status, b.sides[i].status);
    EXPECT_EQ(a.sides[i].cause, b.sides[i].cause);
    EXPECT_EQ(a.sides[i].seconds, b.sides[i].seconds);
    EXPECT_EQ(a.sides[i].compute_seconds, b.sides[i].compute_seconds);
    EXPECT_EQ(a.sides[i].peak_rss_bytes, b.sides[i].peak_rss_bytes);
    EXPECT_EQ(a.sides[i].peak_tensor_bytes, b.sides[i].peak_tensor_bytes);
  }
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const TensorComparison &x = a.tensors[i], &y = b.tensors[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.shape, y.shape);
    EXPECT_EQ(x.tolerance.atol, y.tolerance.atol);
    EXPECT_EQ(x.tolerance.rtol, y.tolerance.rtol);
    EXPECT_EQ(x.max_abs, y.max_abs);
    EXPECT_EQ(x.max_rel, y.max_rel);
    EXPECT_EQ(x.numel, y.numel);
    EXPECT_EQ(x.mismatched, y.mismatched);
    EXPECT_EQ(x.allclose, y.allclose);
    EXPECT_EQ(x.problem, y.problem);
    ASSERT_EQ(x.worst.has_value(), y.worst.has_value());
    if (x.worst) {
      EXPECT_EQ(x.worst->index, y.worst->index);
      EXPECT_EQ(x.worst->where, y.worst->where);
      EXPECT_EQ(x.worst->lhs, y.worst->lhs);
      EXPECT_EQ(x.worst->rhs, y.worst->rhs);
    }
    ASSERT_EQ(x.baseline.has_value(), y.baseline.has_value());
    if (x.baseline) {
      const BaselineCheck &p = *x.baseline, &q = *y.baseline;
      EXPECT_EQ(p.k, q.k);
      EXPECT_EQ(p.floor, q.floor);
      EXPECT_EQ(p.baseline_err, q.baseline_err);
      EXPECT_EQ(p.bound, q.bound);
      EXPECT_EQ(p.side, q.side);
      EXPECT_EQ(p.err, q.err);
      EXPECT_EQ(p.ratio, q.ratio);
      EXPECT_EQ(p.normwise, q.normwise);
      EXPECT_EQ(p.baseline_normwise, q.baseline_normwise);
      EXPECT_EQ(p.position_axis, q.position_axis);
      EXPECT_EQ(p.err_by_position, q.err_by_position);
      EXPECT_EQ(p.baseline_by_position, q.baseline_by_position);
      EXPECT_EQ(p.err_by_head_position, q.err_by_head_position);
    }
  }
  ASSERT_EQ(a.error_maps.size(), b.error_maps.size());
  for (std::size_t i = 0; i < a.error_maps.size(); ++i) {
    const TensorErrorMaps &x = a.error_maps[i], &y = b.error_maps[i];
    EXPECT_EQ(x.tensor, y.tensor);
    EXPECT_EQ(x.shape, y.shape);
    EXPECT_EQ(x.allclose, y.allclose);
    EXPECT_EQ(x.vmax, y.vmax);
    EXPECT_EQ(x.non_finite, y.non_finite);
    EXPECT_EQ(x.axes, y.axes);
    EXPECT_EQ(x.batches, y.batches);
    ASSERT_EQ(x.maps.size(), y.maps.size());
    for (std::size_t m = 0; m < x.maps.size(); ++m) {
      const ErrorMap &p = x.maps[m], &q = y.maps[m];
      EXPECT_EQ(p.title, q.title);
      EXPECT_EQ(p.rows, q.rows);
      EXPECT_EQ(p.cols, q.cols);
      EXPECT_EQ(p.row_step, q.row_step);
      EXPECT_EQ(p.col_step, q.col_step);
      EXPECT_EQ(p.cell_rows, q.cell_rows);
      EXPECT_EQ(p.cell_cols, q.cell_cols);
      EXPECT_EQ(p.cells, q.cells);
      EXPECT_EQ(p.row_block, q.row_block);
      EXPECT_EQ(p.col_block, q.col_block);
      EXPECT_EQ(p.position_rows, q.position_rows);
    }
  }
  EXPECT_EQ(a.seconds, b.seconds);
  EXPECT_EQ(a.mutant, b.mutant);
  EXPECT_EQ(a.golden_label, b.golden_label);
  EXPECT_EQ(a.baseline_label, b.baseline_label);
  ASSERT_EQ(a.localization.has_value(), b.localization.has_value());
  if (a.localization) {
    const Localization &x = *a.localization, &y = *b.localization;
    ASSERT_EQ(x.rows.size(), y.rows.size());
    for (std::size_t i = 0; i < x.rows.size(); ++i) {
      EXPECT_EQ(x.rows[i].change, y.rows[i].change);
      EXPECT_EQ(x.rows[i].shape, y.rows[i].shape);
      EXPECT_EQ(x.rows[i].status, y.rows[i].status);
      EXPECT_EQ(x.rows[i].max_abs, y.rows[i].max_abs);
      EXPECT_EQ(x.rows[i].cause, y.rows[i].cause);
    }
    EXPECT_EQ(x.depends_on, y.depends_on);
    EXPECT_EQ(x.independent_of, y.independent_of);
    EXPECT_EQ(x.sentence, y.sentence);
    EXPECT_EQ(x.where, y.where);
    ASSERT_EQ(x.spread.size(), y.spread.size());
    for (std::size_t i = 0; i < x.spread.size(); ++i) {
      EXPECT_EQ(x.spread[i].tensor, y.spread[i].tensor);
      EXPECT_EQ(x.spread[i].per_head, y.spread[i].per_head);
      EXPECT_EQ(x.spread[i].per_position, y.spread[i].per_position);
      EXPECT_EQ(x.spread[i].per_batch, y.spread[i].per_batch);
      EXPECT_EQ(x.spread[i].tolerance, y.spread[i].tolerance);
    }
  }
  ASSERT_EQ(a.diagnosis.has_value(), b.diagnosis.has_value());
  if (a.diagnosis) {
    const Diagnosis &x = *a.diagnosis, &y = *b.diagnosis;
    ASSERT_EQ(x.fits.size(), y.fits.size());
    for (std::size_t i = 0; i < x.fits.size(); ++i) expect_same_fit(x.fits[i], y.fits[i]);
    ASSERT_EQ(x.near.size(), y.near.size());
    for (std::size_t i = 0; i < x.near.size(); ++i) expect_same_fit(x.near[i], y.near[i]);
    EXPECT_EQ(x.judged_side, y.judged_side);
    EXPECT_EQ(x.correct_side, y.correct_side);
    EXPECT_EQ(x.sentence, y.sentence);
    EXPECT_EQ(x.ruled_out, y.ruled_out);
    EXPECT_EQ(x.evidence, y.evidence);
    EXPECT_EQ(x.reference_side, y.reference_side);
    ASSERT_EQ(x.findings.size(), y.findings.size());
    for (std::size_t i = 0; i < x.findings.size(); ++i) {
      const Finding &f = x.findings[i], &g = y.findings[i];
      EXPECT_EQ(f.kind, g.kind);
      EXPECT_EQ(f.relation, g.relation);
      EXPECT_EQ(f.side, g.side);
      EXPECT_EQ(f.tensors, g.tensors);
      EXPECT_EQ(f.figure, g.figure);
      EXPECT_EQ(f.confirmed_at, g.confirmed_at);
      EXPECT_EQ(f.sentence, g.sentence);
    }
  }
}

TEST(ReportSchema, EveryFieldSurvivesTheRoundTripThroughJsonText) {
  const SuiteResult s = full_result();
  const json written = json_report(s);
  const SuiteResult back = suite_result_from_json(json::parse(written.dump()), "r.json");
  EXPECT_EQ(back.name, s.name);
  EXPECT_EQ(back.file, s.file);
  EXPECT_EQ(back.seconds, s.seconds);
  ASSERT_EQ(back.warnings.size(), 1u);
  EXPECT_EQ(back.warnings[0].condition, s.warnings[0].condition);
  EXPECT_EQ(back.warnings[0].bugs, s.warnings[0].bugs);
  EXPECT_EQ(back.warnings[0].message, s.warnings[0].message);
  EXPECT_EQ(back.shard, s.shard);
  EXPECT_EQ(back.case_indices, s.case_indices);
  EXPECT_EQ(back.identity, s.identity);
  ASSERT_EQ(back.cases.size(), s.cases.size());
  for (std::size_t i = 0; i < s.cases.size(); ++i) expect_same_case(s.cases[i], back.cases[i]);
  // and writing what was read gives the same text
  EXPECT_EQ(json_report(back).dump(), written.dump());
}

TEST(ReportSchema, TheExactFormKeepsNanAndInfWhileJsonTextHasNull) {
  CaseResult r = full_case(3);
  const double inf = std::numeric_limits<double>::infinity();
  r.tensors[0].max_abs = std::nan("");
  r.tensors[0].max_rel = inf;
  r.error_maps[0].maps[0].cells[5] = -inf;
  const auto cbor = json::to_cbor(case_report_json(r, /*exact=*/true));
  const CaseResult exact = case_result_from_json(json::from_cbor(cbor));
  EXPECT_TRUE(std::isnan(exact.tensors[0].max_abs));
  EXPECT_EQ(exact.tensors[0].max_rel, inf);
  EXPECT_EQ(exact.error_maps[0].maps[0].cells[5], -inf);
  const json text = json::parse(case_report_json(r).dump());
  EXPECT_TRUE(text["tensors"][0]["max_rel"].is_null());
  const CaseResult read = case_result_from_json(text);
  EXPECT_TRUE(std::isnan(read.tensors[0].max_rel));  // null reads NaN
  EXPECT_TRUE(std::isnan(read.error_maps[0].maps[0].cells[5]));
}

TEST(ReportSchema, AGivenSpecIsTheResultsButTheJsonsIsStillChecked) {
  const CaseResult r = full_case(4);
  CaseSpec mine = r.spec;
  mine.name = "the worker's case";
  EXPECT_EQ(case_result_from_json(case_report_json(r), &mine).spec.name, "the worker's case");
  json bad = case_report_json(r);
  bad["dtype"] = "float128";
  try {
    case_result_from_json(bad, &mine, "the result of case 'x'");
    FAIL() << "accepted dtype float128";
  } catch (const ReportError& e) {
    EXPECT_STREQ(e.what(),
                 "the result of case 'x': $.dtype: expected one of float64, float32, bfloat16, float16, got 'float128'");
  }
}

// Every primitive value of a report, with its JSON path ("$.cases[0].tensors[1].max_abs").
void leaves(const json& j, const json::json_pointer& ptr, const std::string& path,
            std::vector<std::pair<json::json_pointer, std::string>>& out) {
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) leaves(v, ptr / k, path + "." + k, out);
  } else if (j.is_array()) {
    for (std::size_t i = 0; i < j.size(); ++i) leaves(j[i], ptr / i, path + "[" + std::to_string(i) + "]", out);
  } else {
    out.emplace_back(ptr, path);
  }
}

// What reading `j` does: "" when accepted, else the ReportError's message;
// any other exception fails the test.
std::string refusal(const json& j) {
  try {
    suite_result_from_json(j, "r.json");
    return "";
  } catch (const ReportError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a ReportError: " << e.what();
    return "?";
  }
}

TEST(ReportSchema, AWrongTypeAnywhereIsRefusedAtItsPath) {
  SuiteResult small = full_result();  // the 1700 cells of the large map: one of them stands for all
  for (auto& c : small.cases) c.error_maps[0].maps.resize(1);
  const json report = json::parse(json_report(small).dump());
  ASSERT_EQ(refusal(report), "");
  std::vector<std::pair<json::json_pointer, std::string>> all;
  leaves(report, json::json_pointer(), "$", all);
  ASSERT_GT(all.size(), 300u);
  std::size_t tries = 0;
  for (const auto& [ptr, path] : all) {
    // An object where a primitive belongs is never right; the other kinds
    // are wrong wherever the value is not of that kind.
    for (const json& wrong : {json::object(), json("text"), json(true)}) {
      const json& now = report.at(ptr);
      if (wrong.type() == now.type() || (wrong.is_number() && now.is_number())) continue;
      json j = report;
      j.at(ptr) = wrong;
      const std::string why = refusal(j);
      ++tries;
      if (wrong.is_structured()) {
        EXPECT_NE(why, "") << path << " accepted " << wrong.dump();
      }
      if (why.empty()) continue;
      EXPECT_EQ(why.rfind("r.json: $", 0), 0u) << why;
      EXPECT_NE(why.find(path), std::string::npos) << path << " -> " << why;
      EXPECT_EQ(why.find("json.exception"), std::string::npos) << why;
    }
  }
  EXPECT_GT(tries, 900u);
}

TEST(ReportSchema, EveryKeyIsRequiredButTheFewOlderReportsLack) {
  const json report = json::parse(json_report(full_result()).dump());
  const std::vector<std::string> optional = {"explanation", "fix", "near", "evidence", "golden", "baseline",
                                             "findings", "reference_side"};
  std::function<void(const json&, const json::json_pointer&)> walk = [&](const json& j, const json::json_pointer& p) {
    if (j.is_array())
      for (std::size_t i = 0; i < j.size(); ++i) walk(j[i], p / i);
    if (!j.is_object()) return;
    for (const auto& [k, v] : j.items()) {
      walk(v, p / k);
      // the keys of these maps are data (dims, sweep point, tensors, statuses), not fields
      const std::string at = p.to_string();
      if (std::regex_match(at, std::regex("/cases/[0-9]+/(shape|sweep|tolerance)|/summary/counts"))) continue;
      json cut = report;
      cut.at(p).erase(k);
      const std::string why = refusal(cut);
      const bool case_level = std::regex_match(at, std::regex("/cases/[0-9]+"));
      const bool may_lack = std::find(optional.begin(), optional.end(), k) != optional.end() &&
                            (case_level || (k != "baseline" && k != "golden"));
      if (may_lack) EXPECT_EQ(why, "") << p.to_string() << "/" << k;
      else EXPECT_NE(why.find(": missing"), std::string::npos) << p.to_string() << "/" << k << " -> " << why;
    }
  };
  walk(report, json::json_pointer());
}

TEST(ReportSchema, AnErrorMapsGeometryMustFollowFromRowsAndCols) {
  const json report = json::parse(json_report(full_result()).dump());
  auto refused = [&](const std::function<void(json&)>& edit) {
    json j = report;
    edit(j["cases"][0]["error_maps"][0]["maps"][1]);
    return refusal(j);
  };
  EXPECT_EQ(refused([](json& m) { m["cells"].erase(m["cells"].size() - 1); }),
            "r.json: $.cases[0].error_maps[0].maps[1].cells: expected 1700 numbers (cell_rows x cell_cols), got 1699");
  EXPECT_EQ(refused([](json& m) { m["cols"] = 1000000000000000ll; }),
            "r.json: $.cases[0].error_maps[0].maps[1].col_step: expected 13888888888889 (cols / 72, rounded up), got 3");
  EXPECT_EQ(refused([](json& m) { m["cell_rows"] = 49; }),
            "r.json: $.cases[0].error_maps[0].maps[1].cell_rows: expected a whole number from 1 to 48, got 49");
  EXPECT_EQ(refused([](json& m) { m["col_block"] = 151; }),
            "r.json: $.cases[0].error_maps[0].maps[1].col_block: expected a whole number from 0 to 150, got 151");
  json j = report;
  j["cases"][0]["error_maps"][0]["maps"] = json::array();
  EXPECT_EQ(refusal(j), "r.json: $.cases[0].error_maps[0].maps: expected 1 to 4 entries, got 0");
  j = report;
  j["suite_identity"]["selected"] = 7;
  EXPECT_EQ(refusal(j), "r.json: $.suite_identity.case_hashes: expected 7 hashes (one per selected case), got 6");
  j["suite_identity"]["selected"] = 1000000000000ull;  // more than a suite can expand to
  EXPECT_EQ(refusal(j), "r.json: $.suite_identity.selected: expected a whole number from 0 to 10000, got 1000000000000");
}

TEST(ReportFiles, AllAreWrittenOrNone) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("headgrad_all_or_none_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto slurp = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  std::ofstream(dir / "a.json") << "old";
  // the second cannot be staged (its folder is missing): the first is left as it was, no temporary remains
  EXPECT_THROW(write_reports_all_or_none({{dir / "a.json", "new a"}, {dir / "missing" / "b.html", "new b"}}),
               std::runtime_error);
  EXPECT_EQ(slurp(dir / "a.json"), "old");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
  write_reports_all_or_none({{dir / "a.json", "new a"}, {dir / "b.html", "new b"}});
  EXPECT_EQ(slurp(dir / "a.json"), "new a");
  EXPECT_EQ(slurp(dir / "b.html"), "new b");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 2);
  fs::remove_all(dir);
}

}  // namespace

}  // namespace test_report_schema
