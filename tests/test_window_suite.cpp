// Sliding windows, soft-capping and sinks in suites (docs/design.md, "YAML
// suite"): the keys read and refused with FILE:LINE:COL, sweeps over the
// window and the cap, the sinks input drawn after every other one, a
// reference's sinks.npy and dsinks.npy, dsinks in the check list, reports and
// where-lines, a plugin refused with the reason, and end-to-end runs whose
// results are checked against the features being on.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <headgrad/npy.hpp>

#include "case/axes.hpp"
#include "case/inputs.hpp"
#include "case/suite.hpp"
#include "headgrad_cli.hpp"

namespace test_window_suite {  // this file's names: test files share unity builds (tests/meson.build)

namespace {

using namespace headgrad;
using namespace headgrad::runner;
namespace fs = std::filesystem;

Suite parse(const std::string& yaml) { return parse_suite(yaml, "t.yaml"); }

std::string error_of(const std::string& yaml) {
  try {
    parse(yaml);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const std::string kHead = "suite: t\ncases:\n  - name: c\n    compare: [per_head, fused_sdpa]\n";

TEST(WindowSuite, ReadsTheThreeKeys) {
  const Suite s = parse(kHead + "    shape: {B: 2, T: 11, D: 24, H: 6, Hkv: 2, d: 4}\n"
                                "    window: {left: 3, right: 0}\n    softcap: 0.75\n    sinks: true\n");
  const CaseSpec& c = s.cases.at(0);
  ASSERT_TRUE(c.window.left && c.window.right);
  EXPECT_EQ(*c.window.left, 3);
  EXPECT_EQ(*c.window.right, 0);
  EXPECT_DOUBLE_EQ(c.softcap, 0.75);
  EXPECT_TRUE(c.sinks);
  // dsinks joins the level's tensors and the default check list
  EXPECT_EQ(c.check.back(), "dsinks");
  EXPECT_EQ(describe_case(c), "MHA(B=2,T=11,D=24,H=6,Hkv=2,window=l3/r0,softcap=0.75,sinks)");
}

TEST(WindowSuite, OneBoundIsEnoughAndDefaultsApply) {
  const Suite s = parse("suite: t\ndefaults: {sinks: true, check: [out, dq]}\ncases:\n"
                        "  - {name: c, level: core, compare: [per_head, batched], shape: {B: 1, H: 2, Tq: 3, Tk: 5, d: 4},"
                        " window: {right: 1}}\n"
                        "  - {name: r, level: rope, compare: [per_head, batched], shape: {B: 1, T: 3, d: 4}, rope: {}}\n");
  const CaseSpec& c = s.cases.at(0);
  EXPECT_FALSE(c.window.left.has_value());
  EXPECT_EQ(*c.window.right, 1);
  EXPECT_TRUE(c.sinks);
  EXPECT_EQ(c.check, (std::vector<std::string>{"out", "dq", "dsinks"}));  // a gradient list from the defaults brings dsinks
  EXPECT_FALSE(s.cases.at(1).sinks);  // a default does not reach the rope level
}

TEST(WindowSuite, ErrorsNameTheKeyAndItsPlace) {
  const std::string shape = "    shape: {B: 2, T: 4, D: 8, H: 2}\n";
  EXPECT_TRUE(contains(error_of(kHead + shape + "    window: {left: -1}\n"), "t.yaml:6:20: case 'c': 'window: left' must be >= 0, got -1"))
      << error_of(kHead + shape + "    window: {left: -1}\n");
  EXPECT_TRUE(contains(error_of(kHead + shape + "    window: {}\n"), "t.yaml:6:13: case 'c': 'window' is empty"));
  EXPECT_TRUE(contains(error_of(kHead + shape + "    window: 4\n"), "t.yaml:6:13: case 'c': 'window' must be a map {left: L, right: R}"));
  EXPECT_TRUE(contains(error_of(kHead + shape + "    window: {lft: 3}\n"), "unknown key 'lft' in 'window' (did you mean 'left'?)"));
  EXPECT_TRUE(contains(error_of(kHead + shape + "    window: {left: 2.5}\n"), "'window: left' must be an integer, got '2.5'"));
  EXPECT_TRUE(contains(error_of(kHead + shape + "    softcap: 0\n"), "t.yaml:6:14: case 'c': 'softcap' must be > 0"));
  EXPECT_TRUE(contains(error_of(kHead + shape + "    softcap: big\n"), "'softcap' must be a finite number, got 'big'"));
  EXPECT_TRUE(contains(error_of(kHead + shape + "    sinks: maybe\n"), "t.yaml:6:12: case 'c': 'sinks' must be true or false, got 'maybe'"));
  EXPECT_TRUE(contains(error_of("suite: t\ncases:\n  - {name: r, level: rope, compare: [per_head, batched], shape: {B: 1, T: 3, d: 4}, "
                                "rope: {}, softcap: 2}\n"),
                       "'softcap' means nothing at the rope level"));
  EXPECT_TRUE(contains(error_of(kHead + shape + "    sinkz: true\n"), "unknown key 'sinkz' in the case (did you mean 'sinks'?)"));
}

TEST(WindowSuite, SweepsOverTheWindowAndTheCap) {
  const Suite s = parse(kHead + "    shape: {B: 2, T: 11, D: 24, H: 6}\n"
                                "    sweep: {window_left: [0, 3], softcap: [1, 50]}\n");
  ASSERT_EQ(s.cases.size(), 4u);
  EXPECT_EQ(s.cases[0].name, "c[window_left=0,softcap=1]");
  EXPECT_EQ(*s.cases[0].window.left, 0);
  EXPECT_DOUBLE_EQ(s.cases[0].softcap, 1);
  EXPECT_EQ(*s.cases[3].window.left, 3);
  EXPECT_DOUBLE_EQ(s.cases[3].softcap, 50);
  EXPECT_TRUE(contains(error_of(kHead + "    shape: {B: 2, T: 4, D: 8, H: 2}\n    sweep: {softcap: [0]}\n"),
                       "'softcap' must be a positive integer (a sweep's caps are whole numbers), got 0"));
  EXPECT_TRUE(contains(error_of(kHead + "    shape: {B: 2, T: 4, D: 8, H: 2, window_left: 3}\n"), "unknown dim 'window_left'"));
}

TEST(WindowSuite, APluginWithoutTheCapabilityIsRefusedWithTheReason) {
  const Suite s = parse(kHead + "    shape: {B: 2, T: 4, D: 8, H: 2}\n    window: {left: 1}\n    softcap: 2\n    sinks: true\n");
  Capabilities caps;
  caps.mha = caps.core = caps.causal = caps.float64 = true;
  const auto missing = missing_capabilities(s.cases.at(0), caps);
  ASSERT_EQ(missing.size(), 3u);
  EXPECT_EQ(missing[0].first, "window");
  EXPECT_EQ(missing[1].first, "softcap");
  EXPECT_EQ(missing[2].first, "sinks");
  EXPECT_TRUE(contains(missing[2].second, "'sinks: true'"));
}

// Sinks come after every other input: a case keeps every value it had without them.
TEST(WindowSuite, SinksAreDrawnAfterEveryOtherInput) {
  Dims d;
  d.B = 2;
  d.T = 5;
  d.D = 12;
  d.H = 3;
  const CaseInputs plain = seeded_inputs(Level::mha, d, DType::float64, 7, true);
  const CaseInputs with = seeded_inputs(Level::mha, d, DType::float64, 7, true, {}, 0, true);
  for (const InputField& f : kInputFields) {
    const Tensor &a = plain.*f.member, &b = with.*f.member;
    if (f.name == "sinks") continue;
    ASSERT_EQ(a.defined(), b.defined()) << f.name;
    if (a.defined()) {
      EXPECT_EQ(a.to_vector(), b.to_vector()) << f.name;
    }
  }
  EXPECT_FALSE(plain.sinks.defined());
  ASSERT_EQ(with.sinks.shape(), (Shape{3}));
  for (double v : with.sinks.to_vector()) {
    EXPECT_GE(v, -1.0);
    EXPECT_LT(v, 3.0);
  }
  const auto v = with.sinks.to_vector();
  EXPECT_NE(v[0], v[1]);  // distinct per head
  // the core level too
  d.Tq = 4;
  d.Tk = 6;
  d.d = 4;
  EXPECT_EQ(seeded_inputs(Level::core, d, DType::float64, 7, false, {}, 0, true).sinks.shape(), (Shape{3}));
}

TEST(WindowSuite, DsinksHasAHeadAxis) {
  EXPECT_EQ(describe_index(Level::mha, "dsinks", {6}, std::vector<std::int64_t>{4}, 6), "head=4");
  EXPECT_EQ(describe_index(Level::core, "dsinks", {6}, std::vector<std::int64_t>{2}, 6), "head=2");
}

// ---- end to end: the program on small suites

class WindowRun : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("headgrad_window_suite_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path write(const std::string& yaml) {
    std::ofstream(dir_ / "s.yaml") << yaml;
    return dir_ / "s.yaml";
  }
  fs::path dir_;
};

// A reference directory written by export holds sinks.npy and dsinks.npy, and
// its suite.yaml states the window and the cap; a run against it passes, and
// the same reference with the window left out of the case fails.
TEST_F(WindowRun, ExportedReferenceCarriesSinksAndTheCaseItsWindow) {
  write("suite: t\ncases:\n  - {name: c, compare: [per_head, fused_sdpa], shape: {B: 2, T: 9, D: 24, H: 6, Hkv: 2, d: 4},"
        " window: {left: 2, right: 0}, softcap: 1.5, sinks: true}\n");
  const fs::path out = dir_ / "ref";
  const test::Outcome e = test::headgrad({"export", (dir_ / "s.yaml").string(), "--case", "c", "--plugin", "per_head",
                                          "--out", out.string()});
  ASSERT_EQ(e.code, 0) << e.out << e.err;
  EXPECT_TRUE(fs::is_regular_file(out / "sinks.npy"));
  EXPECT_TRUE(fs::is_regular_file(out / "dsinks.npy"));
  const std::string suite = test::slurp(out / "suite.yaml");
  EXPECT_TRUE(contains(suite, "window: {left: 2, right: 0}")) << suite;
  EXPECT_TRUE(contains(suite, "softcap: 1.5")) << suite;
  const test::Outcome r = test::headgrad({"run", (out / "suite.yaml").string(), "--json", (dir_ / "r.json").string()});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  const std::string report = test::slurp(dir_ / "r.json");
  EXPECT_TRUE(contains(report, "\"dsinks\"")) << report.substr(0, 400);
  EXPECT_TRUE(contains(report, "\"softcap\": 1.5")) << report.substr(0, 400);
  // the same files, the window left out of the case: the reference disagrees
  std::string no_window = suite;
  no_window.replace(no_window.find("    window: {left: 2, right: 0}\n"), std::string("    window: {left: 2, right: 0}\n").size(), "");
  std::ofstream(out / "suite.yaml") << no_window;
  const test::Outcome f = test::headgrad({"run", (out / "suite.yaml").string()});
  EXPECT_EQ(f.code, 1) << f.out << f.err;
}

// sinks.npy without 'sinks: true' makes a sinks case; 'sinks: false' with it is refused.
TEST_F(WindowRun, ReferenceSinksFileRulesTheCase) {
  write("suite: t\ncases:\n  - {name: c, level: core, compare: [per_head, batched], shape: {B: 1, H: 2, Tq: 3, Tk: 4, d: 4},"
        " sinks: true}\n");
  const fs::path out = dir_ / "ref";
  ASSERT_EQ(test::headgrad({"export", (dir_ / "s.yaml").string(), "--case", "c", "--plugin", "per_head", "--out",
                            out.string()}).code, 0);
  std::ofstream(dir_ / "refuse.yaml") << "suite: t\ncases:\n  - {name: c, level: core, compare: [batched], reference: ref,"
                                          " sinks: false}\n";
  const test::Outcome o = test::headgrad({"run", (dir_ / "refuse.yaml").string()});
  EXPECT_EQ(o.code, 2) << o.out << o.err;
  EXPECT_TRUE(contains(o.err, "sinks.npy gives sinks, but the case says 'sinks: false'")) << o.err;
  std::ofstream(dir_ / "plain.yaml") << "suite: t\ncases:\n  - {name: c, level: core, compare: [fused_sdpa], reference: ref}\n";
  const test::Outcome p = test::headgrad({"run", (dir_ / "plain.yaml").string(), "-v"});
  EXPECT_EQ(p.code, 0) << p.out << p.err;
  EXPECT_TRUE(contains(p.out, "dsinks")) << p.out;
}

// C ABI 3: naive_c (tests/c_plugin) implements the window, the cap and the
// sinks in C and agrees with fused_sdpa on them (tests/c_plugin/c_vs_fused.yaml's
// C ABI 3 cases); naive_c_v1, built against C ABI 1, is refused them.
TEST_F(WindowRun, ACPluginOfCAbi3AgreesAndAnOldOneIsRefused) {
  const test::Outcome o = test::headgrad({"run", std::string(HEADGRAD_SOURCE_ROOT) + "/tests/c_plugin/c_vs_fused.yaml",
                                          "--filter", "window*", "--plugin-path", C_PLUGIN_DIR, "-v"});
  EXPECT_EQ(o.code, 0) << o.out << o.err;
  EXPECT_TRUE(contains(o.out, "dsinks")) << o.out;
  write("suite: t\ncases:\n  - {name: c, level: core, compare: [naive_c_v1, per_head], shape: {B: 1, H: 2, Tq: 4, Tk: 4, d: 4},"
        " softcap: 2}\n");
  const test::Outcome v1 = test::headgrad({"run", (dir_ / "s.yaml").string(), "--plugin-path", C_PLUGIN_V1_DIR});
  EXPECT_EQ(v1.code, 2) << v1.out << v1.err;
  EXPECT_TRUE(contains(v1.err, "plugin 'naive_c_v1' lacks the capability 'softcap'")) << v1.err;
}

}  // namespace

}  // namespace test_window_suite
