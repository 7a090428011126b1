// The diagnosis outside the catalog (tools/analysis/findings.hpp): bugs that no
// catalog entry holds, each its own plugin (tests/plugins/uncatalogued), run
// through tests/findings/uncatalogued.yaml. Each test states what the bug is
// (from the plugin's source, not from the diagnosis) and checks the finding
// says exactly that, with the figure worked out from the shape; and that no
// other relation or pair is named. Also: two bugs at once, a missing
// gradient, the near miss, a reference side, the hypotheses' own mask.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "analysis/analyze.hpp"
#include "analysis/hypotheses.hpp"
#include "headgrad_cli.hpp"
#include "job/run_suite.hpp"
#include "report/report.hpp"
#include "judge/run_case.hpp"

namespace test_findings {  // this file's names: test files share unity builds (tests/meson.build)

using namespace headgrad;
using namespace headgrad::runner;
using namespace headgrad::analysis;
namespace fs = std::filesystem;

namespace {

const fs::path kSuite = fs::path(HEADGRAD_SOURCE_ROOT) / "tests" / "findings" / "uncatalogued.yaml";

class Findings : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    registry_ = new PluginRegistry();
    registry_->load_directories(plugin_search_path({UNCATALOGUED_PLUGIN_DIR, HEADGRAD_BUILD_PLUGIN_DIR}));
    suite_ = new Suite(load_suite(kSuite.string()));
    result_ = new SuiteResult(run_suite(*suite_, *registry_, {}));
  }
  static void TearDownTestSuite() {
    delete result_;
    delete suite_;
    delete registry_;
  }
  static const CaseResult& case_named(const std::string& name) {
    for (const auto& c : result_->cases)
      if (c.spec.name == name) return c;
    throw std::runtime_error("no case " + name);
  }
  // The findings of one kind on the buggy side (the oracle never has any).
  static std::vector<Finding> of_kind(const CaseResult& r, const std::string& kind) {
    std::vector<Finding> out;
    for (const auto& f : r.diagnosis->findings)
      if (f.kind == kind) out.push_back(f);
    return out;
  }
  // Exactly one relation (or pair) finding, on the plugin side, with this id and figure.
  static void expect_relation(const std::string& name, const std::string& relation, const std::string& figure) {
    const CaseResult& r = case_named(name);
    ASSERT_EQ(r.status, CaseStatus::xfail) << name << ": " << r.cause;
    ASSERT_TRUE(r.diagnosis);
    EXPECT_EQ(r.diagnosis->best(), "") << name;
    EXPECT_EQ(r.diagnosis->correct_side, "per_head") << name;
    std::vector<Finding> named = of_kind(r, "relation");
    for (const auto& f : of_kind(r, "pair")) named.push_back(f);
    ASSERT_EQ(named.size(), 1u) << name << ": " << r.diagnosis->sentence;
    EXPECT_EQ(named[0].relation, relation) << name << ": " << named[0].sentence;
    EXPECT_EQ(named[0].figure, figure) << name << ": " << named[0].sentence;
    EXPECT_EQ(named[0].side, r.lhs_label) << name;
    // and the sentence the terminal shows carries it
    EXPECT_NE(r.diagnosis->sentence.find(named[0].sentence), std::string::npos) << r.diagnosis->sentence;
    for (const auto& f : r.diagnosis->findings) EXPECT_EQ(f.side, r.lhs_label) << name << ": " << f.sentence;
  }
  static const Finding& only_computation(const std::string& name) {
    const CaseResult& r = case_named(name);
    static Finding none;
    const auto c = of_kind(r, "computation");
    EXPECT_EQ(c.size(), 1u) << name;
    if (c.empty()) return none;
    static std::vector<Finding> keep;
    keep.push_back(c[0]);
    return keep.back();
  }
  static bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

  static inline PluginRegistry* registry_ = nullptr;
  static inline Suite* suite_ = nullptr;
  static inline SuiteResult* result_ = nullptr;
};

// The suite: 12 single bugs outside the catalog (one at two levels), 3 pairs, a missing gradient,
// and a correct plugin; every expectation (diagnosis none, pass) holds.
TEST_F(Findings, SuiteRunsAsExpected) {
  EXPECT_EQ(result_->cases.size(), 18u);
  EXPECT_EQ(result_->exit_code(), 0);
  for (const auto& c : result_->cases) EXPECT_TRUE(c.status == CaseStatus::xfail || c.status == CaseStatus::pass) << c.spec.name << ": " << c.cause;
}

