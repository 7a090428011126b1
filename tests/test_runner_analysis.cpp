// Localization, diagnosis, mutation score and weak-suite warnings,
// on the mutant plugins, whose bugs are known: each test states the signature
// the bug must show and checks the runner finds exactly that.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "analysis/analyze.hpp"
#include "job/run_suite.hpp"
#include "judge/run_case.hpp"
#include "report/report.hpp"
#include "runner_plugins.hpp"

namespace test_runner_analysis {  // this file's names: test files share unity builds (tests/meson.build)

using namespace headgrad;
using namespace headgrad::runner;
using namespace headgrad::analysis;

namespace {

class Analysis : public headgrad::test::RunnerPluginsTest {
 protected:

  // One mha case, mutant against the oracle, at a shape where every bug shows.
  static CaseResult run_pair(const std::string& lhs, const std::string& yaml_extra = "") {
    const std::string yaml = "suite: t\ncases:\n  - name: c\n    compare: [" + lhs +
                             ", per_head]\n    shape: {B: 2, T: 3, D: 8, H: 2}\n    causal: true\n" + yaml_extra;
    const Suite s = parse_suite(yaml, "analysis.yaml");
    return check_case(s.cases.at(0), *registry_, {});
  }

  // The same at the GQA shape that hides no grouped-kv bug (H 12, Hkv 3, d 10).
  static CaseResult run_grouped(const std::string& lhs) {
    const std::string yaml = "suite: t\ncases:\n  - name: c\n    compare: [" + lhs +
                             ", per_head]\n    shape: {B: 2, T: 7, D: 24, H: 12, Hkv: 3, d: 10}\n    causal: true\n";
    return check_case(parse_suite(yaml, "analysis.yaml").cases.at(0), *registry_, {});
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

// One core case under causal (top-left), `lhs` against the oracle.
CaseResult run_core(const std::string& lhs, const std::string& shape, const std::string& extra = "") {
  const std::string yaml = "suite: t\ndefaults:\n  causal: true\ncases:\n  - name: c\n    level: core\n"
                           "    compare: [" + lhs + ", per_head]\n    shape: " + shape + "\n" + extra;
  const Suite s = parse_suite(yaml, "analysis.yaml");
  PluginRegistry reg;
  reg.load_directories(plugin_search_path({RUNNER_TEST_PLUGIN_DIR}));
  return check_case(s.cases.at(0), reg, {});
}

// A bottom-right plugin under a top-left suite: at a decode step (Tq = 1) and
// at Tq = Tk + 1 missing_causal_mask, causal_mask_inverted or
// causal_mask_excludes_diagonal also fit that one shape, but the failure
// vanishes at Tq = Tk where they would still show: only causal_alignment stays.
TEST(Confirm, AlignmentBugIsNamedAndTheLookalikesAreRuledOutByLocalization) {
  for (const std::string shape : {"{B: 2, H: 2, Tq: 1, Tk: 7, d: 4}", "{B: 2, H: 2, Tq: 5, Tk: 4, d: 4}"}) {
    const CaseResult r = run_core("mutant_causal_alignment", shape);
    ASSERT_EQ(r.status, CaseStatus::fail) << shape;
    ASSERT_TRUE(r.diagnosis && r.localization);
    EXPECT_EQ(r.diagnosis->best(), "causal_alignment") << r.diagnosis->sentence;
    EXPECT_EQ(r.diagnosis->fits.size(), 1u) << r.diagnosis->sentence;
    EXPECT_NE(r.diagnosis->sentence.find("aligns the causal mask bottom-right; set causal: bottom_right if that "
                                         "is your convention"),
              std::string::npos);
    EXPECT_FALSE(r.diagnosis->ruled_out.empty()) << shape;  // a lookalike fit at the failing shape alone
    for (const auto& why : r.diagnosis->ruled_out)
      EXPECT_NE(why.find("the failure vanishes at Tq = Tk = "), std::string::npos) << why;
    // localization: Tq and Tk apart
    EXPECT_NE(r.localization->sentence.find("needs Tq != Tk"), std::string::npos) << r.localization->sentence;
    EXPECT_NE(std::find(r.localization->depends_on.begin(), r.localization->depends_on.end(), "Tq!=Tk"),
              r.localization->depends_on.end());
    EXPECT_NE(r.localization->sentence.find("only when causal"), std::string::npos) << r.localization->sentence;
  }
  // at the decode step exactly the lookalikes that fit there are ruled out
  const CaseResult decode = run_core("mutant_causal_alignment", "{B: 2, H: 2, Tq: 1, Tk: 7, d: 4}");
  ASSERT_EQ(decode.diagnosis->ruled_out.size(), 2u);
  EXPECT_EQ(decode.diagnosis->ruled_out[0].rfind("missing_causal_mask ", 0), 0u) << decode.diagnosis->ruled_out[0];
  EXPECT_EQ(decode.diagnosis->ruled_out[1].rfind("causal_mask_inverted ", 0), 0u) << decode.diagnosis->ruled_out[1];
}

// The same plugin under the suite's declared bottom-right convention agrees with per_head.
TEST(Confirm, BottomRightSuiteAcceptsABottomRightPlugin) {
  const CaseResult r = run_core("mutant_causal_alignment", "{B: 2, H: 2, Tq: 1, Tk: 7, d: 4}",
                                "    causal: bottom_right\n");
  EXPECT_EQ(r.status, CaseStatus::pass) << r.cause;
}

// Bugs outside the catalog: nothing is named, at mha and core shapes.
TEST(Confirm, BugsOutsideTheCatalogNameNoCatalogBug) {
  PluginRegistry reg;
  reg.load_directories(plugin_search_path({RUNNER_TEST_PLUGIN_DIR}));
  const std::vector<std::string> mha_shapes = {"{B: 2, T: 3, D: 8, H: 2}", "{B: 1, T: 5, D: 12, H: 3}"};
  for (const std::string bug : {"heads_reversed", "wq_wk_swapped", "scale_after_softmax"}) {
    for (const auto& shape : mha_shapes) {
      const Suite s = parse_suite("suite: t\ncases:\n  - name: c\n    compare: [uncatalogued_" + bug +
                                      ", per_head]\n    causal: true\n    shape: " + shape + "\n",
                                  "u.yaml");
      const CaseResult r = check_case(s.cases.at(0), reg, {});
      ASSERT_EQ(r.status, CaseStatus::fail) << bug << " " << shape;
      ASSERT_TRUE(r.diagnosis);
      EXPECT_EQ(r.diagnosis->best(), "") << bug << " " << shape << ": " << r.diagnosis->sentence;
      EXPECT_EQ(r.diagnosis->sentence.rfind("No known bug reproduces this failure", 0), 0u) << r.diagnosis->sentence;
    }
  }
  for (const std::string bug : {"heads_reversed", "scale_after_softmax"})
    for (const std::string shape : {"{B: 2, H: 2, Tq: 1, Tk: 7, d: 4}", "{B: 2, H: 2, Tq: 5, Tk: 4, d: 4}"}) {
      const CaseResult r = run_core("uncatalogued_" + bug, shape);
      ASSERT_EQ(r.status, CaseStatus::fail) << bug << " " << shape;
      EXPECT_EQ(r.diagnosis->best(), "") << bug << " " << shape << ": " << r.diagnosis->sentence;
    }
}

// "(closest: X)" is named only within 10x of the tolerance: rounding noise
// under atol = rtol = 0 is infinitely far from every bug's fit.
TEST(Confirm, NoClosestHintFarOutsideTheTolerance) {
  const CaseResult r = run_core("uncatalogued_wq_wk_swapped", "{B: 2, H: 2, Tq: 4, Tk: 4, d: 4}");
  ASSERT_EQ(r.status, CaseStatus::pass);  // at the core level there are no weights to swap
  const CaseResult far = run_core("uncatalogued_scale_after_softmax", "{B: 2, H: 2, Tq: 4, Tk: 4, d: 4}");
  ASSERT_EQ(far.status, CaseStatus::fail);
  EXPECT_EQ(far.diagnosis->sentence.find("closest"), std::string::npos) << far.diagnosis->sentence;
  EXPECT_TRUE(far.diagnosis->near.empty());
}

TEST(Confirm, ExpectDiagnosisNoneAssertsTheHonestAnswer) {
  const CaseResult honest = run_core("uncatalogued_scale_after_softmax", "{B: 2, H: 2, Tq: 4, Tk: 5, d: 4}",
                                     "    expect: {fail: true, diagnosis: none}\n");
  EXPECT_EQ(honest.status, CaseStatus::xfail) << honest.cause;
  const CaseResult named = run_core("mutant_causal_alignment", "{B: 2, H: 2, Tq: 1, Tk: 7, d: 4}",
                                    "    expect: {fail: true, diagnosis: none}\n");
  EXPECT_EQ(named.status, CaseStatus::fail);
  EXPECT_NE(named.cause.find("expected the diagnosis none, got causal_alignment"), std::string::npos) << named.cause;
}

// With a mask file, the variants that change B, Tq or Tk cannot run: the
// sentence says so instead of "every shape tried"; mask off is tried.
TEST(Localize, MaskFileVariantsThatCannotRunAreSaidPlainly) {
  const CaseResult r = run_core("uncatalogued_scale_after_softmax", "{B: 2, H: 3, Tq: 5, Tk: 7, d: 4}",
                                "    causal: false\n    mask: " HEADGRAD_SOURCE_ROOT
                                "/configs/masks/padding_B2_Tq5_Tk7.npy\n");
  ASSERT_EQ(r.status, CaseStatus::fail) << r.cause;
  const Localization& loc = *r.localization;
  EXPECT_EQ(loc.sentence.find("every shape tried"), std::string::npos) << loc.sentence;
  EXPECT_NE(loc.sentence.find("Could not run: B = 1"), std::string::npos) << loc.sentence;
  EXPECT_NE(loc.sentence.find("the mask file fixes B, Tq and Tk"), std::string::npos) << loc.sentence;
  bool mask_off_ran = false;
  for (const auto& row : loc.rows)
    if (row.change == "mask off") mask_off_ran = row.status == CaseStatus::fail;
  EXPECT_TRUE(mask_off_ran);  // the bug does not need the mask
}

// The default suite's edge cases (a decode step, Tq > Tk, a fully masked row,
// large logits) catch and name the bugs that hide anywhere else: each mutant
// put in place of fused_sdpa / batched in the default suite's core cases.
TEST_F(Analysis, DefaultSuiteCatchesAndNamesTheEdgeCaseBugs) {
  const Suite suite = load_suite(HEADGRAD_SOURCE_ROOT "/configs/default.yaml");
  for (const std::string bug : {"mask_fill_finite", "softmax_no_max_subtraction", "causal_alignment", "mask_ignored"}) {
    std::size_t caught = 0, named = 0;
    for (CaseSpec c : suite.cases) {
      // (RoPE cases included: the mutants rotate the one right way for bugs outside RoPE)
      if (c.level != Level::core || c.is_reference()) continue;
      c.compare = {"mutant_" + bug, "per_head"};
      const CaseResult r = check_case(c, *registry_, {});
      if (r.status == CaseStatus::pass) continue;
      ++caught;
      if (r.diagnosis && r.diagnosis->best() == bug) ++named;
      else ADD_FAILURE() << bug << " caught by " << c.name << " but not named: "
                         << (r.diagnosis ? r.diagnosis->sentence : r.cause);
    }
    EXPECT_GT(caught, 0u) << bug << " passes the default suite";
    EXPECT_EQ(named, caught) << bug;
  }
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
  EXPECT_TRUE(warns(ws, "no core case has Tq != Tk", "causal_alignment"));
  EXPECT_TRUE(warns(ws, "no case has a query row whose keys are all masked", "mask_fill_finite"));
  EXPECT_TRUE(warns(ws, "no case has logits past exp's range (a large scale)", "softmax_no_max_subtraction"));
  EXPECT_FALSE(ws.empty());
  // each goes away with the case that covers it
  const auto covered = warnings_for(
      "  - {name: a, compare: [per_head, batched], level: core, causal: bottom_right, scale: 200, "
      "shape: {B: 2, H: 2, Tq: 5, Tk: 3, d: 4}}\n");
  EXPECT_FALSE(warns(covered, "no core case has Tq != Tk", "causal_alignment"));
  EXPECT_FALSE(warns(covered, "no case has a query row whose keys are all masked", "mask_fill_finite"));
  EXPECT_FALSE(warns(covered, "no case has logits past exp's range (a large scale)", "softmax_no_max_subtraction"));
  // 3 * 20 * sqrt(4) = 120 is past float32's 88 but not float64's 709
  const auto f64 = warnings_for("  - {name: a, compare: [per_head, batched], scale: 20, shape: {B: 1, T: 2, D: 4, H: 1}}\n");
  EXPECT_TRUE(warns(f64, "no case has logits past exp's range (a large scale)", "softmax_no_max_subtraction"));
  const auto f32 = warnings_for(
      "  - {name: a, compare: [per_head, batched], dtype: float32, scale: 20, shape: {B: 1, T: 2, D: 4, H: 1}}\n");
  EXPECT_FALSE(warns(f32, "no case has logits past exp's range (a large scale)", "softmax_no_max_subtraction"));
  bool gradients = false, contiguous = false;
  for (const auto& w : ws) {
    gradients = gradients || w.condition == "no case checks a gradient";
    contiguous = contiguous || w.condition == "every input is contiguous";
  }
  EXPECT_TRUE(gradients);
  EXPECT_TRUE(contiguous);
}

// A mask file's rows are read: only a row of False counts as fully masked.
TEST(WeakSuite, FullyMaskedRowIsReadFromTheMaskFile) {
  auto warns_for_mask = [](const std::string& mask) {
    const std::filesystem::path file =
        std::filesystem::temp_directory_path() / ("headgrad_weak_mask_" + std::to_string(::getpid()) + ".yaml");
    std::ofstream(file) << "suite: m\ncases:\n  - {name: a, compare: [per_head, batched], level: core, causal: false, "
                           "mask: " HEADGRAD_SOURCE_ROOT "/configs/masks/" + mask + ", shape: {B: 2, H: 2, Tq: " +
                               (mask[0] == 'e' ? "4, Tk: 6" : "5, Tk: 7") + ", d: 4}}\n";
    const Suite s = load_suite(file);
    std::filesystem::remove(file);
    return warns(weak_suite_warnings({&s.cases.at(0)}), "no case has a query row whose keys are all masked",
                 "mask_fill_finite");
  };
  EXPECT_FALSE(warns_for_mask("empty_row_B2_Tq4_Tk6.npy"));
  EXPECT_TRUE(warns_for_mask("padding_B2_Tq5_Tk7.npy"));  // padding and holes, every row keeps a key
}

TEST(WeakSuite, DefaultSuiteHasNoBlindSpot) {
  const Suite s = load_suite(HEADGRAD_SOURCE_ROOT "/configs/default.yaml");
  std::vector<const CaseSpec*> ptrs;
  for (const auto& c : s.cases) ptrs.push_back(&c);
  const auto ws = weak_suite_warnings(ptrs);
  for (const auto& w : ws) ADD_FAILURE() << w.message;
}

TEST(WeakSuite, GroupedKvBlindSpots) {
  const std::string pair = "compare: [per_head, batched], causal: true, ";
  // MHA and MQA only: the tile mapping (h mod Hkv) equals h / G at both
  auto ws = warnings_for("  - {name: a, " + pair + "shape: {B: 2, T: 5, D: 24, H: 12, Hkv: 1, d: 10}}\n"
                         "  - {name: b, " + pair + "shape: {B: 2, T: 5, D: 24, H: 12, Hkv: 12, d: 10}}\n");
  EXPECT_TRUE(warns(ws, "every grouped-kv case has Hkv = 1 or Hkv = H", "kv_map_tile"));
  EXPECT_TRUE(warns(ws, "every grouped-kv case has Hkv = 1 or Hkv = H", "kv_group_wrong_divisor"));
  EXPECT_FALSE(warns(ws, "every grouped-kv case has Hkv = 1 or Hkv = H", "kv_grad_averaged"));  // seen at Hkv = 1
  // G = 1 only: no group, so no group gradient
  ws = warnings_for("  - {name: a, " + pair + "shape: {B: 2, T: 5, D: 24, H: 12, Hkv: 12, d: 10}}\n");
  EXPECT_TRUE(warns(ws, "every grouped-kv case has Hkv = H (G = 1)", "kv_grad_averaged"));
  EXPECT_TRUE(warns(ws, "every grouped-kv case has Hkv = H (G = 1)", "kv_grad_not_accumulated"));
  // 4/2 and 64/8, the shapes people test: h / Hkv = h / G
  ws = warnings_for("  - {name: a, " + pair + "shape: {B: 3, T: 5, D: 16, H: 4, Hkv: 2}}\n"
                    "  - {name: b, " + pair + "shape: {B: 3, T: 5, D: 128, H: 64, Hkv: 8, d: 2}}\n");
  EXPECT_TRUE(warns(ws, "every grouped-kv case has H = Hkv^2 (G = Hkv)", "kv_group_wrong_divisor"));
  EXPECT_FALSE(warns(ws, "every grouped-kv case has Hkv = 1 or Hkv = H", "kv_map_tile"));
  // B = Hkv
  ws = warnings_for("  - {name: a, " + pair + "shape: {B: 3, T: 5, D: 24, H: 12, Hkv: 3, d: 10}}\n");
  bool batch = false;
  for (const auto& w : ws) {
    batch = batch || w.condition == "every grouped-kv case has B equal to H or Hkv";
    EXPECT_EQ(w.condition.find("H = Hkv^2"), std::string::npos) << w.message;
    EXPECT_EQ(w.condition.find("Hkv = 1 or"), std::string::npos) << w.message;
  }
  EXPECT_TRUE(batch);
  // the shape that hides nothing warns of nothing grouped; suites without Hkv are not judged
  for (const std::string& yaml : {"  - {name: a, " + pair + "shape: {B: 2, T: 7, D: 24, H: 12, Hkv: 3, d: 10}}\n",
                                 "  - {name: a, " + pair + "shape: {B: 2, T: 7, D: 24, H: 12}}\n"})
    for (const auto& w : warnings_for(yaml)) EXPECT_EQ(w.condition.find("grouped-kv"), std::string::npos) << w.message;
}

// At the core level k and v may have Hkv heads: the hypotheses widen them too,
// so a core bug in a grouped case is still named.
TEST_F(Analysis, CoreGroupedKvCaseIsDiagnosed) {
  const std::string yaml = "suite: t\ncases:\n  - name: c\n    level: core\n    compare: [mutant_scale_one_over_d, per_head]\n"
                           "    shape: {B: 2, H: 12, Hkv: 3, Tq: 5, Tk: 7, d: 10}\n    causal: true\n";
  const CaseResult r = check_case(parse_suite(yaml, "analysis.yaml").cases.at(0), *registry_, {});
  ASSERT_EQ(r.status, CaseStatus::fail) << r.cause;
  ASSERT_TRUE(r.diagnosis);
  EXPECT_EQ(r.diagnosis->best(), "scale_one_over_d");
  // the grouped-kv hypotheses are considered at the core level, and none fits a bug of the scale
  for (const auto& f : r.diagnosis->fits) EXPECT_NE(f.bug.rfind("kv_", 0), 0u) << f.bug;
  for (const auto& f : r.diagnosis->near) EXPECT_NE(f.bug.rfind("kv_", 0), 0u) << f.bug;
}

// A grouped-kv bug in a core kernel (k and v with Hkv heads) is named, not just caught.
TEST_F(Analysis, CoreGroupedKvBugIsNamed) {
  for (const char* bug : {"kv_map_tile", "kv_group_wrong_divisor", "kv_grad_not_accumulated", "kv_grad_averaged"}) {
    SCOPED_TRACE(bug);
    const std::string yaml = "suite: t\ncases:\n  - name: c\n    level: core\n    compare: [mutant_" + std::string(bug) +
                             ", per_head]\n    shape: {B: 2, H: 12, Hkv: 3, Tq: 5, Tk: 7, d: 10}\n    causal: true\n";
    const CaseResult r = check_case(parse_suite(yaml, "analysis.yaml").cases.at(0), *registry_, {});
    ASSERT_EQ(r.status, CaseStatus::fail) << r.cause;
    ASSERT_TRUE(r.diagnosis);
    EXPECT_EQ(r.diagnosis->best(), bug);
    ASSERT_EQ(r.diagnosis->fits.size(), 1u) << r.diagnosis->sentence;
  }
}

// Grouped kv heads: localization re-runs at Hkv = H and Hkv = 1.
TEST_F(Analysis, GroupedKvBugsLocalizeToTheirKvHeadCounts) {
  // the tiled mapping equals h / G when there is one kv head or one per query head
  const CaseResult tile = run_grouped("mutant_kv_map_tile");
  ASSERT_EQ(tile.status, CaseStatus::fail);
  EXPECT_EQ(row_status(*tile.localization, "Hkv = H (G = 1)"), CaseStatus::pass);
  EXPECT_EQ(row_status(*tile.localization, "Hkv = 1"), CaseStatus::pass);
  EXPECT_TRUE(has(tile.localization->depends_on, "G"));
  EXPECT_TRUE(has(tile.localization->depends_on, "Hkv"));
  EXPECT_EQ(tile.diagnosis->best(), "kv_map_tile");
  // a group gradient needs a group, and shows with one kv head
  const CaseResult mean = run_grouped("mutant_kv_grad_averaged");
  ASSERT_EQ(mean.status, CaseStatus::fail);
  EXPECT_EQ(row_status(*mean.localization, "Hkv = H (G = 1)"), CaseStatus::pass);
  EXPECT_EQ(row_status(*mean.localization, "Hkv = 1"), CaseStatus::fail);
  EXPECT_TRUE(has(mean.localization->independent_of, "Hkv"));
  EXPECT_NE(mean.localization->sentence.find("G = 1"), std::string::npos) << mean.localization->sentence;
  EXPECT_EQ(mean.diagnosis->best(), "kv_grad_averaged");
  // out, dWq and dWo agree (= X = X X =); dWk's error sits in every kv head
  for (const auto& t : mean.tensors)
    EXPECT_EQ(t.allclose, t.name == "out" || t.name == "dwq" || t.name == "dwo") << t.name;
  for (const auto& s : mean.localization->spread) {
    if (s.tensor != "dwk") continue;
    EXPECT_EQ(s.per_head.size(), 3u);
  }
}

// The tile mapping is named with the evidence of a re-run: the failing plugin
// with its query heads in tile order (Wq row blocks, Wo column blocks) computes
// the correct attention. A grouped-kv bug that is not a tile mapping is re-run
// too and does not match, and no re-run happens without a group.
TEST_F(Analysis, TileMappingIsConfirmedByARerunUnderTheTilePermutation) {
  const CaseResult tile = run_grouped("mutant_kv_map_tile");
  ASSERT_EQ(tile.status, CaseStatus::fail);
  ASSERT_TRUE(tile.diagnosis);
  EXPECT_EQ(tile.diagnosis->best(), "kv_map_tile");
  ASSERT_EQ(tile.diagnosis->evidence.size(), 1u);
  const std::string& why = tile.diagnosis->evidence[0];
  EXPECT_EQ(why.rfind("re-run of mutant_kv_map_tile with its query heads in tile order", 0), 0u) << why;
  EXPECT_NE(why.find("matches the correct attention"), std::string::npos) << why;
  EXPECT_NE(tile.diagnosis->sentence.find("Evidence: re-run of mutant_kv_map_tile"), std::string::npos)
      << tile.diagnosis->sentence;
  for (const char* other : {"mutant_kv_group_wrong_divisor", "mutant_kv_interleaved_head_slices", "mutant_kv_grad_averaged"}) {
    SCOPED_TRACE(other);
    const CaseResult r = run_grouped(other);
    ASSERT_EQ(r.status, CaseStatus::fail);
    ASSERT_TRUE(r.diagnosis);
    EXPECT_EQ("mutant_" + r.diagnosis->best(), other);
    ASSERT_EQ(r.diagnosis->evidence.size(), 1u);
    EXPECT_NE(r.diagnosis->evidence[0].find("does not match the correct attention"), std::string::npos)
        << r.diagnosis->evidence[0];
    EXPECT_EQ(r.diagnosis->evidence[0].find("matches the correct"), std::string::npos);
  }
  const CaseResult plain = run_pair("mutant_merge_without_transpose");  // H 2, Hkv = H
  ASSERT_TRUE(plain.diagnosis);
  EXPECT_TRUE(plain.diagnosis->evidence.empty());
}

}  // namespace

namespace {

// configs/mutants.yaml, run once through the program (it is this file's
// longest part) for both tests below: its terminal gives the mutation score,
// its JSON report, read back as `headgrad merge` reads it (the report schema,
// round-tripped field by field in test_report_schema), shows every mutant
// caught and named, judged against per_head, and its HTML report is the page
// a reader opens.
class MutantsSuiteCli : public ::testing::Test {
 protected:
  struct Run {
    Suite suite = load_suite(HEADGRAD_SOURCE_ROOT "/configs/mutants.yaml");
    int exit_code = -1;
    std::string terminal, html;
    SuiteResult result;
  };

