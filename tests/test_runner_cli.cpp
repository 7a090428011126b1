// The real headgrad program: exit codes 0/1/2/3, the misbehaving-plugin
// suite, each malformed input, reports on disk, `plugins` and `export`.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <headgrad/abi.hpp>
#include <headgrad/npy.hpp>
#include <nlohmann/json.hpp>

#include "real_plugins.hpp"
#include "headgrad_cli.hpp"

namespace test_runner_cli {  // this file's names: test files share unity builds (tests/meson.build)

namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = RUNNER_FIXTURES;
const std::string kTestPlugins = RUNNER_TEST_PLUGIN_DIR;

using headgrad::test::headgrad;
using headgrad::test::Outcome;
using headgrad::test::slurp;

bool has_line(const std::string& text, const std::string& line) {
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (l == line) return true;
  return false;
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("headgrad_cli_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // ref/: per_head's tensors for pass.yaml's closed-book case; s.yaml checks per_head against them.
  void export_reference() {
    const Outcome ex = headgrad({"export", (kFixtures / "pass.yaml").string(), "--case", "closed-book", "--out",
                                 (dir_ / "ref").string()});
    ASSERT_EQ(ex.code, 0) << ex.out << ex.err;
    std::ofstream(dir_ / "s.yaml") << "cases:\n  - name: r\n    compare: [per_head]\n    reference: ref\n    causal: true\n"
                                      "    shape: {H: 2}\n";
  }
  fs::path dir_;
};

// A RoPE case exported checks back: its suite.yaml carries the rope block
// (theta, style, rotary_dim) and the taps, its positions.npy the generated
// positions. batched passes it; a base hard-coded at 10000 and a uniform
// position shift (which shows in the taps alone) fail it, so the settings and
// the positions are really read back.
TEST_F(Cli, RopeCaseExportsItsSettingsAndPositions) {
  std::ofstream(dir_ / "rope.yaml")
      << "cases:\n  - {name: rp, compare: [per_head, batched], causal: true, shape: {B: 2, T: 6, D: 12, H: 2, d: 10},"
         " rope: {theta: 500000, style: half, rotary_dim: 6, positions: {generator: gapped, start: 100}},"
         " taps: [q_rot, k_rot]}\n";
  const Outcome ex = headgrad({"export", (dir_ / "rope.yaml").string(), "--case", "rp", "--out", (dir_ / "ref").string()});
  ASSERT_EQ(ex.code, 0) << ex.out << ex.err;
  EXPECT_TRUE(fs::exists(dir_ / "ref" / "positions.npy"));
  std::stringstream exported;
  exported << std::ifstream(dir_ / "ref" / "suite.yaml").rdbuf();
  EXPECT_NE(exported.str().find("rope: {theta: 500000, style: half, rotary_dim: 6}"), std::string::npos) << exported.str();
  EXPECT_NE(exported.str().find("taps: [q_rot, k_rot]"), std::string::npos) << exported.str();
  auto run_against = [&](const std::string& plugin) {
    std::string text = exported.str();
    const std::string from = "compare: [per_head]";
    text.replace(text.find(from), from.size(), "compare: [" + plugin + "]");
    std::ofstream(dir_ / "ref" / "suite.yaml") << text;
    return headgrad({"run", (dir_ / "ref" / "suite.yaml").string()});
  };
  const Outcome back = run_against("batched");
  EXPECT_EQ(back.code, 0) << back.out << back.err;
  for (const std::string mutant : {"mutant_rope_wrong_theta", "mutant_rope_position_shift"}) {
    const Outcome bad = run_against(mutant);
    EXPECT_EQ(bad.code, 1) << mutant << ": " << bad.out << bad.err;
  }
}

// Grouped kv heads end to end: a GQA case passes, exports a reference with
// wk [Hkv*d, D] that checks back, and bad Hkv or a plugin without grouped_kv
// is exit code 2 naming the key or the capability.
TEST_F(Cli, GroupedKvRunsExportsAndRefuses) {
  std::ofstream(dir_ / "g.yaml") << "cases:\n  - {name: g, compare: [per_head, batched], causal: true, "
                                    "shape: {B: 2, T: 7, D: 24, H: 12, Hkv: 3, d: 10}}\n";
  const Outcome run = headgrad({"run", (dir_ / "g.yaml").string()});
  EXPECT_EQ(run.code, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("MHA(B=2,T=7,D=24,H=12,Hkv=3,d=10,causal)"), std::string::npos) << run.out;
  const Outcome ex = headgrad({"export", (dir_ / "g.yaml").string(), "--case", "g", "--out", (dir_ / "ref").string()});
  ASSERT_EQ(ex.code, 0) << ex.out << ex.err;
  std::ofstream(dir_ / "r.yaml") << "cases:\n  - {name: r, compare: [fused_sdpa], reference: ref, causal: true, "
                                    "shape: {H: 12}}\n";
  const Outcome back = headgrad({"run", (dir_ / "r.yaml").string()});
  EXPECT_EQ(back.code, 0) << back.out << back.err;
  EXPECT_NE(back.out.find("MHA(B=2,T=7,D=24,H=12,Hkv=3,d=10,causal)"), std::string::npos) << back.out;

  std::ofstream(dir_ / "bad.yaml") << "cases:\n  - {name: b, compare: [per_head, batched], "
                                      "shape: {B: 2, T: 7, D: 24, H: 12, Hkv: 5}}\n";
  const Outcome bad = headgrad({"run", (dir_ / "bad.yaml").string()});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("bad.yaml:2:84: case 'b': 'Hkv': H=12 is not a multiple of Hkv=5"), std::string::npos)
      << bad.err;
  std::ofstream(dir_ / "cap.yaml") << "cases:\n  - {name: c, compare: [limited, per_head], "
                                      "shape: {B: 2, T: 7, D: 24, H: 12, Hkv: 3}}\n";
  const Outcome cap = headgrad({"run", (dir_ / "cap.yaml").string(), "--plugin-path", kTestPlugins});
  EXPECT_EQ(cap.code, 2);
  EXPECT_NE(cap.err.find("plugin 'limited' lacks the capability 'grouped_kv' (H=12 query heads share Hkv=3 kv heads)"),
            std::string::npos)
      << cap.err;
}

TEST_F(Cli, PassingSuiteExitsZero) {
  const Outcome r = headgrad({"run", (kFixtures / "pass.yaml").string()});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has_line(r.out, "7 passed, 0 failed")) << r.out;
  EXPECT_NE(r.out.find("  OK     closed-book"), std::string::npos);
  EXPECT_NE(r.out.find("CORE(B=2,H=3,Tq=5,Tk=7,d=4,mask)"), std::string::npos);
  EXPECT_EQ(r.out.find("\033["), std::string::npos);  // stdout is not a terminal: no colors
  EXPECT_EQ(r.err, "");                              // nor a progress line
}

