// Localization, diagnosis, mutation score and weak-suite warnings,
// on the mutant plugins, whose bugs are known: each test states the signature
// the bug must show and checks the runner finds exactly that.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>

#include "analysis/analyze.hpp"
#include "runner/run.hpp"

using namespace headgrad;
using namespace headgrad::runner;
using namespace headgrad::analysis;

namespace {

class Analysis : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    registry_ = new PluginRegistry();
    registry_->load_directories(plugin_search_path({}));
  }
  static void TearDownTestSuite() {
    delete registry_;
    registry_ = nullptr;
  }
  static PluginRegistry* registry_;

  // One mha case, mutant against the oracle, at a shape where every bug shows.
  static CaseResult run_pair(const std::string& lhs, const std::string& yaml_extra = "") {
    const std::string yaml = "suite: t\ncases:\n  - name: c\n    compare: [" + lhs +
                             ", per_head]\n    shape: {B: 2, T: 3, D: 8, H: 2}\n    causal: true\n" + yaml_extra;
    const Suite s = parse_suite(yaml, "analysis.yaml");
    return check_case(s.cases.at(0), *registry_, {});
  }

  static bool has(const std::vector<std::string>& v, const std::string& x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  }
  static CaseStatus row_status(const Localization& loc, const std::string& change_prefix) {
    for (const auto& r : loc.rows)
      if (r.change.rfind(change_prefix, 0) == 0) return r.status;
    ADD_FAILURE() << "no localization row " << change_prefix;
    return CaseStatus::error;
  }
};
PluginRegistry* Analysis::registry_ = nullptr;

TEST_F(Analysis, MutantsSuiteCatchesAndNamesEveryMutant) {
  const Suite suite = load_suite(HEADGRAD_SOURCE_ROOT "/configs/mutants.yaml");
  const SuiteResult result = run_suite(suite, *registry_, {});
  const MutationScore score = result.mutation_score();
  EXPECT_EQ(score.mutants, suite.cases.size());
  EXPECT_EQ(score.caught, score.mutants);
  EXPECT_EQ(score.named, score.mutants);
  EXPECT_EQ(result.exit_code(), 0);
  for (const auto& c : result.cases) {
    ASSERT_TRUE(c.diagnosis.has_value()) << c.spec.name;
    EXPECT_EQ(c.diagnosis->best(), c.spec.expect_diagnosis);
    EXPECT_EQ(c.diagnosis->judged_side, c.mutant);
    EXPECT_EQ(c.diagnosis->correct_side, "per_head") << c.spec.name;
  }
}

TEST_F(Analysis, HeadLayoutBugPassesAtOneHeadAndOnePositionOnly) {
  const CaseResult r = run_pair("mutant_merge_without_transpose");
  ASSERT_EQ(r.status, CaseStatus::fail);
  ASSERT_TRUE(r.localization);
  const Localization& loc = *r.localization;
  EXPECT_EQ(row_status(loc, "H = 1 (d kept"), CaseStatus::pass);
  EXPECT_EQ(row_status(loc, "T = 1"), CaseStatus::pass);
  EXPECT_EQ(row_status(loc, "B = 1"), CaseStatus::fail);  // still H > 1 and T > 1
  EXPECT_TRUE(has(loc.depends_on, "H"));
  EXPECT_TRUE(has(loc.depends_on, "T"));
  EXPECT_TRUE(has(loc.independent_of, "B"));
  EXPECT_NE(loc.sentence.find("H = 1"), std::string::npos) << loc.sentence;
  ASSERT_TRUE(r.diagnosis);
  EXPECT_EQ(r.diagnosis->best(), "merge_without_transpose");
}

TEST_F(Analysis, ScaleBugPassesAtOnePositionAndFailsForAnyHeadCount) {
  const CaseResult r = run_pair("mutant_scale_one_over_d");
  ASSERT_EQ(r.status, CaseStatus::fail);
  const Localization& loc = *r.localization;
  EXPECT_EQ(row_status(loc, "T = 1"), CaseStatus::pass);
  EXPECT_EQ(row_status(loc, "H = 1 (d kept"), CaseStatus::fail);
  EXPECT_EQ(row_status(loc, "H = 1 (D kept"), CaseStatus::fail);
  EXPECT_EQ(loc.depends_on, std::vector<std::string>{"T"});
  EXPECT_TRUE(has(loc.independent_of, "H"));
  EXPECT_TRUE(has(loc.independent_of, "B"));
  EXPECT_EQ(r.diagnosis->best(), "scale_one_over_d");
  // Position 0 sees one key (causal): a softmax over one key is 1 whatever the
  // scale, so the output's first position matches.
  ASSERT_FALSE(loc.spread.empty());
  EXPECT_EQ(loc.spread[0].tensor, "out");
  EXPECT_LE(loc.spread[0].per_position.at(0), loc.spread[0].tolerance);
  EXPECT_GT(loc.spread[0].per_position.at(1), loc.spread[0].tolerance);
}