// A hand-written backward that adds dK twice: out, dwq, dwv, dwo exact; dwk
// and dx wrong; dK twice the correct one. At d = 4 the factor 2 equals
// sqrt(d) too, but the variant H = 1 (D kept, d = 12) leaves it 2: the
// expression named is "2", not sqrt(d).
TEST_F(Findings, GradientFactorIsMatchedToTheShapeThatCarriesIt) {
  expect_relation("dk_accumulated_twice", "grad_factor", "2");
  const Finding& f = only_computation("dk_accumulated_twice");
  EXPECT_EQ(f.tensors, (std::vector<std::string>{"dx", "dwk"}));
  EXPECT_TRUE(has(f.sentence, "the gradient that reaches K is wrong")) << f.sentence;
  // dQ times the scale again: 1/sqrt(4) = 0.5, and 1/2 is refuted at d = 12
  expect_relation("dq_scaled_twice", "grad_factor", "1/sqrt(d) = 0.5");
  EXPECT_TRUE(has(only_computation("dq_scaled_twice").sentence, "reaches Q")) << only_computation("dq_scaled_twice").sentence;
  // dV / H at H = 3
  expect_relation("dv_averaged_over_heads", "grad_factor", "1/H = 0.3333");
  // dWo a mean over B*T = 10 tokens, nothing else wrong
  expect_relation("dwo_mean_over_tokens", "grad_factor", "1/(B*T) = 0.1");
  EXPECT_TRUE(has(only_computation("dwo_mean_over_tokens").sentence, "only the output projection's gradient differs"));
  // the value projection's share of dx dropped: a factor 0 on that path
  expect_relation("dx_without_v_path", "grad_factor", "0");
  EXPECT_TRUE(has(of_kind(case_named("dx_without_v_path"), "relation")[0].sentence, "value projection")) ;
  EXPECT_TRUE(has(only_computation("dx_without_v_path").sentence, "only dx differs"));
}

// Re-runs of the correct attention on transformed inputs.
TEST_F(Findings, InputTransformsReproduceTheSide) {
  expect_relation("heads_rotated", "heads_permuted", "heads rotated by 1");
  expect_relation("wq_wv_swapped", "inputs_exchanged", "Wq <-> Wv");
  expect_relation("wk_untransposed", "weight_transposed", "Wk transposed");
  expect_relation("keys_shifted", "shift_along_T", "k shifted by 1 along T");
  // confirmed where the variants ran (H = 1 has no heads to permute: not counted)
  const auto rel = of_kind(case_named("wq_wv_swapped"), "relation");
  EXPECT_GE(rel.at(0).confirmed_at.size(), 4u);
  EXPECT_TRUE(has(only_computation("heads_rotated").sentence, "the error is in the forward"));
}

// Measured facts: the last head alone wrong (its rows of Wq, Wk, Wv and
// columns of Wo, d = 4: [8, 12)); every output row times its denominator;
// a factor per head.
TEST_F(Findings, OneHeadAndMissingNormalization) {
  expect_relation("last_head_unscaled", "one_head", "head 2");
  const auto f = of_kind(case_named("last_head_unscaled"), "relation").at(0);
  EXPECT_EQ(f.tensors, (std::vector<std::string>{"dwq", "dwk", "dwv", "dwo"}));
  EXPECT_TRUE(has(f.sentence, "rows [8, 12) of Wq, Wk, Wv and columns [8, 12) of Wo")) << f.sentence;
  expect_relation("softmax_unnormalized", "row_normalization",
                  "out row i = sum_j exp(s_ij - max s_i) x correct row i");
  // head h's output times h + 1, at both levels
  expect_relation("head_gates_arange", "per_head_factor", "[1, 2, 3]");
  expect_relation("head_gates_arange_core", "per_head_factor", "[1, 2, 3]");
}

// Two bugs at once, each reported as the pair.
TEST_F(Findings, TwoBugsAreReportedAsThePair) {
  expect_relation("pair_kv_swapped_merge", "two_bugs", "merge_without_transpose + kv_swapped");
  expect_relation("pair_no_scale_wq_untransposed", "two_bugs", "no_scale + Wq transposed");
  expect_relation("pair_no_causal_heads_rotated", "two_bugs", "missing_causal_mask + heads rotated by 1");
  for (const std::string name : {"pair_kv_swapped_merge", "pair_no_scale_wq_untransposed", "pair_no_causal_heads_rotated"})
    EXPECT_EQ(case_named(name).diagnosis->sentence.rfind("No single known bug reproduces this failure", 0), 0u);
}