TEST_F(Cli, MisbehavingPluginsEveryCaseRunsAndReports) {
  const fs::path json = dir_ / "r.json", junit = dir_ / "r.xml", html = dir_ / "r.html";
  const Outcome r = headgrad({"run", (kFixtures / "misbehaving.yaml").string(), "--plugin-path", kTestPlugins, "--json",
                          json.string(), "--junit", junit.string(), "--html", html.string()});
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"  OK     normal-first", ""},
      {"  ERROR  throws", "plugin throws threw std::runtime_error: deliberate failure in mha_forward"},
      {"  ERROR  throws-core", "plugin throws threw std::runtime_error: deliberate failure in core_forward"},
      {"  ERROR  segfaults", "plugin segfaults crashed with SIGSEGV (segmentation fault)"},
      {"  ERROR  aborts", "plugin aborts crashed with SIGABRT (aborted)"},
      {"  ERROR  hangs", "plugin hangs did not finish within 1 s; killed"},
      {"  FAIL   returns-nan", "plugin returns_nan returned NaN in out at [0, 1, 3] (b=0, t=1, head=0, ch=3)"},
      {"  OK     normal-last", ""},
  };
  std::istringstream in(r.out);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  std::size_t at = 0;  // the cases appear in suite order, each with its cause on its line
  for (const auto& [start, cause] : expected) {
    while (at < lines.size() && lines[at].rfind(start, 0) != 0) ++at;
    ASSERT_LT(at, lines.size()) << "no line for " << start << " in\n" << r.out;
    EXPECT_NE(lines[at].find(cause), std::string::npos) << lines[at];
  }
  EXPECT_TRUE(has_line(r.out, "2 passed, 6 failed")) << r.out;

  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  ASSERT_EQ(j["cases"].size(), 8u);
  EXPECT_EQ(j["summary"]["exit_code"], 3);
  EXPECT_EQ(j["cases"][5]["sides"][0]["status"], "timed_out");
  EXPECT_EQ(j["cases"][5]["sides"][1]["status"], "ok");
  const std::string xml = slurp(junit);
  EXPECT_NE(xml.find("tests=\"8\" failures=\"1\" errors=\"5\""), std::string::npos) << xml;
  EXPECT_NE(xml.find("<error type=\"crashed\" message=\"plugin segfaults crashed with SIGSEGV (segmentation fault)\">"), std::string::npos);
  EXPECT_NE(xml.find("<error type=\"timed_out\" message=\"plugin hangs did not finish within 1 s; killed\">"), std::string::npos);
  EXPECT_NE(slurp(html).find("plugin aborts crashed with SIGABRT (aborted)"), std::string::npos);
}