TEST_F(Analysis, BatchMixingBugPassesAtOneBatchItem) {
  const CaseResult r = run_pair("mutant_batch_mixing");
  ASSERT_EQ(r.status, CaseStatus::fail);
  const Localization& loc = *r.localization;
  EXPECT_EQ(row_status(loc, "B = 1"), CaseStatus::pass);
  EXPECT_TRUE(has(loc.depends_on, "B"));
  EXPECT_TRUE(has(loc.independent_of, "H"));
  EXPECT_EQ(r.diagnosis->best(), "batch_mixing");
}

TEST_F(Analysis, ModelDimScaleBugIsInvisibleWhenTheHeadDimIsTheModelDim) {
  const CaseResult r = run_pair("mutant_scale_model_dim");
  ASSERT_EQ(r.status, CaseStatus::fail);
  EXPECT_EQ(row_status(*r.localization, "H = 1 (D kept"), CaseStatus::pass);
  EXPECT_EQ(r.diagnosis->best(), "scale_model_dim");
}

TEST_F(Analysis, NoHypothesisFitsSaysSoInsteadOfGuessing) {
  // Two correct plugins under an impossible tolerance: they differ by rounding
  // only, which no bug of the catalog reproduces.
  const CaseResult r = run_pair("fused_sdpa", "    atol: 0.0\n    rtol: 0.0\n");
  ASSERT_EQ(r.status, CaseStatus::fail);
  ASSERT_TRUE(r.diagnosis);
  EXPECT_TRUE(r.diagnosis->fits.empty());
  EXPECT_EQ(r.diagnosis->best(), "");
  EXPECT_NE(r.diagnosis->sentence.find("No known bug reproduces"), std::string::npos) << r.diagnosis->sentence;
}

TEST_F(Analysis, WrongExpectedDiagnosisFailsTheCase) {
  const CaseResult r =
      run_pair("mutant_merge_without_transpose", "    expect: {fail: true, diagnosis: no_scale}\n");
  EXPECT_EQ(r.status, CaseStatus::fail);
  EXPECT_NE(r.cause.find("expected the diagnosis no_scale, got merge_without_transpose"), std::string::npos)
      << r.cause;
}

TEST_F(Analysis, ReferenceCaseGetsDiagnosisButNoReRuns) {
  const std::string yaml =
      "suite: t\ncases:\n  - name: ref\n    compare: [mutant_kv_swapped]\n    reference: " HEADGRAD_SOURCE_ROOT
      "/configs/refs/mha_B2_T5_D12_H3_causal_float64\n    shape: {H: 3}\n    causal: true\n";
  Suite s = parse_suite(yaml, "ref.yaml");
  load_case_files(s.cases.at(0));
  const CaseResult r = check_case(s.cases.at(0), *registry_, {});
  ASSERT_EQ(r.status, CaseStatus::fail);
  EXPECT_EQ(r.diagnosis->best(), "kv_swapped");
  EXPECT_TRUE(r.localization->rows.empty());
  EXPECT_FALSE(r.localization->where.empty());
}

std::vector<WeakSuiteWarning> warnings_for(const std::string& cases_yaml) {
  static Suite keep;  // the CaseSpec pointers live in it
  keep = parse_suite("suite: w\ncases:\n" + cases_yaml, "w.yaml");
  std::vector<const CaseSpec*> ptrs;
  for (const auto& c : keep.cases) ptrs.push_back(&c);
  return weak_suite_warnings(ptrs);
}

bool warns(const std::vector<WeakSuiteWarning>& ws, const std::string& condition, const std::string& bug) {
  for (const auto& w : ws)
    if (w.condition == condition && std::find(w.bugs.begin(), w.bugs.end(), bug) != w.bugs.end()) return true;
  return false;
}

TEST(WeakSuite, OneHeadOnlyCannotCatchHeadLayoutBugs) {
  const auto ws = warnings_for(
      "  - {name: a, compare: [per_head, batched], shape: {B: 2, T: 5, D: 8, H: 1}, causal: true}\n"
      "  - {name: b, compare: [per_head, batched], shape: {B: 3, T: 4, D: 4, H: 1}, causal: true}\n");
  EXPECT_TRUE(warns(ws, "every case has H = 1", "split_without_transpose"));
  EXPECT_TRUE(warns(ws, "every case has H = 1", "merge_without_transpose"));
  EXPECT_TRUE(warns(ws, "every case has H = 1", "interleaved_head_slices"));
  EXPECT_TRUE(warns(ws, "the head dim equals the model dim in every mha case", "scale_model_dim"));
  EXPECT_FALSE(warns(ws, "every case has T = 1", "no_scale"));
  EXPECT_FALSE(warns(ws, "every case has B = 1", "batch_mixing"));
  for (const auto& w : ws) EXPECT_EQ(w.message.rfind("weak suite: ", 0), 0u) << w.message;
}