  static void SetUpTestSuite() {
    const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                                      ("headgrad_mutants_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string cmd = std::string(HEADGRAD_EXE) + " run " HEADGRAD_SOURCE_ROOT "/configs/mutants.yaml --json " +
                            (dir / "report.json").string() + " --html " + (dir / "report.html").string() + " 2>&1";
    run_ = new Run();
    if (FILE* pipe = popen(cmd.c_str(), "r")) {
      char buf[4096];
      while (std::size_t n = fread(buf, 1, sizeof buf, pipe)) run_->terminal.append(buf, n);
      const int status = pclose(pipe);
      run_->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    if (std::filesystem::exists(dir / "report.json"))
      run_->result = merge_shard_reports({dir / "report.json"});  // a whole run is shard 1/1
    std::ifstream html(dir / "report.html");
    run_->html.assign(std::istreambuf_iterator<char>(html), {});
    std::filesystem::remove_all(dir);
  }
  static void TearDownTestSuite() {
    delete run_;
    run_ = nullptr;
  }

  static inline Run* run_ = nullptr;
};

TEST_F(MutantsSuiteCli, CatchesAndNamesEveryMutantWithAFullMutationScore) {
  ASSERT_EQ(run_->exit_code, 0) << run_->terminal;
  EXPECT_NE(run_->terminal.find("mutation score: 87/87 mutants caught (100%), 87/87 named correctly (100%)"),
            std::string::npos)
      << run_->terminal;
  EXPECT_NE(run_->terminal.find("87 passed, 0 failed"), std::string::npos) << run_->terminal;

  const SuiteResult& result = run_->result;
  const MutationScore score = result.mutation_score();
  EXPECT_EQ(score.mutants, run_->suite.cases.size());
  EXPECT_EQ(score.caught, score.mutants);
  EXPECT_EQ(score.named, score.mutants);
  EXPECT_EQ(result.exit_code(), 0);
  ASSERT_EQ(result.cases.size(), run_->suite.cases.size());
  for (const auto& c : result.cases) {
    ASSERT_TRUE(c.diagnosis.has_value()) << c.spec.name;
    EXPECT_EQ(c.diagnosis->best(), c.spec.expect_diagnosis);
    EXPECT_EQ(c.diagnosis->judged_side, c.mutant);
    EXPECT_EQ(c.diagnosis->correct_side, "per_head") << c.spec.name;
  }
}

// The page: self-contained (no URL, no script or style loaded from elsewhere),
// one section per case, each with a heatmap (an <svg>), every expected
// diagnosis named as the best fit, the mutation score. That a browser draws it
// is test_html_report.sh's part, where chromium is installed.
TEST_F(MutantsSuiteCli, HtmlReportIsSelfContainedWithAHeatmapPerCaseAndEveryDiagnosisNamed) {
  const std::string& html = run_->html;
  ASSERT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u) << "no page written";
  for (const char* outside : {"http://", "https://", "<script", "<link", "@import", "url("})
    EXPECT_EQ(html.find(outside), std::string::npos) << "the page holds " << outside;
  ASSERT_EQ(run_->suite.cases.size(), 87u);
  std::size_t sections = 0;
  for (std::size_t at = html.find("<section id=\"case-"); at != std::string::npos; ++sections) {
    const std::size_t next = html.find("<section id=\"case-", at + 1);
    EXPECT_LT(html.find("<svg", at), next) << "no heatmap in section " << sections + 1;
    at = next;
  }
  EXPECT_EQ(sections, run_->suite.cases.size());
  for (const auto& c : run_->suite.cases)
    EXPECT_NE(html.find("class=\"diag-best\">" + c.expect_diagnosis + "<"), std::string::npos)
        << c.name << ": the page does not name " << c.expect_diagnosis;
  EXPECT_NE(html.find("mutation score"), std::string::npos);
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
  EXPECT_TRUE(warns(weak, "every RoPE case has theta 10000 (a base hard-coded at 10000 agrees)", "rope_wrong_theta"));
  EXPECT_TRUE(warns(weak, "no RoPE attention case has per-row positions with B apart from H and Hkv",
                    "rope_positions_wrong_axis"));
  // per-row positions, but B = H = 2: a broadcast onto the head axis fits by chance
  EXPECT_TRUE(has_condition(warnings_for("  - {name: a, compare: [per_head, batched], shape: {B: 2, T: 4, D: 8, H: 2}, "
                                         "rope: {positions: {generator: reversed, start: 9}}}\n"),
                            "no RoPE attention case has per-row positions"));
  EXPECT_FALSE(has_condition(weak, "no RoPE case has rotary_dim < d"));  // r = 2 < d = 4 is partial
  EXPECT_TRUE(warns(warnings_for("  - {name: a, compare: [per_head, batched], shape: {B: 2, T: 4, D: 8, H: 2}, "
                                 "rope: {rotary_dim: 4, theta: 500000.0}}\n"),
                    "no RoPE case has rotary_dim < d (partial rotary)", "rope_partial_wrong_span"));

  // each blind spot closed by one case: T > 1 and r = 4 < d = 8 with gapped rows reaching 1000 at
  // B = 3 != H, theta 500000, and taps
  const auto strong = warnings_for(
      "  - {name: a, compare: [per_head, batched], shape: {B: 3, T: 4, D: 16, H: 2}, causal: true, "
      "rope: {theta: 500000.0, rotary_dim: 4, positions: {generator: gapped, start: 1000}}, taps: [q_rot]}\n");
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

namespace {

// A plugin that declares bool_mask in a suite without a boolean mask: the suite
// cannot catch a plugin that ignores spec.mask. Mutants (which all declare it)
// do not count; one mask case anywhere silences it.
TEST(WeakSuite, DeclaredMaskWithoutAMaskCase) {
  PluginRegistry reg;
  reg.load_directories(plugin_search_path({RUNNER_TEST_PLUGIN_DIR}));
  auto capability = [&](const std::string& cases_yaml) {
    static Suite keep;
    keep = parse_suite("suite: w\ncases:\n" + cases_yaml, HEADGRAD_SOURCE_ROOT "/configs/w.yaml");
    std::vector<const CaseSpec*> ptrs;
    for (const auto& c : keep.cases) ptrs.push_back(&c);
    return capability_warnings(ptrs, reg);
  };
  const auto no_mask = capability("  - {name: a, compare: [batched, per_head], shape: {B: 2, T: 3, D: 8, H: 2}}\n");
  ASSERT_EQ(no_mask.size(), 1u);
  EXPECT_EQ(no_mask[0].condition, "no case has a boolean mask, though batched, per_head declare bool_mask");
  EXPECT_EQ(no_mask[0].bugs, std::vector<std::string>{"mask_ignored"});
  EXPECT_NE(no_mask[0].message.find("so it cannot catch mask_ignored"), std::string::npos) << no_mask[0].message;
  EXPECT_TRUE(capability("  - {name: a, compare: [mutant_no_scale, mutant_kv_swapped], shape: {B: 2, T: 3, D: 8, H: 2}}\n")
                  .empty());
  EXPECT_TRUE(capability("  - {name: a, compare: [batched, per_head], shape: {B: 2, T: 3, D: 8, H: 2}}\n"
                         "  - {name: m, level: core, causal: false, compare: [batched, per_head], mask: "
                         "masks/padding_B2_Tq5_Tk7.npy, shape: {B: 2, H: 2, Tq: 5, Tk: 7, d: 4}}\n")
                  .empty());
  // run_suite reports it beside the shape warnings
  const Suite one = parse_suite("suite: w\ncases:\n  - {name: a, compare: [batched, per_head], shape: {B: 2, T: 3, D: 8, H: 2}}\n",
                                "w.yaml");
  const SuiteResult r = run_suite(one, reg, {});
  EXPECT_TRUE(std::any_of(r.warnings.begin(), r.warnings.end(), [](const WeakSuiteWarning& w) {
    return w.condition == "no case has a boolean mask, though batched, per_head declare bool_mask";
  }));
}

}  // namespace

}  // namespace test_runner_analysis
