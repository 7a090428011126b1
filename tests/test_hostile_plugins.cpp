// Hostile plugin libraries (tests/plugins/hostile) on the search path: each
// one that segfaults, aborts, hangs or exits (in a static constructor or in
// info()), chatters on stdout, forks a grandchild, writes garbage into the
// probe's pipe or exports data where a function should be is listed by
// `headgrad plugins` as rejected with its reason; one that takes per_head's
// name wins it and is named; and `headgrad run configs/default.yaml` with
// all of them on its path still runs every case and exits 0.
#include <gtest/gtest.h>

#include <algorithm>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "checks.hpp"
#include "headgrad/abi.hpp"
#include "headgrad_cli.hpp"
#include "headgrad/loader.hpp"

namespace test_hostile_plugins {  // this file's names: test files share unity builds (tests/meson.build)

namespace fs = std::filesystem;
namespace hg = headgrad;
using headgrad::test::contains;
using headgrad::test::Outcome;

namespace {

const fs::path kHostile = HOSTILE_PLUGIN_DIR;              // build/tests/plugins/hostile
const fs::path kBuiltPluginDir = HEADGRAD_BUILD_PLUGIN_DIR;  // build/plugins
const fs::path kDefaultSuite = DEFAULT_SUITE;               // configs/default.yaml
const char* const kProbeTimeout = "2";

fs::path scratch() {
  static const fs::path dir = [] {
    const fs::path d = fs::path(::testing::TempDir()) / ("headgrad_hostile_" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

// The hostile grandchildren write their pids into scratch().
Outcome headgrad(const std::vector<std::string>& args) {
  return headgrad::test::headgrad(args, fs::current_path(), {{"HOSTILE_PID_DIR", scratch().string()}});
}

// Whether `pid` is a process that still runs (a zombie does not).
bool running(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto close_paren = line.rfind(')');
  return close_paren != std::string::npos && close_paren + 2 < line.size() && line[close_paren + 2] != 'Z';
}

class HostilePlugins : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    plugins_ = headgrad({"plugins", "--plugin-path", kHostile.string(), "--probe-timeout", kProbeTimeout});
    run_ = headgrad({"run", kDefaultSuite.string(), "--plugin-path", kHostile.string(), "--probe-timeout",
                     kProbeTimeout});
  }
  static inline Outcome plugins_, run_;
};

struct Expected {
  const char* file;
  const char* reason;  // the start of the reason
};

const Expected kRejected[] = {
    {"segfault_at_load.so", "crashed with SIGSEGV (segmentation fault) while loading the library (its static constructors)"},
    {"segfault_in_info.so", "crashed with SIGSEGV (segmentation fault) in info()"},
    {"abort_at_load.so", "crashed with SIGABRT (aborted) while loading the library (its static constructors)"},
    {"abort_in_info.so", "crashed with SIGABRT (aborted) in info()"},
    {"hang_at_load.so", "did not finish within 2 s (hung while loading the library (its static constructors)); killed"},
    {"hang_in_info.so", "did not finish within 2 s (hung in info()); killed"},
    {"exit0_at_load.so", "exited with status 0 while loading the library (its static constructors)"},
    {"exit0_in_info.so", "exited with status 0 in info()"},
    {"chatter_at_load.so", "wrote on stdout while loading or in info() (\"  OK     a forged line on stdout  chatter_at_load\")"},
    {"chatter_in_info.so", "wrote on stdout while loading or in info() (\"  OK     a forged line on stdout  chatter_in_info\")"},
    {"grandchild_at_load.so", "left a process running after its probe"},
    {"grandchild_in_info.so", "left a process running after its probe"},
    {"garbage_at_load.so", "its probe answered something unreadable"},
    {"garbage_in_info.so", "its probe answered something unreadable"},
    {"data_symbol.so", "'headgrad_plugin_build' is a data symbol, not a function"},
};

TEST_F(HostilePlugins, EachIsListedAsRejectedWithItsReason) {
  for (const auto& e : kRejected) {
    SCOPED_TRACE(e.file);
    EXPECT_TRUE(contains(plugins_.out, "rejected  " + (kHostile / e.file).string() + ": " + e.reason)) << plugins_.out;
  }
}

TEST_F(HostilePlugins, ThePluginsCommandIsUnharmedAndExitsZero) {
  EXPECT_EQ(plugins_.code, 0) << plugins_.err;
  EXPECT_TRUE(std::regex_search(plugins_.out, std::regex("\nbatched +1\\.0\\.0 +" + std::to_string(HEADGRAD_PLUGIN_ABI_VERSION) + " +mha, core")));
  EXPECT_TRUE(contains(plugins_.out, "searched: " + kHostile.string() + ", "));
  // The chatter was captured in the probe, not printed: it appears only quoted in its reason.
  EXPECT_EQ(plugins_.out.find("\n  OK     a forged line"), std::string::npos);
  EXPECT_EQ(plugins_.out.rfind("NAME", 0), 0u);
  // A plugin's name cannot forge a line of the table: its newline is escaped.
  EXPECT_EQ(plugins_.out.find("\n  OK     a forged plugin line"), std::string::npos) << plugins_.out;
  EXPECT_TRUE(contains(plugins_.out, "forged\\n  OK     a forged plugin line")) << plugins_.out;
  // Probes run a few at a time: the two hangs cost about one time limit, not two.
  EXPECT_LT(plugins_.seconds, 8.0);
}

TEST_F(HostilePlugins, StrictFailsOnTheRejections) {
  const Outcome strict =
      headgrad({"plugins", "--strict", "--plugin-path", kHostile.string(), "--probe-timeout", kProbeTimeout});
  EXPECT_EQ(strict.code, 3);
  EXPECT_EQ(strict.out, plugins_.out);  // the same listing
}

TEST_F(HostilePlugins, TheShadowTakesItsNameAndIsNamed) {
  EXPECT_TRUE(std::regex_search(plugins_.out, std::regex("\nper_head +0\\.0\\.1-shadow .*shadow\\.so\n")))
      << plugins_.out;
  const fs::path real = kBuiltPluginDir / "per_head" / "per_head.so";
  EXPECT_TRUE(contains(plugins_.out, "rejected  " + real.string() + ": a plugin named 'per_head' is already provided by " +
                                         (kHostile / "shadow.so").string()));
  EXPECT_TRUE(contains(run_.err, "plugin per_head comes from " + (kHostile / "shadow.so").string() +
                                     ", which shadows " + real.string()))
      << run_.err;
}

TEST_F(HostilePlugins, TheDefaultSuiteStillRunsEveryCase) {
  EXPECT_EQ(run_.code, 0) << run_.out << run_.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(run_.out, m, std::regex("suite default \\(.*\\): (\\d+) of (\\d+) cases")))
      << run_.out;
  EXPECT_EQ(m[1], m[2]);
  EXPECT_TRUE(contains(run_.out, m[1].str() + " passed, 0 failed")) << run_.out;
  EXPECT_EQ(run_.out.find("forged"), std::string::npos);
  // Loaded into the run's process: only what default.yaml names.
  EXPECT_TRUE(contains(run_.out, "plugins: per_head 0.0.1-shadow, batched 1.0.0, fused_sdpa 1.0.0\n")) << run_.out;
}

// A suite that names a hostile plugin: the run says which rejected library
// it skipped for that name and why; the case fails as a plugin error.
TEST_F(HostilePlugins, RunNamesTheRejectedLibraryItSkipped) {
  const fs::path suite = scratch() / "wants_hostile.yaml";
  std::ofstream(suite) << "suite: wants-hostile\ncases:\n"
                          "  - {name: core, level: core, compare: [segfault_in_info, batched], "
                          "shape: {B: 1, H: 1, Tq: 2, Tk: 2, d: 2}}\n";
  const Outcome r = headgrad({"run", suite.string(), "--plugin-path", kHostile.string(), "--probe-timeout", kProbeTimeout});
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "plugin segfault_in_info is not loaded; skipped the rejected library " +
                                  (kHostile / "segfault_in_info.so").string() +
                                  ": crashed with SIGSEGV (segmentation fault) in info()"))
      << r.err;
}