TEST(WeakSuite, OtherBlindSpots) {
  const auto ws = warnings_for(
      "  - {name: a, compare: [per_head, batched], shape: {B: 1, T: 1, D: 8, H: 2}, check: [out]}\n");
  EXPECT_TRUE(warns(ws, "every case has T = 1", "scale_one_over_d"));
  EXPECT_TRUE(warns(ws, "every case has B = 1", "batch_mixing"));
  EXPECT_TRUE(warns(ws, "no case is causal", "missing_causal_mask"));
  EXPECT_FALSE(ws.empty());
  bool gradients = false, contiguous = false;
  for (const auto& w : ws) {
    gradients = gradients || w.condition == "no case checks a gradient";
    contiguous = contiguous || w.condition == "every input is contiguous";
  }
  EXPECT_TRUE(gradients);
  EXPECT_TRUE(contiguous);
}

TEST(WeakSuite, DefaultSuiteHasNoBlindSpot) {
  const Suite s = load_suite(HEADGRAD_SOURCE_ROOT "/configs/default.yaml");
  std::vector<const CaseSpec*> ptrs;
  for (const auto& c : s.cases) ptrs.push_back(&c);
  const auto ws = weak_suite_warnings(ptrs);
  for (const auto& w : ws) ADD_FAILURE() << w.message;
}

}  // namespace

namespace {

TEST(MutantsSuiteCli, PrintsAFullMutationScore) {
  const std::string cmd = std::string(HEADGRAD_EXE) + " run " HEADGRAD_SOURCE_ROOT "/configs/mutants.yaml 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  const int status = pclose(pipe);
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_NE(out.find("mutation score: 14/14 mutants caught (100%), 14/14 named correctly (100%)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("14 passed, 0 failed"), std::string::npos) << out;
}

}  // namespace

namespace {

bool has_condition(const std::vector<WeakSuiteWarning>& ws, const std::string& start) {
  for (const auto& w : ws)
    if (w.condition.rfind(start, 0) == 0) return true;
  return false;
}

}  // namespace

TEST(WeakSuite, RopeBlindSpots) {
  // T = 1, r = 2, positions 5..5+T-1, all below 1000, no rope level, no taps
  const auto weak = warnings_for(
      "  - {name: a, compare: [per_head, batched], shape: {B: 2, T: 1, D: 8, H: 2}, causal: true, "
      "rope: {rotary_dim: 2, positions: {offset: 5}}}\n");
  EXPECT_TRUE(has_condition(weak, "every attention case with RoPE has T = 1"));
  EXPECT_TRUE(warns(weak, "every RoPE case has rotary_dim 2 (one pair: both pairings are the same)", "rope_style_swapped"));
  EXPECT_TRUE(warns(weak, "every RoPE case has positions arange + c", "rope_positions_ignored"));
  EXPECT_TRUE(has_condition(weak, "no RoPE case has a position >= 1000"));
  EXPECT_TRUE(has_condition(weak, "no case is at the rope level and none has taps"));

  // each blind spot closed by one case: T > 1 and r = 4 with gapped rows reaching 1000, and taps
  const auto strong = warnings_for(
      "  - {name: a, compare: [per_head, batched], shape: {B: 2, T: 4, D: 8, H: 2}, causal: true, "
      "rope: {positions: {generator: gapped, start: 1000}}, taps: [q_rot]}\n");
  for (const auto& w : strong) EXPECT_EQ(w.condition.find("RoPE"), std::string::npos) << w.message;
  EXPECT_FALSE(has_condition(strong, "no case is at the rope level"));
  // 997 + 3 = 1000 counts; a list [0, 1, 2, 3] is an arange
  const auto edge = warnings_for(
      "  - {name: a, compare: [per_head, batched], shape: {B: 2, T: 4, D: 8, H: 2}, causal: true, "
      "rope: {positions: {offset: 997}}}\n"
      "  - {name: b, level: rope, compare: [per_head, batched], shape: {B: 1, T: 4, d: 4}, rope: {positions: [0, 1, 2, 3]}}\n");
  EXPECT_FALSE(has_condition(edge, "no RoPE case has a position >= 1000"));
  EXPECT_TRUE(has_condition(edge, "every RoPE case has positions arange + c"));
  EXPECT_FALSE(has_condition(edge, "no case is at the rope level"));
  // suites without RoPE get no RoPE warning
  for (const auto& w : warnings_for("  - {name: a, compare: [per_head, batched], shape: {B: 2, T: 4, D: 8, H: 2}}\n"))
    EXPECT_EQ(w.condition.find("RoPE"), std::string::npos) << w.message;
}