TEST_F(Cli, ReturnsNanAloneIsAComparisonFailure) {
  const Outcome r = headgrad({"run", (kFixtures / "misbehaving.yaml").string(), "--plugin-path", kTestPlugins,
                          "--filter", "returns-nan"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
}

TEST_F(Cli, TightToleranceExitsOne) {
  const Outcome r = headgrad({"run", (kFixtures / "tight.yaml").string()});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(has_line(r.out, "1 passed, 1 failed")) << r.out;
  EXPECT_NE(r.out.find("  XFAIL  expected-to-fail"), std::string::npos);
}

// The reason an expectation failed is printed in the terminal, under the case.
TEST_F(Cli, UnmetExpectationSaysWhyInTheTerminal) {
  const fs::path suite = fs::temp_directory_path() / ("headgrad_cli_expect_" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(suite) << "suite: e\ncases:\n  - name: wrong-name\n    compare: [mutant_merge_without_transpose, "
                          "per_head]\n    shape: {B: 2, T: 3, D: 8, H: 2}\n    expect: {fail: true, diagnosis: no_scale}\n";
  const Outcome r = headgrad({"run", suite.string()});
  fs::remove(suite);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("\n         not as expected: 6 of 6 tensors differ: out, dx, dwq, dwk, dwv, dwo; expected the "
                       "diagnosis no_scale, got merge_without_transpose\n"),
            std::string::npos)
      << r.out;
}

// The JSON report carries the alignment and what the diagnosis ruled out.
TEST_F(Cli, JsonHoldsTheAlignmentAndTheRuledOutHypotheses) {
  const fs::path dir = fs::temp_directory_path() / ("headgrad_cli_align_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "s.yaml") << "suite: a\ncases:\n  - {name: decode, level: core, causal: true, compare: "
                                   "[mutant_causal_alignment, per_head], shape: {B: 2, H: 2, Tq: 1, Tk: 7, d: 4}}\n"
                                   "  - {name: declared, level: core, causal: bottom_right, compare: "
                                   "[mutant_causal_alignment, per_head], shape: {B: 2, H: 2, Tq: 1, Tk: 7, d: 4}}\n";
  const Outcome r = headgrad({"run", (dir / "s.yaml").string(), "--json", (dir / "r.json").string()});
  const nlohmann::json j = nlohmann::json::parse(slurp(dir / "r.json"));
  fs::remove_all(dir);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  ASSERT_EQ(j["cases"].size(), 2u);
  EXPECT_EQ(j["cases"][0]["causal_alignment"], "top_left");
  EXPECT_EQ(j["cases"][0]["diagnosis"]["best"], "causal_alignment");
  ASSERT_EQ(j["cases"][0]["diagnosis"]["ruled_out"].size(), 2u);
  EXPECT_EQ(j["cases"][0]["diagnosis"]["ruled_out"][0].get<std::string>().rfind("missing_causal_mask (", 0), 0u);
  EXPECT_EQ(j["cases"][1]["causal_alignment"], "bottom_right");
  EXPECT_EQ(j["cases"][1]["status"], "pass");
  EXPECT_EQ(j["cases"][1]["description"], "CORE(B=2,H=2,Tq=1,Tk=7,d=4,causal=bottom_right)");
}

// The tile re-run's evidence is in the JSON diagnosis.
TEST_F(Cli, JsonHoldsTheEvidenceOfTheTileRerun) {
  const fs::path json = fs::temp_directory_path() / ("headgrad_cli_tile_" + std::to_string(::getpid()) + ".json");
  const Outcome r = headgrad({"run", HEADGRAD_SOURCE_ROOT "/configs/mutants.yaml", "--filter", "kv_map_tile", "--json",
                              json.string()});
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  fs::remove(json);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  ASSERT_EQ(j["cases"].size(), 1u);
  EXPECT_EQ(j["cases"][0]["diagnosis"]["best"], "kv_map_tile");
  ASSERT_EQ(j["cases"][0]["diagnosis"]["evidence"].size(), 1u);
  const std::string evidence = j["cases"][0]["diagnosis"]["evidence"][0].get<std::string>();
  EXPECT_NE(evidence.find("re-run of mutant_kv_map_tile with its query heads in tile order"), std::string::npos) << evidence;
  EXPECT_NE(evidence.find("matches the correct attention"), std::string::npos) << evidence;
}

TEST_F(Cli, MissingPluginStopsTheRunBeforeAnyCase) {
  const Outcome r = headgrad({"run", (kFixtures / "missing_plugin.yaml").string(), "--plugin-path", kTestPlugins});
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_EQ(r.out.find("fine"), std::string::npos) << r.out;  // no case ran
  // one message: each missing plugin, the cases that need it, where it was searched, the fix
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("headgrad: error: plugin ghost_plugin is not found (needed by needs-ghost); "
                       "plugin per_haed is not found (did you mean 'per_head'?) (needed by needs-typo); searched: " +
                       std::string(kTestPlugins) + ", "),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("Add the folder that holds it with --plugin-path DIR (or HEADGRAD_PLUGIN_PATH)"),
            std::string::npos)
      << r.err;
}

// Each malformed input: exit 2, FILE:LINE:COL and the reason.
struct BadInput {
  const char* file;
  const char* message;
};

class CliBadInput : public ::testing::TestWithParam<BadInput> {};

TEST_P(CliBadInput, ExitsTwoNamingFileLineAndColumn) {
  const fs::path suite = kFixtures / "bad" / GetParam().file;
  const Outcome r = headgrad({"run", suite.string(), "--plugin-path", kTestPlugins});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  const std::string want = "headgrad: error: " + suite.string() + ":" + GetParam().message;
  EXPECT_NE(r.err.find(want), std::string::npos) << "want: " << want << "\ngot:  " << r.err;
  EXPECT_EQ(r.out, "");  // nothing ran
}

INSTANTIATE_TEST_SUITE_P(
    BadSuites, CliBadInput,
    ::testing::Values(
        BadInput{"malformed.yaml", "5:10: malformed YAML: end of sequence flow not found"},
        BadInput{"unknown_key.yaml", "5:5: case 'typo': unknown key 'dtyp' in the case (did you mean 'dtype'?)"},
        BadInput{"wrong_type.yaml", "5:16: case 'words-for-numbers': 'B' must be an integer, got 'two'"},
        BadInput{"missing_compare.yaml", "3:5: case 'nothing-to-compare': no 'compare' list"},
        BadInput{"one_plugin_no_reference.yaml", "4:14: case 'alone': 'compare' needs two plugins, or one plugin "
                                                 "and a 'reference' directory; got 1 name"},
        BadInput{"d_not_divisible.yaml", "5:16: case 'uneven-heads': D=10 is not divisible by H=4"},
        BadInput{"dropout.yaml", "3:14: case 'with-dropout': dropout_p must be 0 in a comparison, got 0.1: dropout "
                                 "zeroes a random subset of attention weights, so the two sides draw different "
                                 "masks and cannot agree; and a module's eval() does not turn it off in a "
                                 "functional call"},
        BadInput{"capability.yaml", "4:14: case 'needs-causal': plugin 'limited' lacks the capability 'causal' "
                                    "(the case is causal); it declares: mha, float64"},
        BadInput{"mask_missing.yaml", "6:11: case 'no-such-mask': mask file"},
        BadInput{"mask_shape.yaml", "6:11: case 'mask-does-not-fit': mask file"},
        BadInput{"reference_missing.yaml", "5:16: case 'no-such-dir': reference directory"},
        // Sizes: refused before any input is made (the budget is this machine's memory)
        BadInput{"shape_overflow.yaml", "3:5: case 'overflow': MHA(B=2,T=2147483648,D=2147483648,H=2) needs about "
                                        "2.7e+21 bytes of memory (inputs, outputs, gradients and the [B, H, Tq, Tk] "
                                        "score buffers a plugin holds), more elements than 64-bit sizes can count, "
                                        "and more than the budget of"},
        BadInput{"shape_wraps.yaml", "3:5: case 'wraps': MHA(B=4294967296,T=4294967296,D=8,H=2) needs about "
                                     "5.1e+30 bytes of memory"},
        BadInput{"shape_too_big.yaml", "3:5: case 'too-big': MHA(B=10000,T=10000,D=8,H=2) needs about 58.3 TiB of "
                                       "memory"},
        BadInput{"shape_huge.yaml", "3:5: case 'huge': MHA(B=100000,T=100000,D=8,H=2) needs about 56.9 PiB of memory"},
        BadInput{"sweep_explodes.yaml", "8:16: case 'explodes': the sweep expands to 160000 cases (20 x 20 x 20 x 20 "
                                        "values), after 1 case before it, and a suite may hold at most 10000 cases"},
        BadInput{"timeout_negative.yaml", "5:14: case 'negative': 'timeout' must be a number of seconds > 0 and at "
                                          "most 86400 (one day), got -1"},
        BadInput{"duplicate_key.yaml", "5:37: duplicate key 'T' (first at line 5); each key may appear once in a map"},
        BadInput{"two_documents.yaml", "7:1: a second YAML document (after '---'): a suite file holds one document"},
        // found by the suite fuzzer: yaml-cpp 0.7's LoadAll loops forever on it
        BadInput{"loadall_loops.yaml", "2:3: unknown key 'causal' in the suite"},
        BadInput{"timeout_huge.yaml", "5:14: case 'forever': 'timeout' must be a number of seconds > 0 and at most "
                                      "86400 (one day), got 1e+16"}),
    [](const auto& info) {
      std::string n = info.param.file;
      return n.substr(0, n.find('.'));
    });

TEST_F(Cli, MaxMemoryRefusesACaseThatWouldNotFit) {
  // closed-book (B=2, T=3, D=8, H=2, float64) needs 18304 bytes by budget.hpp's estimate
  const std::string suite = (kFixtures / "pass.yaml").string();
  Outcome r = headgrad({"run", suite, "--filter", "closed-book", "--max-memory", "16K"});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("case 'closed-book': MHA(B=2,T=3,D=8,H=2,causal) needs about 17.9 KiB of memory"),
            std::string::npos) << r.err;
  EXPECT_NE(r.err.find("more than the budget of 16.0 KiB (--max-memory 16.0 KiB)"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");  // refused before anything ran
  EXPECT_EQ(headgrad({"run", suite, "--filter", "closed-book", "--max-memory", "18K"}).code, 0);
  r = headgrad({"export", suite, "--case", "closed-book", "--out", (dir_ / "x").string(), "--max-memory", "1K"});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "x"));
  for (const char* bad : {"10X", "-1G", "0", "nan", "G"}) {
    r = headgrad({"run", suite, "--max-memory", bad});
    EXPECT_EQ(r.code, 2) << bad;
    EXPECT_NE(r.err.find("--max-memory: size '" + std::string(bad) + "' is not a positive size"), std::string::npos)
        << r.err;
  }
}

TEST_F(Cli, BenchRefusesAShapeThatCannotFit) {
  const Outcome r = headgrad({"bench", "--shape", "2,2147483648,2147483648,2", "--plugin", "batched"});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("headgrad bench: shape (2,2147483648,2147483648,2) in float32 needs about"),
            std::string::npos) << r.err;
  EXPECT_NE(r.err.find("of physical memory"), std::string::npos) << r.err;
}

// A suite is a regular file of sane size: nothing else is opened (a fifo would block, a device never ends).
TEST_F(Cli, SuitePathMustBeARegularFileOfSaneSize) {
  Outcome r = headgrad({"run", "/dev/zero"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("headgrad: error: /dev/zero: is not a regular file (a device, fifo or socket)"),
            std::string::npos) << r.err;
  const fs::path fifo = dir_ / "suite.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  r = headgrad({"run", fifo.string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(fifo.string() + ": is not a regular file"), std::string::npos) << r.err;
  r = headgrad({"run", dir_.string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(dir_.string()), std::string::npos) << r.err;
  const fs::path big = dir_ / "big.yaml";
  std::ofstream(big) << "cases:\n";
  fs::resize_file(big, (16u << 20) + 1);  // sparse: costs no disk
  r = headgrad({"run", big.string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(big.string() + ": is 16777217 bytes; a suite file may hold at most 16777216 bytes"),
            std::string::npos) << r.err;
}

// Names with control characters and invalid UTF-8: one line per case on the
// terminal, and reports that stay valid UTF-8 and say what they replaced.
TEST_F(Cli, HostileNamesCannotForgeLinesOrBreakReports) {
  const fs::path suite = dir_ / "names.yaml";
  std::ofstream(suite) << "cases:\n  - name: \"a\\n  OK     forged\"\n    compare: [per_head, batched]\n"
                          "    shape: {B: 2, T: 3, D: 8, H: 2}\n"
                          "  - name: \"bad \xff\xc0\xaf \\e[31m\"\n    compare: [per_head, batched]\n"
                          "    shape: {B: 2, T: 3, D: 8, H: 2}\n";
  const fs::path json = dir_ / "r.json", junit = dir_ / "r.xml", html = dir_ / "r.html";
  const Outcome r = headgrad({"run", suite.string(), "--json", json.string(), "--junit", junit.string(), "--html",
                              html.string()});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  std::istringstream lines(r.out);
  std::size_t ok_lines = 0;
  for (std::string l; std::getline(lines, l);) ok_lines += l.rfind("  OK ", 0) == 0 ? 1 : 0;
  EXPECT_EQ(ok_lines, 2u) << r.out;  // two cases, two lines: no forged third
  EXPECT_NE(r.out.find("\n  OK     a\\n  OK     forged  "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\n  OK     forged"), std::string::npos) << r.out;  // no line starts with the forgery
  EXPECT_NE(r.out.find("  OK     bad \\xff\\xc0\\xaf \\x1b[31m"), std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(slurp(json));  // strict UTF-8
  ASSERT_EQ(j["notes"].size(), 1u) << j["notes"];
  EXPECT_NE(j["notes"][0].get<std::string>().find("replaced by U+FFFD"), std::string::npos);
  for (const fs::path& f : {junit, html}) {
    const std::string text = slurp(f);
    EXPECT_NO_THROW((void)nlohmann::json(text).dump()) << f << " is not valid UTF-8";  // dump() checks strictly
    EXPECT_NE(text.find("replaced by U+FFFD"), std::string::npos) << f;
  }
}

TEST_F(Cli, TimeoutsArePositiveFiniteAndBounded) {
  const std::string suite = (kFixtures / "pass.yaml").string();
  for (const char* t : {"nan", "inf", "1e16", "-1", "0", "86401"}) {
    const Outcome r = headgrad({"run", suite, "--timeout", t});
    EXPECT_EQ(r.code, 2) << t;
    EXPECT_NE(r.err.find("--timeout: must be a number of seconds"), std::string::npos) << t << ": " << r.err;
    EXPECT_EQ(r.out, "") << t;
  }
  EXPECT_EQ(headgrad({"export", suite, "--case", "closed-book", "--out", (dir_ / "x").string(), "--timeout", "nan"}).code, 2);
  EXPECT_EQ(headgrad({"run", suite, "--timeout", "86400", "-q"}).code, 0);
}

// The side's result is complete: a process the plugin forked, still holding
// the result pipe, neither makes it look timed out nor outlives the run.
TEST_F(Cli, AGrandchildHoldingThePipeIsKilledWithItsSide) {
  const fs::path pid_file = dir_ / "grandchild.pid";
  ::setenv("HEADGRAD_TEST_GRANDCHILD_FILE", pid_file.c_str(), 1);
  std::ofstream(dir_ / "s.yaml") << "cases:\n  - name: forks\n    compare: [forks, per_head]\n    timeout: 20\n"
                                    "    shape: {B: 2, T: 3, D: 8, H: 2}\n";
  const auto t0 = std::chrono::steady_clock::now();
  const Outcome r = headgrad({"run", (dir_ / "s.yaml").string(), "--plugin-path", kTestPlugins});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::unsetenv("HEADGRAD_TEST_GRANDCHILD_FILE");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("  OK     forks"), std::string::npos) << r.out;
  EXPECT_LT(seconds, 15);  // not the 20 s limit, nor the grandchild's 60 s
  std::ifstream in(pid_file);
  pid_t pid = 0;
  ASSERT_TRUE(in >> pid) << "the plugin wrote no pid";
  // Gone, or a zombie waiting for a reaper: either way no longer running. The
  // SIGKILL is sent when the side ends, and a process on its way out can still
  // read as running for a moment: allow it 2 s (it would sleep 60 s).
  auto state_of = [](pid_t p) {
    std::string state;
    std::ifstream stat("/proc/" + std::to_string(p) + "/stat");
    if (stat) {
      std::string skip;
      stat >> skip >> skip >> state;  // pid (comm) state
    }
    return state;
  };
  std::string state = state_of(pid);
  for (int i = 0; i < 200 && !(state.empty() || state == "Z"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    state = state_of(pid);
  }
  EXPECT_TRUE(state.empty() || state == "Z") << "grandchild " << pid << " is still running (state " << state << ")";
}

// Reports are renamed into place, their folders checked and inputs protected up front.
TEST_F(Cli, ReportsAreWrittenAtomicallyAndNeverOverAnInput) {
  const fs::path suite = dir_ / "pass.yaml";
  fs::copy_file(kFixtures / "pass.yaml", suite);
  fs::copy_file(kFixtures / "mask_B2_Tq5_Tk7.npy", dir_ / "mask_B2_Tq5_Tk7.npy");
  const std::string text = slurp(suite);

  Outcome r = headgrad({"run", suite.string(), "--json", suite.string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--json " + suite.string() + ": is the suite " + suite.string() +
                       ", which this run reads; it would be overwritten"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(suite), text);
  EXPECT_EQ(r.out, "");
  r = headgrad({"run", suite.string(), "--html", (dir_ / "mask_B2_Tq5_Tk7.npy").string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("is the mask file of case 'core-mask'"), std::string::npos) << r.err;
  r = headgrad({"run", suite.string(), "--json", (dir_ / "r.json").string(), "--junit", (dir_ / "." / "r.json").string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(": --json writes the same file"), std::string::npos) << r.err;
  r = headgrad({"run", suite.string(), "--junit", dir_.string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("is a folder, not a file"), std::string::npos) << r.err;

  // An old report open in a reader keeps its whole old content: the new one is a new file.
  const fs::path json = dir_ / "r.json";
  std::ofstream(json) << "old report";
  std::ifstream reader(json);
  r = headgrad({"run", suite.string(), "--json", json.string(), "-q"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(reader), {}), "old report");
  EXPECT_EQ(nlohmann::json::parse(slurp(json))["summary"]["exit_code"], 0);
  for (const auto& entry : fs::directory_iterator(dir_))  // no temporary file left behind
    EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos) << entry.path();

  // export: into the case's own reference directory would overwrite its inputs
  ASSERT_EQ(headgrad({"export", suite.string(), "--case", "closed-book", "--out", (dir_ / "ref").string()}).code, 0);
  std::ofstream(dir_ / "s.yaml") << "cases:\n  - name: r\n    compare: [per_head]\n    reference: ref\n    causal: true\n"
                                    "    shape: {H: 2}\n";
  const std::string x = slurp(dir_ / "ref" / "x.npy");
  r = headgrad({"export", (dir_ / "s.yaml").string(), "--case", "r", "--out", (dir_ / "ref").string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("is the reference directory of case 'r'"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(dir_ / "ref" / "x.npy"), x);
  r = headgrad({"run", (dir_ / "s.yaml").string(), "--json", (dir_ / "ref" / "out.npy").string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("lies inside the reference directory of case 'r'"), std::string::npos) << r.err;
}

TEST_F(Cli, ReferenceDirectoryMissingAFileOrWithAWrongShape) {
  ASSERT_NO_FATAL_FAILURE(export_reference());
  EXPECT_EQ(headgrad({"run", (dir_ / "s.yaml").string()}).code, 0);
  fs::remove(dir_ / "ref" / "wv.npy");
  Outcome r = headgrad({"run", (dir_ / "s.yaml").string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("s.yaml:4:16: case 'r': reference directory ref has no wv.npy"), std::string::npos) << r.err;
  headgrad::write_npy(dir_ / "ref" / "wv.npy", headgrad::Tensor::zeros({8, 4}, headgrad::DType::float64));
  r = headgrad({"run", (dir_ / "s.yaml").string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("ref/wv.npy has shape [8, 4], expected [8, 8]"), std::string::npos) << r.err;
}

// A reference input that cannot be checked against is the user's to fix: exit 2, the file named.
TEST_F(Cli, ReferenceInputsWithNanOrNoElementsExitTwo) {
  ASSERT_NO_FATAL_FAILURE(export_reference());
  const headgrad::Tensor r = headgrad::read_npy(dir_ / "ref" / "r.npy");
  headgrad::Tensor nan_r = r.clone();
  nan_r.set({0, 0, 0}, std::nan(""));
  headgrad::write_npy(dir_ / "ref" / "r.npy", nan_r);
  Outcome o = headgrad({"run", (dir_ / "s.yaml").string()});
  EXPECT_EQ(o.code, 2) << o.out << o.err;
  EXPECT_NE(o.err.find("s.yaml:4:16: case 'r': ref/r.npy holds NaN at [0, 0, 0]"), std::string::npos) << o.err;
  headgrad::write_npy(dir_ / "ref" / "r.npy", r);
  // x gives the shapes (r's is checked against it before its data is read)
  headgrad::write_npy(dir_ / "ref" / "x.npy", headgrad::Tensor::zeros({0, 3, 8}, headgrad::DType::float64));
  o = headgrad({"run", (dir_ / "s.yaml").string()});
  EXPECT_EQ(o.code, 2) << o.out << o.err;
  EXPECT_NE(o.err.find("ref/x.npy has shape [0, 3, 8], a zero-size dim"), std::string::npos) << o.err;
  EXPECT_EQ(o.out, "");  // nothing ran
}

TEST_F(Cli, UsageErrorsExitTwo) {
  EXPECT_EQ(headgrad({}).code, 2);                                        // no subcommand
  EXPECT_EQ(headgrad({"frobnicate"}).code, 2);                            // unknown subcommand
  EXPECT_EQ(headgrad({"run"}).code, 2);                                   // no suite
  EXPECT_EQ(headgrad({"run", "/no/such/suite.yaml"}).code, 2);            // missing file
  EXPECT_EQ(headgrad({"run", (kFixtures / "pass.yaml").string(), "--bogus"}).code, 2);
  EXPECT_EQ(headgrad({"run", (kFixtures / "pass.yaml").string(), "--timeout", "-1"}).code, 2);
  EXPECT_EQ(headgrad({"run", (kFixtures / "pass.yaml").string(), "-q", "-v"}).code, 2);
  const Outcome nomatch = headgrad({"run", (kFixtures / "pass.yaml").string(), "--filter", "nothing*"});
  EXPECT_EQ(nomatch.code, 2);
  EXPECT_NE(nomatch.err.find("no case of"), std::string::npos);
  const Outcome unwritable = headgrad({"run", (kFixtures / "pass.yaml").string(), "--json", "/no/such/dir/r.json"});
  EXPECT_EQ(unwritable.code, 2);
  EXPECT_NE(unwritable.err.find("--json /no/such/dir/r.json: the folder /no/such/dir does not exist"),
            std::string::npos) << unwritable.err;
  EXPECT_EQ(unwritable.out, "");  // refused before any case ran
}

// Each report flag: a folder that does not exist is refused before any case runs.
TEST_F(Cli, EveryReportFlagRefusesAMissingFolder) {
  for (const std::string flag : {"--json", "--junit", "--html"}) {
    const Outcome r = headgrad({"run", (kFixtures / "pass.yaml").string(), flag, "/no/such/dir/report"});
    EXPECT_EQ(r.code, 2) << flag << ": " << r.out << r.err;
    EXPECT_NE(r.err.find(flag + " /no/such/dir/report: the folder /no/such/dir does not exist"), std::string::npos)
        << r.err;
    EXPECT_EQ(r.out, "") << flag;  // refused before any case ran
  }
}

TEST_F(Cli, EverySubcommandHasHelp) {
  for (const char* sub : {"run", "plugins", "export"}) {
    const Outcome r = headgrad({sub, "--help"});
    EXPECT_EQ(r.code, 0) << sub;
    EXPECT_NE(r.out.find("--plugin-path"), std::string::npos) << sub << ":\n" << r.out;
  }
  const Outcome run = headgrad({"run", "--help"});
  for (const char* opt : {"--filter", "--json", "--junit", "--html", "--timeout", "--max-memory", "--no-isolation", "-v", "-q"})
    EXPECT_NE(run.out.find(opt), std::string::npos) << opt;
  const Outcome top = headgrad({"--help"});
  EXPECT_EQ(top.code, 0);
  EXPECT_NE(top.out.find("Exit codes: 0"), std::string::npos);
}

// merge and new-plugin load no plugin and run no case: their help gives their own exit codes.
TEST_F(Cli, MergeAndNewPluginHelpGiveTheirOwnExitCodes) {
  const Outcome merge = headgrad({"merge", "--help"});
  EXPECT_EQ(merge.code, 0);
  EXPECT_NE(merge.out.find("2 bad usage or a\nreport refused"), std::string::npos) << merge.out;
  EXPECT_EQ(merge.out.find("GTEST_SHARD_INDEX"), std::string::npos) << merge.out;
  const Outcome np = headgrad({"new-plugin", "--help"});
  EXPECT_EQ(np.code, 0);
  EXPECT_NE(np.out.find("0 the project was written; 2 NAME is not a C identifier"), std::string::npos) << np.out;
  EXPECT_EQ(np.out.find("a comparison failed"), std::string::npos) << np.out;
}

TEST_F(Cli, FilterAndQuiet) {
  const Outcome r = headgrad({"run", (kFixtures / "pass.yaml").string(), "--filter", "layouts", "-q"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("OK"), std::string::npos) << r.out;  // quiet: passing cases are not listed
  EXPECT_TRUE(has_line(r.out, "4 passed, 0 failed")) << r.out;
  const Outcome v = headgrad({"run", (kFixtures / "pass.yaml").string(), "--filter", "closed-book", "-v"});
  EXPECT_NE(v.out.find("closest to the limit"), std::string::npos) << v.out;  // every tensor's figures
  EXPECT_NE(v.err.find("loaded plugin 'per_head'"), std::string::npos);        // info logs
}

TEST_F(Cli, NoIsolationRunsInProcess) {
  const Outcome r = headgrad({"run", (kFixtures / "misbehaving.yaml").string(), "--plugin-path", kTestPlugins,
                          "--no-isolation", "--filter", "throws*"});
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_NE(r.out.find("plugin throws threw std::runtime_error"), std::string::npos);
}

TEST_F(Cli, PluginsListsNameVersionAbiCapabilitiesFile) {
  const Outcome r = headgrad({"plugins"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("NAME", 0), 0u);
  for (const char* col : {"VERSION", "ABI", "CAPABILITIES", "FILE"}) EXPECT_NE(r.out.find(col), std::string::npos);
  EXPECT_NE(r.out.find("per_head"), std::string::npos);
  EXPECT_NE(r.out.find("per_head.so"), std::string::npos);
  EXPECT_NE(r.out.find("mha, core, causal"), std::string::npos);
  EXPECT_EQ(r.out.find("mutant_"), std::string::npos);  // only with --all

  const Outcome all = headgrad({"plugins", "--all"});
  EXPECT_EQ(all.code, 0);

  // a library that is not a plugin: listed as rejected, with its reason; exit 0 (3 with --strict)
  std::ofstream(dir_ / "fake.so") << "not a shared library";
  const Outcome rejected = headgrad({"plugins", "--plugin-path", dir_.string(), "--plugin-path", kTestPlugins});
  EXPECT_EQ(rejected.code, 0);
  EXPECT_EQ(headgrad({"plugins", "--strict", "--plugin-path", dir_.string()}).code, 3);
  EXPECT_NE(rejected.out.find("rejected  " + (dir_ / "fake.so").string() + ": cannot load the library"),
            std::string::npos)
      << rejected.out;
  EXPECT_NE(rejected.out.find("segfaults"), std::string::npos);

  const Outcome json = headgrad({"plugins", "--json", "--plugin-path", kTestPlugins});
  const nlohmann::json j = nlohmann::json::parse(json.out);
  bool found = false;
  for (const auto& p : j["plugins"]) {
    if (p["name"] != "limited") continue;
    found = true;
    EXPECT_EQ(p["capabilities"], nlohmann::json::array({"mha", "float64"}));
    EXPECT_EQ(p["abi"], HEADGRAD_PLUGIN_ABI_VERSION);
    EXPECT_NE(p["file"].get<std::string>().find("limited.so"), std::string::npos);
  }
  EXPECT_TRUE(found) << json.out;
}

TEST_F(Cli, ExportWritesAReferenceDirectoryThatChecksBack) {
  const fs::path out = dir_ / "closed-book";
  const Outcome ex = headgrad({"export", (kFixtures / "pass.yaml").string(), "--case", "closed-book", "--plugin",
                           "batched", "--out", out.string()});
  ASSERT_EQ(ex.code, 0) << ex.out << ex.err;
  for (const char* f : {"x", "wq", "wk", "wv", "wo", "r", "out", "dx", "dwq", "dwk", "dwv", "dwo"})
    EXPECT_TRUE(fs::exists(out / (std::string(f) + ".npy"))) << f;
  EXPECT_EQ(headgrad::read_npy(out / "x.npy").shape(), (headgrad::Shape{2, 3, 8}));
  EXPECT_EQ(headgrad::read_npy(out / "dwq.npy").shape(), (headgrad::Shape{8, 8}));
  // the written suite checks a plugin against the directory
  Outcome back = headgrad({"run", (out / "suite.yaml").string()});
  EXPECT_EQ(back.code, 0) << back.out << back.err;
  // a mutated expected file: the check fails and names the element
  headgrad::Tensor dwv = headgrad::read_npy(out / "dwv.npy");
  dwv.set({5, 2}, dwv.at({5, 2}) + 0.01);
  headgrad::write_npy(out / "dwv.npy", dwv);
  back = headgrad({"run", (out / "suite.yaml").string()});
  EXPECT_EQ(back.code, 1) << back.out;
  EXPECT_NE(back.out.find("worst [5, 2] (head=1, row=1, in=2)"), std::string::npos) << back.out;

  // core level with a mask: q, k, v, mask, r and the expected tensors
  const Outcome core = headgrad({"export", (kFixtures / "pass.yaml").string(), "--case", "core-mask", "--out",
                             (dir_ / "core").string()});
  ASSERT_EQ(core.code, 0) << core.err;
  for (const char* f : {"q", "k", "v", "mask", "r", "out", "dq", "dk", "dv"})
    EXPECT_TRUE(fs::exists(dir_ / "core" / (std::string(f) + ".npy"))) << f;
  EXPECT_EQ(headgrad({"run", (dir_ / "core" / "suite.yaml").string()}).code, 0);

  // a sweep point by its full name; a wrong name suggests the closest
  EXPECT_EQ(headgrad({"export", (kFixtures / "pass.yaml").string(), "--case", "layouts[B=2,H=2]", "--out",
                      (dir_ / "sweep").string()})
                .code,
            0);
  const Outcome typo = headgrad({"export", (kFixtures / "pass.yaml").string(), "--case", "closed-bok", "--out",
                             (dir_ / "x").string()});
  EXPECT_EQ(typo.code, 2);
  EXPECT_NE(typo.err.find("did you mean 'closed-book'?"), std::string::npos) << typo.err;
  // a plugin that crashes: exit 3, nothing written
  const Outcome crash = headgrad({"export", (kFixtures / "misbehaving.yaml").string(), "--case", "segfaults",
                              "--plugin-path", kTestPlugins, "--out", (dir_ / "crash").string()});
  EXPECT_EQ(crash.code, 3);
  EXPECT_NE(crash.err.find("plugin segfaults crashed with SIGSEGV (segmentation fault)"), std::string::npos) << crash.err;
  EXPECT_FALSE(fs::exists(dir_ / "crash"));
}

TEST_F(Cli, TheDefaultSuitePasses) {
  // Every real plugin is built and listed: the suite compares all three, and a
  // missing one is a failure here, not a skipped test.
  const Outcome plugins = headgrad({"plugins"});
  for (const fs::path& file : headgrad::test::real_plugin_files()) {
    ASSERT_TRUE(fs::exists(file)) << "the build did not make " << file;
    EXPECT_NE(plugins.out.find(file.string()), std::string::npos) << plugins.out;
  }
  const Outcome r = headgrad({"run", "configs/default.yaml", "-q"}, HEADGRAD_SOURCE_ROOT);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}

}  // namespace

}  // namespace test_runner_cli
