// What `headgrad new-plugin` writes, judged by the runner: the generated
// suite's edge cases catch and name the bugs that hide everywhere else (each
// mutant put in place of the generated plugin), the generated mask files hold
// the values of headgrad's own, and a project written by the uninstalled
// build/tools/headgrad is pointed at that build. That the generated plugin
// builds, passes, and fails its suite once each bug is written into its
// source is test_uninstalled_plugin.sh's part.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include <headgrad/npy.hpp>

#include "analysis/analyze.hpp"
#include "job/run_suite.hpp"
#include "case/inputs.hpp"
#include "template/template.hpp"

namespace fs = std::filesystem;
using namespace headgrad;
using namespace headgrad::runner;
using namespace headgrad::analysis;

namespace {

class TemplateSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    registry_ = new PluginRegistry();
    registry_->load_directories(plugin_search_path({RUNNER_TEST_PLUGIN_DIR}));
    dir_ = new fs::path(fs::path(::testing::TempDir()) / ("headgrad_template_suite_" + std::to_string(::getpid())));
    fs::remove_all(*dir_);
    templates::write_plugin_project("myattn", *dir_);
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    delete registry_;
  }
  // The generated suite with `plugin` in place of myattn.
  static Suite suite_with(const std::string& plugin) {
    Suite s = load_suite(*dir_ / "suite.yaml");
    for (auto& c : s.cases)
      for (auto& p : c.compare)
        if (p == "myattn") p = plugin;
    return s;
  }
  static PluginRegistry* registry_;
  static fs::path* dir_;
};
PluginRegistry* TemplateSuite::registry_ = nullptr;
fs::path* TemplateSuite::dir_ = nullptr;

TEST_F(TemplateSuite, MaskFilesHoldTheValuesOfHeadgradsOwn) {
  for (const char* f : {"padding_B2_Tq5_Tk7.npy", "empty_row_B2_Tq4_Tk6.npy"}) {
    const Tensor ours = read_npy(*dir_ / "masks" / f);
    const Tensor theirs = read_npy(fs::path(HEADGRAD_SOURCE_ROOT) / "configs" / "masks" / f);
    EXPECT_EQ(ours.dtype(), DType::boolean) << f;
    EXPECT_EQ(ours.shape(), theirs.shape()) << f;
    EXPECT_EQ(ours.to_vector(), theirs.to_vector()) << f;
  }
}

// The template's plugin computes what `batched` computes: with batched in its
// place every case passes, so a failure below is the bug's, not the suite's.
TEST_F(TemplateSuite, PassesWithTheTemplatesOwnComputation) {
  const SuiteResult r = run_suite(suite_with("batched"), *registry_, {});
  EXPECT_EQ(r.exit_code(), 0);
  for (const auto& c : r.cases) EXPECT_EQ(c.status, CaseStatus::pass) << c.spec.name << ": " << c.cause;
  // and it leaves no edge uncovered
  for (const auto& w : r.warnings)
    for (const char* bug : {"mask_fill_finite", "softmax_no_max_subtraction", "causal_alignment", "mask_ignored",
                            "missing_causal_mask", "split_without_transpose", "batch_mixing"})
      EXPECT_EQ(std::find(w.bugs.begin(), w.bugs.end(), bug), w.bugs.end()) << w.message;
}

// The bugs that pass every case but the edge cases: each caught by at least
// one case of the generated suite, and named wherever it is caught.
TEST_F(TemplateSuite, CatchesAndNamesTheEdgeCaseBugs) {
  for (const std::string bug : {"mask_fill_finite", "softmax_no_max_subtraction", "mask_ignored", "causal_alignment"}) {
    const Suite s = suite_with("mutant_" + bug);
    std::size_t caught = 0, named = 0;
    for (const CaseSpec& c : s.cases) {
      const CaseResult r = check_case(c, *registry_, {});
      if (r.status == CaseStatus::pass) continue;
      ++caught;
      if (r.diagnosis && r.diagnosis->best() == bug) ++named;
      else ADD_FAILURE() << bug << " caught by '" << c.name << "' but not named: "
                         << (r.diagnosis ? r.diagnosis->sentence : r.cause);
    }
    EXPECT_GT(caught, 0u) << bug << " passes the template suite";
    EXPECT_EQ(named, caught) << bug;
  }
}

// ---------------------------------------------------------------- uninstalled build

TEST(TemplateSdk, TheBuildsOwnProgramGetsTheBuildsOwnSdk) {
  const templates::SdkLocation sdk = templates::sdk_for_program(HEADGRAD_EXE);
  ASSERT_TRUE(sdk.uninstalled);
  EXPECT_EQ(fs::weakly_canonical(sdk.headgrad), fs::weakly_canonical(HEADGRAD_EXE));
  std::ifstream pc(sdk.pkgconfig_dir / "headgrad.pc");
  ASSERT_TRUE(pc) << sdk.pkgconfig_dir;
  std::stringstream text;
  text << pc.rdbuf();
  // the source tree's SDK headers and this build's library and plugin folder
  EXPECT_NE(text.str().find("includedir=" HEADGRAD_SOURCE_ROOT "/core/include"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("plugindir=" + fs::path(HEADGRAD_EXE).parent_path().parent_path().string() + "/plugins"),
            std::string::npos)
      << text.str();
}

TEST(TemplateSdk, AnyOtherProgramLeavesPkgConfigAlone) {
  // a program outside this build and outside an installation layout
  const templates::SdkLocation sdk = templates::sdk_for_program("/nonexistent/elsewhere/headgrad");
  EXPECT_FALSE(sdk.uninstalled);
  EXPECT_TRUE(sdk.pkgconfig_dir.empty());
  EXPECT_EQ(sdk.headgrad, "headgrad");
}

// The built program says it is an uninstalled build and prints steps that use
// it: its headgrad.pc first on PKG_CONFIG_PATH, itself by path to run the suite.
TEST(TemplateSdk, NewPluginFromTheBuildPrintsStepsAgainstThatBuild) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("headgrad_template_cli_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string cmd = std::string(HEADGRAD_EXE) + " new-plugin myattn " + dir.string() + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  EXPECT_EQ(pclose(pipe), 0) << out;
  fs::remove_all(dir);
  const templates::SdkLocation sdk = templates::sdk_for_program(HEADGRAD_EXE);
  EXPECT_NE(out.find("this headgrad is an uninstalled build (" + sdk.headgrad + ")"), std::string::npos) << out;
  EXPECT_NE(out.find("  export PKG_CONFIG_PATH=" + sdk.pkgconfig_dir.string() + "${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("\n  " + sdk.headgrad + " run suite.yaml --plugin-path build\n"), std::string::npos) << out;
  EXPECT_NE(out.find("masks/empty_row_B2_Tq4_Tk6.npy"), std::string::npos) << out;
}

}  // namespace