TEST_F(HostilePlugins, GrandchildrenDoNotOutliveTheirProbe) {
  for (const char* name : {"grandchild_at_load", "grandchild_in_info"}) {
    SCOPED_TRACE(name);
    std::ifstream in(scratch() / (std::string(name) + ".pid"));
    int pid = 0;
    ASSERT_TRUE(in >> pid) << "the plugin never forked";
    EXPECT_FALSE(running(pid)) << "grandchild " << pid << " still runs";
  }
}

// A plugin that needs the AddressSanitizer runtime, which exits a process it
// was not loaded first into: the probe contains the exit and passes on the
// runtime's own words. (In an ASan build of headgrad it loads like any other.)
TEST(AsanRuntime, InAPluginItExitsOnlyTheProbe) {
  const fs::path dir = ASAN_PLUGIN_DIR;
  const Outcome r = headgrad::test::headgrad({"plugins", "--plugin-path", dir.string()});
  EXPECT_EQ(r.code, 0) << r.err;
#if defined(__SANITIZE_ADDRESS__)
  EXPECT_TRUE(contains(r.out, "needs_asan_runtime")) << r.out;
  EXPECT_FALSE(contains(r.out, "rejected  " + (dir / "needs_asan_runtime.so").string())) << r.out;
#else
  EXPECT_TRUE(contains(r.out, "rejected  " + (dir / "needs_asan_runtime.so").string() +
                                  ": exited with status 1 while loading the library (its static constructors)"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "its last words on stderr: ==")) << r.out;
  // gcc's runtime: "ASan runtime does not come first ..."; clang's (the
  // sanitizer build): "... linked against incompatible ASan runtimes".
  EXPECT_TRUE(contains(r.out, "ASan runtime")) << r.out;
#endif
}

// The same libraries probed by a registry in this test's own process.
TEST(HostileRegistry, ProbingLeavesThisProcessStanding) {
  hg::ProbeOptions options;
  options.timeout_s = 1.0;
  hg::PluginRegistry reg(options);
  reg.probe_directories({kHostile});
  // The two well-behaved ones: the shadow and the toy with a forged name.
  ASSERT_EQ(reg.found().size(), 2u);
  const auto shadow = std::find_if(reg.found().begin(), reg.found().end(),
                                   [](const auto& p) { return p.info.name == "per_head"; });
  ASSERT_NE(shadow, reg.found().end());
  EXPECT_EQ(shadow->file, kHostile / "shadow.so");
  EXPECT_EQ(reg.rejections().size(), std::size(kRejected));
  reg.load_all();  // the shadow, in this process
  ASSERT_NE(reg.find("per_head"), nullptr);
  EXPECT_TRUE(reg.find("per_head")->info.capabilities.mha);
}

}  // namespace

}  // namespace test_hostile_plugins