// No gradient for Wq: its own finding, and no hypothesis "fits" it.
TEST_F(Findings, MissingGradientIsItsOwnFinding) {
  const CaseResult& r = case_named("query_unprojected");
  const auto m = of_kind(r, "missing_gradient");
  ASSERT_EQ(m.size(), 1u) << r.diagnosis->sentence;
  EXPECT_EQ(m[0].tensors, std::vector<std::string>{"dwq"});
  EXPECT_TRUE(has(m[0].sentence, "returned no gradient for wq")) << m[0].sentence;
  EXPECT_TRUE(of_kind(r, "relation").empty());
  EXPECT_TRUE(of_kind(r, "pair").empty());
  EXPECT_FALSE(has(r.diagnosis->sentence, "fits at the failing shape")) << r.diagnosis->sentence;
  EXPECT_TRUE(r.diagnosis->fits.empty());
}

// The correct plugin passes with no diagnosis; the oracle side never gets a finding.
TEST_F(Findings, CorrectPluginGetsNoFinding) {
  const CaseResult& r = case_named("correct");
  EXPECT_EQ(r.status, CaseStatus::pass);
  EXPECT_FALSE(r.diagnosis.has_value());
  for (const auto& c : result_->cases)
    if (c.diagnosis)
      for (const auto& f : c.diagnosis->findings) {
        EXPECT_NE(f.side, "per_head") << c.spec.name << ": " << f.sentence;
      }
}

// Each of the 12 single bugs gets a relation; none is named wrongly
// (each expectation above is exact); a catalog bug gets fits, not findings.
TEST_F(Findings, CatalogBugsKeepTheirNameAndNoFindings) {
  const Suite s = parse_suite("suite: t\ncases:\n  - name: c\n    compare: [mutant_merge_without_transpose, per_head]\n"
                              "    shape: {B: 2, T: 3, D: 8, H: 2}\n    causal: true\n",
                              "m.yaml");
  const CaseResult r = check_case(s.cases.at(0), *registry_, {});
  ASSERT_TRUE(r.diagnosis);
  EXPECT_EQ(r.diagnosis->best(), "merge_without_transpose");
  EXPECT_TRUE(r.diagnosis->findings.empty());
}

// The JSON report holds diagnosis.findings with their evidence; the terminal (-v expands an
// expected failure) the sentence.
TEST_F(Findings, JsonAndTerminalCarryTheFindings) {
  const fs::path json_file = fs::temp_directory_path() / ("findings_" + std::to_string(::getpid()) + ".json");
  const test::Outcome o = test::headgrad({"run", kSuite.string(), "--plugin-path", UNCATALOGUED_PLUGIN_DIR, "--filter",
                                          "dk_accumulated_twice", "-v", "--json", json_file.string()});
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  EXPECT_TRUE(has(o.out, "dK, the gradient that reaches K (dwk and dx follow) is 2 times the correct one")) << o.out;
  const auto j = nlohmann::json::parse(test::slurp(json_file));
  fs::remove(json_file);
  const auto& f = j.at("cases").at(0).at("diagnosis").at("findings");
  bool found = false;
  for (const auto& x : f)
    if (x.at("kind") == "relation") {
      found = true;
      EXPECT_EQ(x.at("relation"), "grad_factor");
      EXPECT_EQ(x.at("figure"), "2");
      EXPECT_EQ(x.at("tensors"), nlohmann::json::array({"dwk"}));
      EXPECT_GE(x.at("confirmed_at").size(), 4u);
      EXPECT_EQ(x.at("side"), "u_dk_accumulated_twice");
    }
  EXPECT_TRUE(found) << f.dump();
}

// float32: the near miss, if any, is the failing side's, and never a
// hypothesis that equals the correct attention at this shape.
TEST_F(Findings, NearMissIsTheFailingSides) {
  const Suite s = parse_suite("suite: t\ncases:\n  - name: c\n    compare: [u_heads_rotated, per_head]\n"
                              "    shape: {B: 2, T: 5, D: 12, H: 3}\n    causal: true\n    dtype: float32\n",
                              "f.yaml");
  const CaseResult r = check_case(s.cases.at(0), *registry_, {});
  ASSERT_EQ(r.status, CaseStatus::fail) << r.cause;
  ASSERT_TRUE(r.diagnosis);
  for (const auto& n : r.diagnosis->near) {
    EXPECT_EQ(n.side, "u_heads_rotated") << r.diagnosis->sentence;
    EXPECT_NE(n.bug, "causal_alignment") << r.diagnosis->sentence;  // equals the correct attention at Tq = Tk
  }
  EXPECT_FALSE(has(r.diagnosis->sentence, "on per_head")) << r.diagnosis->sentence;
}

