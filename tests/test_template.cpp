// `headgrad new-plugin NAME DIR` (tools/template): NAME checked as a C
// identifier, DIR new or empty, the files written with the name filled in,
// and exit codes through the CLI11 subcommand. That the project builds and its
// suite passes against an installed headgrad is test_install.sh's part.
#include "template/template.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "checks.hpp"

namespace test_template {  // this file's names: test files share unity builds (tests/meson.build)

namespace fs = std::filesystem;
using namespace headgrad::templates;
using headgrad::test::contains;

namespace {

std::size_t count(const std::string& text, const std::string& part) {
  std::size_t n = 0;
  for (std::size_t pos = text.find(part); pos != std::string::npos; pos = text.find(part, pos + 1)) ++n;
  return n;
}

class Scratch : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) /
            ("headgrad_template_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // Runs `new-plugin args...` through a CLI11 app as main.cpp will; returns
  // the exit code and what went to stdout and stderr.
  struct Run {
    int code;
    std::string out, err;
  };
  static Run run_cli(const std::vector<std::string>& args) {
    CLI::App app{"test", "headgrad"};
    int exit_code = -1;
    add_new_plugin_command(app, exit_code);
    std::vector<std::string> argv_s = {"headgrad", "new-plugin"};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<const char*> argv;
    for (const auto& a : argv_s) argv.push_back(a.c_str());
    ::testing::internal::CaptureStdout();
    ::testing::internal::CaptureStderr();
    try {
      app.parse(static_cast<int>(argv.size()), argv.data());
    } catch (const CLI::ParseError& e) {
      exit_code = app.exit(e) == 0 ? 0 : 2;
    }
    Run r{exit_code, ::testing::internal::GetCapturedStdout(), ::testing::internal::GetCapturedStderr()};
    return r;
  }

  fs::path root_;
};

TEST(TemplateNames, CIdentifiers) {
  for (const char* ok : {"myattn", "my_attn", "_x", "A1", "flash2"}) EXPECT_TRUE(is_c_identifier(ok)) << ok;
  for (const char* bad : {"", "1attn", "my-attn", "my attn", "attn.so", "class", "int", "über", "a/b"})
    EXPECT_FALSE(is_c_identifier(bad)) << bad;
}

TEST(TemplateNames, ClassNames) {
  EXPECT_EQ(class_name_for("myattn"), "MyattnAttention");
  EXPECT_EQ(class_name_for("my_flash_attn"), "MyFlashAttnAttention");
  EXPECT_EQ(class_name_for("_x"), "XAttention");
}

TEST_F(Scratch, WritesTheFilesWithTheNameFilledIn) {
  const Run r = run_cli({"my_attn", (root_ / "proj").string()});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "wrote " + (root_ / "proj").string()));
  EXPECT_TRUE(contains(r.out, "headgrad run suite.yaml --plugin-path build"));
  for (const char* f : {"meson.build", "my_attn.cpp", "suite.yaml", "features.yaml", "README.md", "masks/padding_B2_Tq5_Tk7.npy",
                        "masks/empty_row_B2_Tq4_Tk6.npy"})
    EXPECT_TRUE(fs::is_regular_file(root_ / "proj" / f)) << f;

  const std::string meson = headgrad::test::read_text(root_ / "proj" / "meson.build");
  EXPECT_TRUE(contains(meson, "project('my_attn', 'cpp'"));
  EXPECT_TRUE(contains(meson, "dependency('headgrad')"));
  EXPECT_TRUE(contains(meson, "shared_module('my_attn', 'my_attn.cpp'"));

  const std::string src = headgrad::test::read_text(root_ / "proj" / "my_attn.cpp");
  EXPECT_TRUE(contains(src, "i.name = \"my_attn\";"));
  EXPECT_TRUE(contains(src, "class MyAttnAttention final : public Attention"));
  EXPECT_TRUE(contains(src, "HEADGRAD_PLUGIN(MyAttnAttention)"));
  EXPECT_TRUE(contains(src, "CHANGE HERE"));
  // test_install.sh breaks this line on purpose: it must stay unique.
  EXPECT_EQ(count(src, "reshape(transpose(o, 1, 2), {b, t, dm})"), 1u);
  // ... and test_uninstalled_plugin.sh these (a finite fill, no max subtracted, the mask ignored or aligned bottom-right)
  EXPECT_EQ(count(src, "logical_not(attend), -INFINITY)"), 1u);
  EXPECT_EQ(count(src, "return matmul(softmax(masked, -1), v);"), 1u);
  EXPECT_EQ(count(src, "attention_mask(spec, q.size(-2), k.size(-2))"), 1u);
  EXPECT_EQ(count(src, "@NAME@") + count(src, "@CLASS@"), 0u);

  const std::string suite = headgrad::test::read_text(root_ / "proj" / "suite.yaml");
  EXPECT_TRUE(contains(suite, "compare: [my_attn, per_head]"));
  EXPECT_TRUE(contains(suite, "input_layout: transposed"));
  EXPECT_TRUE(contains(suite, "sweep: {B: [1, 2], T: [1, 5, 17], H: [1, 2, 4], D: [24]}"));
  // the edge cases: a decode step, Tq > Tk, a boolean mask, a fully masked row, large logits in both dtypes
  EXPECT_TRUE(contains(suite, "shape: {B: 2, H: 2, Tq: 1, Tk: 7, d: 4}"));
  EXPECT_TRUE(contains(suite, "shape: {B: 2, H: 2, Tq: 6, Tk: 4, d: 4}"));
  EXPECT_TRUE(contains(suite, "mask: masks/padding_B2_Tq5_Tk7.npy"));
  EXPECT_TRUE(contains(suite, "mask: masks/empty_row_B2_Tq4_Tk6.npy"));
  EXPECT_EQ(count(suite, "scale: 2000"), 1u);
  EXPECT_EQ(count(suite, "scale: 200 "), 1u);
  // suite.yaml needs only what the generated plugin declares: no feature key in it
  for (const char* key : {"window:", "softcap:", "sinks:", "qk_norm:", "cross:"})
    EXPECT_FALSE(contains(suite, std::string("    ") + key)) << key;

  // features.yaml: one section per feature of current models, each at the shapes where its bugs show
  const std::string features = headgrad::test::read_text(root_ / "proj" / "features.yaml");
  EXPECT_TRUE(contains(features, "compare: [my_attn, per_head]"));
  EXPECT_TRUE(contains(features, "--filter 'window*'"));
  EXPECT_EQ(count(features, "    window: {left: 3, right: 0}\n"), 2u);   // W = 4 keys, MHA level and a decode step
  EXPECT_TRUE(contains(features, "causal: bottom_right"));
  EXPECT_TRUE(contains(features, "window: {left: 2, right: 1}"));
  EXPECT_TRUE(contains(features, "window: {right: 1}"));
  EXPECT_EQ(count(features, "    softcap: 0.75\n"), 3u);
  EXPECT_EQ(count(features, "    sinks: true\n"), 4u);
  EXPECT_TRUE(contains(features, "shape: {B: 3, H: 6, Hkv: 2, Tq: 9, Tk: 9, d: 8}"));
  EXPECT_TRUE(contains(features, "shape: {B: 2, H: 6, Tq: 5, Tk: 140, d: 8}"));  // past a key tile of 128
  EXPECT_EQ(count(features, "    qk_norm: {axis: head, eps: 1.0e-6, gain: w}\n"), 2u);
  EXPECT_EQ(count(features, "    qk_norm: {axis: model, eps: 1.0e-6, gain: one_plus_w}\n"), 1u);
  EXPECT_EQ(count(features, "    cross: true\n"), 2u);
  EXPECT_TRUE(contains(features, "shape: {B: 2, Tq: 5, Tk: 9, D: 24, H: 6}"));
  EXPECT_EQ(count(features, "mask: masks/empty_row_B2_Tq4_Tk6.npy"), 2u);
  EXPECT_EQ(count(features, "@NAME@") + count(features, "@CLASS@"), 0u);
  // the printed steps run suite.yaml; features.yaml is named after them (a step would fail: the plugin
  // as generated declares none of the features)
  EXPECT_TRUE(contains(r.out, "then change my_attn.cpp where it says CHANGE HERE.\nfeatures.yaml checks"));
  EXPECT_TRUE(contains(r.out, "run features.yaml --plugin-path build --filter 'window*'\n"));
  EXPECT_TRUE(contains(headgrad::test::read_text(root_ / "proj" / "README.md"), "features.yaml"));
  EXPECT_TRUE(contains(src, "c.cross_attention (spec.x_kv)"));
}

