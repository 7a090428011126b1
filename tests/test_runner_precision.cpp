// The relative_to_baseline tolerance (docs/design.md, "Tolerance"): below
// float64 every side is judged against the golden (the oracle in float64) by
// k times the oracle's own error in the case's dtype, plus the golden's
// rounding noise. Parsing and its errors, the floor and the verdict against
// hand-worked numbers, a correct float32 GQA + RoPE comparison that passes
// where PyTorch's float32 assert_close defaults fail, and every catalog mutant
// in float32 still failing.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include <headgrad/npy.hpp>

#include "analysis/analyze.hpp"
#include "analysis/catalog.hpp"
#include "judge/golden.hpp"
#include "report/report.hpp"
#include "judge/run_case.hpp"
#include "runner_plugins.hpp"

namespace test_runner_precision {  // this file's names: test files share unity builds (tests/meson.build)

namespace fs = std::filesystem;

namespace {

using namespace headgrad;
using namespace headgrad::runner;

CaseSpec parse_one(const std::string& yaml) { return parse_suite(yaml, "p.yaml").cases.at(0); }

std::string parse_error(const std::string& yaml) {
  try {
    parse_suite(yaml, "p.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

const std::string kCase = "suite: s\ncases:\n  - name: c\n    compare: [per_head, batched]\n    shape: {B: 1, T: 2, D: 4, H: 2}\n";

TEST(ToleranceRule, DefaultIsRelativeBelowFloat64AndAllcloseInFloat64) {
  EXPECT_FALSE(parse_one(kCase).relative_rule());
  const CaseSpec f32 = parse_one(kCase + "    dtype: float32\n");
  EXPECT_TRUE(f32.relative_rule());
  EXPECT_EQ(f32.baseline_k.k_for("out"), 2);
  EXPECT_EQ(f32.baseline_k.k_for("dwq"), 3);
  EXPECT_EQ(f32.baseline_k.k_for("q_rot"), 2);
}

TEST(ToleranceRule, AtolOnTheCaseMeansAllcloseButNotInDefaults) {
  EXPECT_FALSE(parse_one(kCase + "    dtype: float32\n    atol: 1.0e-5\n").relative_rule());
  EXPECT_FALSE(parse_one(kCase + "    dtype: float32\n    tolerance: {dwq: {rtol: 1.0e-3}}\n").relative_rule());
  // the defaults' atol/rtol serve the float64 cases: a float32 case keeps the rule
  const std::string with_defaults =
      "suite: s\ndefaults:\n  atol: 1.0e-8\n  rtol: 1.0e-6\ncases:\n  - name: c\n    compare: [per_head, batched]\n"
      "    dtype: float32\n    shape: {B: 1, T: 2, D: 4, H: 2}\n";
  EXPECT_TRUE(parse_one(with_defaults).relative_rule());
  EXPECT_FALSE(parse_one(kCase + "    dtype: float32\n    tolerance: {rule: allclose}\n").relative_rule());
}

TEST(ToleranceRule, FactorsPerGroupAndPerTensor) {
  const CaseSpec c =
      parse_one(kCase + "    dtype: float32\n    tolerance: {rule: relative_to_baseline, k: {out: 4, grads: 5, dwq: 7}}\n");
  EXPECT_TRUE(c.relative_rule());
  EXPECT_EQ(c.baseline_k.k_for("out"), 4);
  EXPECT_EQ(c.baseline_k.k_for("dx"), 5);
  EXPECT_EQ(c.baseline_k.k_for("dwq"), 7);
}

TEST(ToleranceRule, ErrorsNameTheKey) {
  EXPECT_NE(parse_error(kCase + "    dtype: float32\n    tolerance: {rule: loose}\n").find("tolerance: rule"),
            std::string::npos);
  const std::string neg = parse_error(kCase + "    dtype: float32\n    tolerance: {k: {dwq: -1}}\n");
  EXPECT_NE(neg.find("'tolerance: k: dwq' must be > 0"), std::string::npos) << neg;
  const std::string unknown = parse_error(kCase + "    dtype: float32\n    tolerance: {k: {dwz: 2}}\n");
  EXPECT_NE(unknown.find("dwz"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("p.yaml:"), std::string::npos) << unknown;
  const std::string both =
      parse_error(kCase + "    dtype: float32\n    atol: 1.0e-5\n    tolerance: {rule: relative_to_baseline}\n");
  EXPECT_NE(both.find("contradict"), std::string::npos) << both;
  const std::string f64 = parse_error(kCase + "    dtype: float64\n    tolerance: {rule: relative_to_baseline}\n");
  EXPECT_NE(f64.find("below float64"), std::string::npos) << f64;
}

TEST(RoundingFloor, MatchesFloatArithmeticDoneByHand) {
  const std::vector<double> g = {0.0, 1.0, 0.1, -2.5, 1234.5678, 1e-9};
  double want = 0;
  for (double v : g) {
    const float gf = static_cast<float>(v);
    const float back = (gf + 0.3f) - 0.3f;  // rounded to float32 at each step
    want = std::max(want, std::fabs(static_cast<double>(back) - static_cast<double>(gf)));
  }
  ASSERT_GT(want, 0);
  const Tensor t = Tensor::from_values(g, {6}, DType::float64);
  EXPECT_EQ(rounding_floor(t, DType::float32), 2 * want);
  // float64's own noise is far below float32's
  EXPECT_LT(rounding_floor(t, DType::float64), 1e-9 * rounding_floor(t, DType::float32));
}

TEST(JudgeByBaseline, HandWorkedVerdictAndFigures) {
  // golden [2, 3] (b, t): baseline off by 1e-3 at one element; side A off by 2.5e-3, side B by 1e-3
  const std::vector<double> g = {0, 0, 0, 0, 0, 0};
  std::vector<double> base = g, a = g, b = g;
  base[4] = 1e-3;
  a[5] = 2.5e-3;
  b[1] = -1e-3;
  const Tensor tg = Tensor::from_values(g, {1, 2, 3}, DType::float64);
  const Tensor tbase = Tensor::from_values(base, {1, 2, 3}, DType::float64);
  const Tensor ta = Tensor::from_values(a, {1, 2, 3}, DType::float64);
  const Tensor tb = Tensor::from_values(b, {1, 2, 3}, DType::float64);
  TensorComparison cmp = compare_tensor("out", ta, tb, {}, Level::mha, 1);
  judge_by_baseline(cmp, {{"A", &ta}, {"B", &tb}}, tg, tbase, 2.0, DType::float32, Level::mha);
  ASSERT_TRUE(cmp.baseline);
  const BaselineCheck& c = *cmp.baseline;
  EXPECT_EQ(c.floor, 0);  // a zero golden rounds exactly
  EXPECT_EQ(c.side, "A");
  EXPECT_EQ(c.err, 2.5e-3);
  EXPECT_EQ(c.baseline_err, 1e-3);
  EXPECT_DOUBLE_EQ(c.ratio, 2.5);
  EXPECT_DOUBLE_EQ(c.bound, 2e-3);
  EXPECT_FALSE(cmp.allclose);  // 2.5e-3 > 2 * 1e-3
  EXPECT_EQ(cmp.mismatched, 1);
  EXPECT_TRUE(std::isinf(c.normwise));  // ||golden|| = 0
  // out [B, T, D]: by position t, max over b and D
  EXPECT_EQ(c.position_axis, "t");
  ASSERT_EQ(c.err_by_position.size(), 2u);
  EXPECT_EQ(c.err_by_position[0], 0);
  EXPECT_EQ(c.err_by_position[1], 2.5e-3);
  EXPECT_EQ(c.baseline_by_position[1], 1e-3);

  // k = 3 lets it pass
  TensorComparison ok = compare_tensor("out", ta, tb, {}, Level::mha, 1);
  judge_by_baseline(ok, {{"A", &ta}, {"B", &tb}}, tg, tbase, 3.0, DType::float32, Level::mha);
  EXPECT_TRUE(ok.allclose);
  EXPECT_EQ(ok.mismatched, 0);
}

TEST(JudgeByBaseline, NormwiseAndHeadsAtCoreLevel) {
  // core [B=1, H=2, Tq=2, d=1]: golden 3, 4 | 0, 0; side off by 0.5 at head 1, q 0
  const Tensor tg = Tensor::from_values(std::vector<double>{3, 4, 0, 0}, {1, 2, 2, 1}, DType::float64);
  const Tensor side = Tensor::from_values(std::vector<double>{3, 4, 0.5, 0}, {1, 2, 2, 1}, DType::float64);
  const Tensor base = Tensor::from_values(std::vector<double>{3, 4, 0.25, 0}, {1, 2, 2, 1}, DType::float64);
  TensorComparison cmp = compare_tensor("dq", side, base, {}, Level::core, 2);
  judge_by_baseline(cmp, {{"S", &side}}, tg, base, 3.0, DType::float64, Level::core);
  const BaselineCheck& c = *cmp.baseline;
  EXPECT_DOUBLE_EQ(c.normwise, 0.5 / 5.0);  // ||Δ|| / ||golden|| = 0.5 / 5
  EXPECT_DOUBLE_EQ(c.baseline_normwise, 0.25 / 5.0);
  EXPECT_DOUBLE_EQ(c.ratio, 2.0);
  EXPECT_EQ(c.position_axis, "q");
  ASSERT_EQ(c.err_by_head_position.size(), 2u);
  EXPECT_EQ(c.err_by_head_position[0], (std::vector<double>{0, 0}));
  EXPECT_EQ(c.err_by_head_position[1], (std::vector<double>{0.5, 0}));
  EXPECT_TRUE(cmp.allclose);
}

// The judge reads its tensors a chunk at a time (32K elements): over four
// chunks and a partial one, the figures are those of one loop over whole
// float64 copies, written out here: the worst side, its error and where it
// is, the baseline's, the floor (float32 arithmetic by hand, as above),
// the count past the bound, the profile by position, and the worst element
// of the two sides against each other.
TEST(JudgeByBaseline, ChunkedPassesGiveTheFiguresOfOneLoop) {
  const Shape shape{1, 300, 401};  // out [B, T, D]: 120300 elements
  const std::int64_t n = shape_numel(shape);
  std::vector<double> g(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) g[static_cast<std::size_t>(i)] = std::sin(0.001 * static_cast<double>(i)) * 3;
  const Tensor tg = Tensor::from_values(g, shape, DType::float64);
  const Tensor tbase = tg.to(DType::float32);  // the oracle's float32 rounding
  std::vector<double> a = tbase.to_vector(), b = a;
  a[70001] += 0.5;    // side A: one large error in the third chunk
  b[100000] -= 0.25;  // side B: a smaller one in the fourth
  for (std::int64_t i = 110000; i < n; i += 7) a[static_cast<std::size_t>(i)] += 1e-6;  // and small ones in the last
  const Tensor ta = Tensor::from_values(a, shape, DType::float32), tb = Tensor::from_values(b, shape, DType::float32);
  const std::vector<double> base = tbase.to_vector();
  const std::vector<double> av = ta.to_vector(), bv = tb.to_vector();

  double floor = 0, base_err = 0, a_err = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const float gf = static_cast<float>(g[i]);
    floor = std::max(floor, std::fabs(static_cast<double>((gf + 0.3f) - 0.3f) - static_cast<double>(gf)));
    base_err = std::max(base_err, std::fabs(base[i] - g[i]));
    a_err = std::max(a_err, std::fabs(av[i] - g[i]));
  }
  floor *= 2;
  const double k = 3, bound = k * base_err + floor;
  std::int64_t past = 0;
  std::vector<double> by_t(300, 0.0);
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double e = std::fabs(av[i] - g[i]);
    past += e > bound;
    by_t[i / 401] = std::max(by_t[i / 401], e);
  }
  ASSERT_GT(past, 1);  // the large error and some of the small ones

  TensorComparison cmp = compare_tensor("out", ta, tb, {}, Level::mha, 1);
  ASSERT_TRUE(cmp.worst);
  EXPECT_EQ(cmp.worst->index, (Shape{0, 70001 / 401, 70001 % 401}));  // 0.5 beats B's 0.25
  EXPECT_EQ(cmp.worst->lhs, av[70001]);
  EXPECT_EQ(cmp.worst->rhs, bv[70001]);
  EXPECT_EQ(cmp.numel, n);
  judge_by_baseline(cmp, {{"A", &ta}, {"B", &tb}}, tg, tbase, k, DType::float32, Level::mha);
  ASSERT_TRUE(cmp.baseline);
  const BaselineCheck& c = *cmp.baseline;
  EXPECT_EQ(c.floor, floor);
  EXPECT_EQ(c.baseline_err, base_err);
  EXPECT_EQ(c.side, "A");
  EXPECT_EQ(c.err, a_err);
  EXPECT_EQ(c.bound, bound);
  EXPECT_EQ(cmp.mismatched, past);
  EXPECT_FALSE(cmp.allclose);
  EXPECT_EQ(c.err_by_position, by_t);
}

class PrecisionRunTest : public headgrad::test::RunnerPluginsTest {};

// A Llama-like float32 shape: a correct GQA + RoPE comparison passes the rule
// with no hand-picked tolerance, while PyTorch's float32 assert_close defaults
// (atol 1e-5, rtol 1.3e-6) against the same float64 golden fail a gradient.
TEST_F(PrecisionRunTest, CorrectFloat32GqaRopePassesWhereAssertCloseDefaultsFail) {
  for (const char* name : {"per_head", "batched", "fused_sdpa"}) ASSERT_NE(registry_->find(name), nullptr) << name;
  const CaseSpec c = parse_one(
      "suite: s\ncases:\n  - name: gqa-rope-float32\n    compare: [batched, fused_sdpa]\n    dtype: float32\n"
      "    causal: true\n    shape: {B: 2, T: 256, D: 512, H: 8, Hkv: 2, d: 64}\n"
      "    rope: {theta: 10000.0, style: half}\n");
  ASSERT_TRUE(c.relative_rule());
  RunOptions options;
  options.keep_tensors = true;
  CaseInputs inputs;
  const CaseResult r = run_case(c, *registry_, options, &inputs);
  ASSERT_EQ(r.status, CaseStatus::pass) << r.cause << "\n" << case_details(r, true, 2);
  EXPECT_EQ(r.golden_label, "per_head in float64");
  for (const auto& t : r.tensors) {
    ASSERT_TRUE(t.baseline) << t.name;
    EXPECT_GT(t.baseline->baseline_err, 0) << t.name;
    EXPECT_LE(t.baseline->err, t.baseline->bound) << t.name;
  }

  // The same sides against the same golden by allclose at torch's float32 defaults.
  ExecOptions exec;
  const GoldenRun g = run_golden(c, inputs, *registry_, exec);
  ASSERT_TRUE(g.cause.empty()) << g.cause;
  std::vector<std::string> failing;
  for (const auto& name : c.check) {
    const Tensor* side = find_tensor(r.lhs, name);
    const Tensor* golden = find_tensor(g.golden, name);
    ASSERT_TRUE(side && golden) << name;
    const TensorComparison ac = compare_tensor(name, *side, *golden, {1e-5, 1.3e-6}, Level::mha, 8);
    if (!ac.allclose) failing.push_back(name);
  }
  EXPECT_FALSE(failing.empty()) << "torch's float32 defaults pass every tensor: the rule would not matter here";
  bool a_gradient = false;
  for (const auto& n : failing) a_gradient = a_gradient || n != "out";
  EXPECT_TRUE(a_gradient) << "failing under torch's defaults: " << join(failing);
}

// Every catalog bug, each at its mutants.yaml case (a shape where it shows), in
// float32 under the rule: each still fails.
TEST_F(PrecisionRunTest, EveryCatalogMutantFailsInFloat32) {
  const Suite suite = load_suite(fs::path(HEADGRAD_SOURCE_ROOT) / "configs" / "mutants.yaml");
  std::set<std::string> covered;
  RunOptions options;
  for (CaseSpec c : suite.cases) {
    const auto mutant = std::find_if(c.compare.begin(), c.compare.end(),
                                     [](const std::string& n) { return n.rfind("mutant_", 0) == 0; });
    if (mutant == c.compare.end()) continue;
    ASSERT_NE(registry_->find(*mutant), nullptr) << *mutant;
    // a bug that is float32 arithmetic itself is the correct computation in a float32 case
    if (*mutant == "mutant_rope_tables_float32") continue;
    // a case written in 16 bits shows a bug of 16-bit arithmetic, which float32 computes correctly
    if (is_16bit(c.dtype)) continue;
    c.dtype = DType::float32;
    c.tolerance_rule = ToleranceRule::automatic;
    c.expect_fail = false;
    ASSERT_TRUE(c.relative_rule()) << c.name;
    const CaseResult r = run_case(c, *registry_, options);
    EXPECT_EQ(r.status, CaseStatus::fail) << c.name << " passes in float32: " << case_details(r, true, 2);
    // failed by the rule, not by an oracle that could not run
    bool judged = false;
    for (const auto& t : r.tensors) judged = judged || (t.baseline && !t.allclose);
    const bool non_finite = r.cause.find("NaN") != std::string::npos || r.cause.find("Inf") != std::string::npos;
    EXPECT_TRUE(judged || non_finite) << c.name << ": " << r.cause;
    covered.insert(mutant->substr(7));
  }
  for (const auto& info : diagnosis::bug_catalog()) {
    if (std::string(info.name) == "rope_tables_float32" || info.visibility.needs_16bit) continue;
    EXPECT_TRUE(covered.count(std::string(info.name))) << info.name << " has no case in configs/mutants.yaml";
  }
}

// A reference directory's golden/ (float64, from the same inputs) is the golden;
// a golden that is not float64 is refused naming the file.
TEST_F(PrecisionRunTest, ReferenceGoldenFolderIsTheGolden) {
  const fs::path committed = fs::path(HEADGRAD_SOURCE_ROOT) / "configs" / "refs" / "mha_B2_T6_D16_H4_causal_float32";
  ASSERT_TRUE(fs::is_directory(committed / "golden"));
  const fs::path dir = fs::temp_directory_path() / ("headgrad_precision_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy(committed, dir / "ref", fs::copy_options::recursive);
  const std::string yaml = "suite: s\ncases:\n  - name: r\n    compare: [batched]\n    reference: ref\n"
                           "    causal: true\n    shape: {H: 4}\n";
  std::ofstream(dir / "suite.yaml") << yaml;
  Suite suite = load_suite(dir / "suite.yaml");
  const CaseSpec& c = suite.cases.at(0);
  ASSERT_EQ(c.dtype, DType::float32);
  ASSERT_TRUE(c.relative_rule());
  ASSERT_EQ(c.files->golden.size(), c.check.size());
  const CaseResult r = run_case(c, *registry_, {});
  EXPECT_EQ(r.status, CaseStatus::pass) << case_details(r, true, 2);
  EXPECT_EQ(r.golden_label, "ref/golden");
  EXPECT_EQ(r.baseline_label, "ref (its float32 tensors)");  // the reference's own math in float32
  // the golden files are the oracle's float64 math on the same inputs, to float64 rounding
  RunOptions keep;
  keep.keep_tensors = true;
  CaseInputs in;
  const CaseResult again = run_case(c, *registry_, keep, &in);
  CaseSpec without = c;
  auto files = std::make_shared<CaseFiles>(*c.files);
  files->golden.clear();
  without.files = files;
  const GoldenRun oracle = run_golden(without, in, *registry_, {});
  ASSERT_TRUE(oracle.cause.empty()) << oracle.cause;
  for (const auto& [name, g] : c.files->golden) {
    const TensorComparison t =
        compare_tensor(name, g, *find_tensor(oracle.golden, name), {1e-12, 1e-10}, Level::mha, 4);
    EXPECT_TRUE(t.allclose) << name << " max|Δ| " << t.max_abs;
  }

  write_npy(dir / "ref" / "golden" / "dwq.npy", c.files->golden.at(2).tensor.to(DType::float32));
  try {
    load_suite(dir / "suite.yaml");
    ADD_FAILURE() << "a float32 golden was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("ref/golden/dwq.npy holds float32; a golden is float64"), std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

TEST_F(PrecisionRunTest, ReportsShowTheFiguresAndThePlot) {
  const CaseSpec c = parse_one(
      "suite: s\ncases:\n  - name: f32\n    compare: [per_head, mutant_no_scale]\n    dtype: float32\n"
      "    causal: true\n    shape: {B: 2, T: 5, D: 8, H: 2}\n");
  SuiteResult result;
  result.name = "s";
  result.cases.push_back(run_case(c, *registry_, {}));
  keep_report_data(result.cases[0], false);
  const CaseResult& r = result.cases[0];
  ASSERT_EQ(r.status, CaseStatus::fail);
  const std::string text = case_details(r, true, 2);
  EXPECT_NE(text.find("baseline"), std::string::npos) << text;
  EXPECT_NE(text.find("ratio"), std::string::npos) << text;
  EXPECT_NE(text.find("normwise"), std::string::npos) << text;
  const auto j = json_report(result);
  const auto& out = j["cases"][0]["tensors"][0];
  EXPECT_EQ(out["name"], "out");
  EXPECT_EQ(out["baseline"]["side"], "mutant_no_scale");
  EXPECT_GT(out["baseline"]["ratio"].get<double>(), 100);
  EXPECT_EQ(out["baseline"]["error_by_position"].size(), 5u);
  EXPECT_EQ(j["cases"][0]["tolerance_rule"], "relative_to_baseline");
  const std::string html = html_report(result);
  EXPECT_NE(html.find("max |error| per t position"), std::string::npos);
  EXPECT_NE(html.find("<polyline"), std::string::npos);
  const std::string junit = junit_report(result);
  EXPECT_NE(junit.find("ratio"), std::string::npos);
  // the diagnosis sentence: far above on the mutant, as accurate on a correct pair
  EXPECT_NE(analysis::precision_sentence(r).find("far above the rounding level of float32"), std::string::npos)
      << analysis::precision_sentence(r);
  CaseSpec ok = c;
  ok.compare = {"per_head", "batched"};
  const CaseResult good = run_case(ok, *registry_, {});
  ASSERT_EQ(good.status, CaseStatus::pass) << case_details(good, true, 2);
  EXPECT_NE(analysis::precision_sentence(good).find("as accurate as the oracle in this dtype"), std::string::npos)
      << analysis::precision_sentence(good);
}

}  // namespace

}  // namespace test_runner_precision