// A reference written by a buggy function: the reference side is named, the
// plugin is the correct side, and localization says what to run instead.
TEST_F(Findings, ReferenceSideIsDiagnosed) {
  const fs::path dir = fs::temp_directory_path() / ("findings_ref_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "w.yaml") << "cases:\n  - {name: w, compare: [mutant_merge_without_transpose, per_head], causal: true, "
                                   "shape: {B: 2, T: 3, D: 8, H: 2}}\n";
  const test::Outcome ex = test::headgrad({"export", (dir / "w.yaml").string(), "--case", "w", "--plugin",
                                           "mutant_merge_without_transpose", "--out", (dir / "ref").string()},
                                          fs::current_path(), {{"HEADGRAD_PLUGIN_PATH", HEADGRAD_BUILD_PLUGIN_DIR}});
  ASSERT_EQ(ex.code, 0) << ex.out << ex.err;
  const Suite s = parse_suite("suite: t\ncases:\n  - name: r\n    compare: [per_head]\n    reference: " + (dir / "ref").string() +
                                  "\n    causal: true\n    shape: {H: 2}\n",
                              (dir / "r.yaml").string());
  const CaseResult r = check_case(s.cases.at(0), *registry_, {});
  fs::remove_all(dir);
  ASSERT_EQ(r.status, CaseStatus::fail) << r.cause;
  ASSERT_TRUE(r.diagnosis);
  EXPECT_EQ(r.diagnosis->best(), "merge_without_transpose") << r.diagnosis->sentence;
  EXPECT_EQ(r.diagnosis->judged_side, r.rhs_label);
  EXPECT_EQ(r.diagnosis->reference_side, r.rhs_label);
  EXPECT_EQ(r.diagnosis->correct_side, "per_head");
  EXPECT_EQ(r.diagnosis->sentence.rfind("the reference " + r.rhs_label + " reproduces merge_without_transpose", 0), 0u)
      << r.diagnosis->sentence;
  EXPECT_TRUE(has(r.diagnosis->sentence, "per_head matches the correct attention: it is the correct side"))
      << r.diagnosis->sentence;
  ASSERT_TRUE(r.localization);
  EXPECT_TRUE(has(r.localization->sentence, "cannot be re-run")) << r.localization->sentence;
  EXPECT_TRUE(has(r.localization->sentence, "headgrad check")) << r.localization->sentence;
}

// The hypotheses' mask, from design.md's definitions, against masks written
// out by hand: top-left and bottom-right causal at Tq 2, Tk 4, and a given
// mask combined with causal.
TEST(HypothesisMask, MatchesTheDefinitionsByHand) {
  AttentionSpec spec;
  spec.causal = true;
  const auto values = [](const Tensor& t) { return t.contiguous().to_vector(); };
  // top-left: query i attends j <= i
  EXPECT_EQ(values(diagnosis::hypothesis_mask(spec, 2, 4, {})), (std::vector<double>{1, 0, 0, 0, 1, 1, 0, 0}));
  // bottom-right: j <= i + Tk - Tq = i + 2
  spec.causal_alignment = CausalAlignment::bottom_right;
  EXPECT_EQ(values(diagnosis::hypothesis_mask(spec, 2, 4, {})), (std::vector<double>{1, 1, 1, 0, 1, 1, 1, 1}));
  // the catalog's causal bugs: the diagonal left out, the mask inverted (top-left)
  spec.causal_alignment = CausalAlignment::top_left;
  EXPECT_EQ(values(diagnosis::hypothesis_mask(spec, 2, 2, diagnosis::Bug::causal_mask_excludes_diagonal)),
            (std::vector<double>{0, 0, 1, 0}));
  EXPECT_EQ(values(diagnosis::hypothesis_mask(spec, 2, 2, diagnosis::Bug::causal_mask_inverted)),
            (std::vector<double>{1, 1, 0, 1}));
  // a [2, 1, 2, 3] mask and causal: both must allow the key
  spec.mask = Tensor::from_values(std::vector<double>{1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1}, {2, 1, 2, 3}, DType::boolean);
  const Tensor m = diagnosis::hypothesis_mask(spec, 2, 3, {});
  EXPECT_EQ(m.shape(), (Shape{2, 1, 2, 3}));
  EXPECT_EQ(values(m), (std::vector<double>{1, 0, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0}));
  // no causal, no mask: nothing masked
  EXPECT_FALSE(diagnosis::hypothesis_mask(AttentionSpec{}, 3, 3, {}).defined());
}

}  // namespace

}  // namespace test_findings