TEST_F(Scratch, AnEmptyFolderIsAccepted) {
  fs::create_directories(root_ / "empty");
  EXPECT_EQ(run_cli({"myattn", (root_ / "empty").string()}).code, 0);
  EXPECT_TRUE(fs::is_regular_file(root_ / "empty" / "myattn.cpp"));
}

TEST_F(Scratch, AnInvalidNameIsUsageErrorAndWritesNothing) {
  for (const char* bad : {"my-attn", "9lives", "class"}) {
    const Run r = run_cli({bad, (root_ / "p").string()});
    EXPECT_EQ(r.code, 2) << bad;
    EXPECT_TRUE(contains(r.err, std::string("NAME '") + bad + "' is not a valid C identifier"));
    EXPECT_FALSE(fs::exists(root_ / "p"));
  }
}

TEST_F(Scratch, ABuiltinPluginNameIsRefused) {
  const Run r = run_cli({"per_head", (root_ / "p").string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "plugin headgrad ships"));
}

TEST_F(Scratch, ANonEmptyFolderIsRefusedAndLeftAlone) {
  fs::create_directories(root_ / "full");
  std::ofstream(root_ / "full" / "keep.txt") << "mine";
  const Run r = run_cli({"myattn", (root_ / "full").string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "is not empty"));
  EXPECT_EQ(headgrad::test::read_text(root_ / "full" / "keep.txt"), "mine");
  EXPECT_FALSE(fs::exists(root_ / "full" / "myattn.cpp"));
}

TEST_F(Scratch, AFileAsDirIsRefused) {
  std::ofstream(root_ / "file") << "x";
  const Run r = run_cli({"myattn", (root_ / "file").string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "is not a folder"));
}

TEST_F(Scratch, MissingArgumentsAreUsageErrors) {
  EXPECT_EQ(run_cli({"myattn"}).code, 2);
}

}  // namespace

}  // namespace test_template
