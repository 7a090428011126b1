// The plugin loader: deliberately broken libraries (tests/plugins/mixed) are
// each skipped with a message naming the file and the reason while the good
// ones load; the search order; a library outliving its registry; the real
// plugins; and the real plugins' hidden visibility.
//
// Shape legend: B batch, H heads, Tq/Tk query/key lengths, d head width.
#include "headgrad/loader.hpp"

#include <gtest/gtest.h>

#include <dlfcn.h>
#include <gnu/libc-version.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <spdlog/sinks/ostream_sink.h>

#include "checks.hpp"
#include "headgrad/log.hpp"

namespace test_loader {  // this file's names: test files share unity builds (tests/meson.build)

namespace hg = headgrad;
namespace fs = std::filesystem;
using headgrad::test::contains;

namespace {

const fs::path kTestPluginDir = TEST_PLUGIN_DIR;               // build/tests/plugins
const fs::path kBuiltPluginDir = HEADGRAD_BUILD_PLUGIN_DIR;    // build/plugins

fs::path scratch_root() {
  return fs::path(::testing::TempDir()) / ("headgrad_loader_" + std::to_string(::getpid()));
}

// Removes this run's scratch folders once every test has finished.
class ScratchCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(scratch_root(), ignored);
  }
};
[[maybe_unused]] const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new ScratchCleanup);

// A fresh scratch folder holding a copy of each named test plugin.
fs::path copy_test_plugins(const std::string& folder, const std::vector<std::string>& names) {
  const fs::path dir = scratch_root() / folder;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& n : names) fs::copy_file(kTestPluginDir / (n + ".so"), dir / (n + ".so"));
  return dir;
}

const hg::PluginRejection* rejection_for(const hg::PluginRegistry& reg, const std::string& file) {
  for (const auto& r : reg.rejections())
    if (r.file.filename() == file) return &r;
  return nullptr;
}

std::vector<std::string> plugin_names(const hg::PluginRegistry& reg) {
  std::vector<std::string> names;
  for (const auto& p : reg.plugins()) names.push_back(p.info.name);
  return names;
}

// Sets (or unsets, with nullopt) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::optional<std::string>& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value->c_str(), 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Whether the dynamic linker has `file` loaded right now (RTLD_NOLOAD never
// loads; a found handle is released again at once).
bool is_loaded(const fs::path& file) {
  void* handle = ::dlopen(file.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) return false;
  ::dlclose(handle);
  return true;
}

// ---- a folder of good and broken plugins, loaded once for the suite ----

class MixedFolder : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = copy_test_plugins("mixed", {"dup_a", "dup_b", "good_toy", "no_factory", "not_a_plugin",
                                       "old_abi_symbol", "old_string_abi", "stale_layout", "throws_on_info",
                                       "wrong_abi"});
    std::ofstream(dir_ / "fake.so") << "this is a text file, not a shared library\n";
    {  // the first bytes of a real plugin: a valid ELF magic, then nothing
      std::ifstream in(dir_ / "good_toy.so", std::ios::binary);
      std::array<char, 64> head{};
      in.read(head.data(), head.size());
      std::ofstream(dir_ / "truncated.so", std::ios::binary).write(head.data(), in.gcount());
    }

    // Capture the plugins logger: every rejection is logged with path and reason.
    auto logger = hg::logging::plugins();
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log_);
    const auto level = logger->level();
    logger->set_level(spdlog::level::debug);  // libraries that are no plugin are logged at debug
    logger->sinks().push_back(sink);
    registry_ = new hg::PluginRegistry();
    registry_->load_directories({dir_});
    logger->sinks().pop_back();
    logger->set_level(level);
  }
  static void TearDownTestSuite() {
    delete registry_;
    registry_ = nullptr;
  }

  // Checks the rejection of `file`: its reason and the logged line, which names
  // the full path and the reason.
  static void expect_rejected(const std::string& file, const std::string& reason_part) {
    SCOPED_TRACE(file);
    const hg::PluginRejection* r = rejection_for(*registry_, file);
    ASSERT_NE(r, nullptr) << "no rejection recorded";
    EXPECT_EQ(r->file, dir_ / file);
    EXPECT_TRUE(contains(r->reason, reason_part));
    EXPECT_TRUE(contains(log_.str(), "skipped plugin " + (dir_ / file).string() + ": " + r->reason));
  }

  static inline fs::path dir_;
  static inline hg::PluginRegistry* registry_ = nullptr;
  static inline std::ostringstream log_;
};

TEST_F(MixedFolder, WrongAbiVersionIsSkipped) {
  // "built for plugin ABI version 3 (headgrad 0.1.0), headgrad uses 2"
  expect_rejected("wrong_abi.so", "built for plugin ABI version " + std::to_string(hg::plugin_abi_version + 1) +
                                      " (headgrad " HEADGRAD_VERSION_STRING "), headgrad uses " +
                                      std::to_string(hg::plugin_abi_version));
}

// good_toy compiled with -D_GLIBCXX_USE_CXX11_ABI=0: it would load (no
// std::string in the symbols it imports) and then free headgrad's strings
// with the other ABI's code.
TEST_F(MixedFolder, OtherStdStringAbiIsSkippedNamingTheMacro) {
  expect_rejected("old_string_abi.so", "built with _GLIBCXX_USE_CXX11_ABI=0, headgrad uses 1");
  expect_rejected("old_string_abi.so", "sizeof(std::string) is 8 in the plugin, 32 in headgrad");
  EXPECT_EQ(registry_->find("old_string_abi"), nullptr);
}

TEST_F(MixedFolder, ChangedPublicStructIsSkippedNamingTheType) {
  expect_rejected("stale_layout.so", "sizeof(MemoryStats) is 16 in the plugin, " +
                                         std::to_string(sizeof(hg::MemoryStats)) + " in headgrad");
  EXPECT_EQ(registry_->find("stale_layout"), nullptr);
}

TEST_F(MixedFolder, PluginOfTheFirstSdkIsToldToRebuild) {
  expect_rejected("old_abi_symbol.so", "built for an older headgrad: it exports 'headgrad_plugin_abi_version'");
}

TEST_F(MixedFolder, MissingFactoryIsSkipped) {
  expect_rejected("no_factory.so", "no factory");
  expect_rejected("no_factory.so", "headgrad_create_plugin");
}

TEST_F(MixedFolder, LibraryWithoutHeadgradSymbolsIsSkipped) {
  expect_rejected("not_a_plugin.so", "not a headgrad plugin");
  expect_rejected("not_a_plugin.so", "headgrad_plugin_build");
}

TEST_F(MixedFolder, DuplicateNameKeepsTheFirstFileInSortedOrder) {
  expect_rejected("dup_b.so", "already provided by " + (dir_ / "dup_a.so").string());
  expect_rejected("dup_b.so", "'duplicate'");
  const auto names = plugin_names(*registry_);
  EXPECT_EQ(std::count(names.begin(), names.end(), "duplicate"), 1);
  EXPECT_EQ(registry_->get("duplicate").file, dir_ / "dup_a.so");
  EXPECT_EQ(rejection_for(*registry_, "dup_a.so"), nullptr);
}

TEST_F(MixedFolder, PluginThatThrowsWhileStartingIsSkipped) {
  expect_rejected("throws_on_info.so", "threw while starting: boom");
}

TEST_F(MixedFolder, GarbageAndTruncatedFilesAreSkipped) {
  expect_rejected("fake.so", "cannot load the library");
  expect_rejected("truncated.so", "cannot load the library");
}

TEST_F(MixedFolder, GoodPluginsStillLoad) {
  const auto names = plugin_names(*registry_);
  EXPECT_EQ(names, (std::vector<std::string>{"duplicate", "toy"}));  // sorted file order
  const hg::LoadedPlugin& toy = registry_->get("toy");
  EXPECT_EQ(toy.file, dir_ / "good_toy.so");
  EXPECT_EQ(toy.abi_version, hg::plugin_abi_version);
  EXPECT_TRUE(toy.info.capabilities.core);
  EXPECT_FALSE(toy.info.capabilities.mha);
  EXPECT_EQ(registry_->rejections().size(), 10u);  // every other file, each once
}

TEST_F(MixedFolder, UnknownNameThrowsListingTheLoadedOnes) {
  try {
    (void)registry_->get("nope");
    FAIL() << "get(\"nope\") did not throw";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "'nope'"));
    EXPECT_TRUE(contains(msg, "loaded: duplicate, toy"));
    EXPECT_TRUE(contains(msg, "wrong_abi.so: built for plugin ABI version "));  // and why others are missing
  }
  EXPECT_EQ(registry_->find("nope"), nullptr);
}

// ---- one file at a time ----

TEST(LoaderFile, MissingFileIsRejected) {
  hg::PluginRegistry reg;
  const fs::path missing = scratch_root() / "nowhere" / "missing.so";
  EXPECT_FALSE(reg.load_file(missing));
  ASSERT_EQ(reg.rejections().size(), 1u);
  EXPECT_EQ(reg.rejections()[0].file, missing);
  EXPECT_TRUE(contains(reg.rejections()[0].reason, "no such file"));
  EXPECT_TRUE(reg.plugins().empty());
}

TEST(LoaderFile, PathNamingAFileIsLoadedAsOnePlugin) {
  const fs::path dir = copy_test_plugins("single", {"good_toy", "wrong_abi"});
  hg::PluginRegistry reg;
  reg.load_directories({dir / "good_toy.so"});
  EXPECT_EQ(plugin_names(reg), std::vector<std::string>{"toy"});
  EXPECT_TRUE(reg.rejections().empty());  // wrong_abi.so beside it is not touched
}

// The registry hands out the object; the object holds its library open. Run
// on a private copy of good_toy (built without STB_GNU_UNIQUE symbols, which
// would pin it) so that no other test's registry keeps it loaded.
TEST(LoaderLifetime, ObjectKeepsItsLibraryLoadedAfterTheRegistryIsGone) {
  const fs::path file = copy_test_plugins("lifetime", {"good_toy"}) / "good_toy.so";
  std::shared_ptr<const hg::Attention> toy;
  {
    hg::PluginRegistry reg;
    ASSERT_TRUE(reg.load_file(file));
    toy = reg.get("toy").attention;
  }
  ASSERT_TRUE(is_loaded(file)) << "the library was closed while its object lives";

  EXPECT_EQ(toy->info().name, "toy");  // code and strings from the plugin's library
  hg::Generator gen(7);
  const hg::Variable q(hg::randn({2, 3, 4, 5}, hg::DType::float64, gen), true);  // [B, H, Tq, d]
  const hg::Variable k(hg::randn({2, 3, 6, 5}, hg::DType::float64, gen), true);  // [B, H, Tk, d]
  const hg::Variable v(hg::randn({2, 3, 6, 5}, hg::DType::float64, gen), true);  // [B, H, Tk, d]
  hg::AttentionSpec spec;
  spec.causal = true;
  const hg::Variable out = toy->core_forward(q, k, v, spec);  // [B, H, Tq, d]
  const hg::Variable expected = hg::attention_core(q, k, v, spec);
  ASSERT_EQ(out.shape(), expected.shape());
  EXPECT_EQ(out.data().to_vector(), expected.data().to_vector());
  hg::sum(out).backward();
  EXPECT_TRUE(q.grad().defined());

  toy.reset();  // the last owner: now the library may go
  EXPECT_FALSE(is_loaded(file)) << "the library stayed loaded after its last object died";
}

// ---- probing: nothing of a library runs in this process until it is needed ----

TEST(LoaderProbe, ProbingFindsPluginsWithoutLoadingThem) {
  const fs::path dir = copy_test_plugins("probe_only", {"dup_a", "good_toy", "wrong_abi"});
  hg::PluginRegistry reg;
  reg.probe_directories({dir});
  ASSERT_EQ(reg.found().size(), 2u);
  EXPECT_EQ(reg.found()[0].info.name, "duplicate");
  EXPECT_EQ(reg.found()[1].info.name, "toy");
  EXPECT_EQ(reg.found()[1].abi_version, hg::plugin_abi_version);
  EXPECT_TRUE(reg.found()[1].info.capabilities.core);
  EXPECT_FALSE(reg.found()[1].info.capabilities.mha);
  EXPECT_TRUE(reg.plugins().empty());
  EXPECT_FALSE(is_loaded(dir / "good_toy.so"));
  EXPECT_FALSE(is_loaded(dir / "dup_a.so"));

  reg.load({"toy", "no_such_plugin"});
  EXPECT_EQ(plugin_names(reg), std::vector<std::string>{"toy"});
  EXPECT_TRUE(is_loaded(dir / "good_toy.so"));
  EXPECT_FALSE(is_loaded(dir / "dup_a.so"));  // never needed, never opened here
  EXPECT_EQ(reg.find("duplicate"), nullptr);
  ASSERT_NE(reg.find_found("duplicate"), nullptr);
  ASSERT_EQ(reg.rejections().size(), 1u);  // wrong_abi, from its probe
  EXPECT_TRUE(contains(reg.rejections()[0].reason, "built for plugin ABI version"));
}

TEST(LoaderProbe, RejectionsForANameMatchDeclaredNamesAndFileNames) {
  const fs::path dir = copy_test_plugins("rejections_for", {"dup_a", "dup_b", "wrong_abi"});
  hg::PluginRegistry reg;
  reg.probe_directories({dir});
  const auto by_name = reg.rejections_for("duplicate");  // dup_b declared it
  ASSERT_EQ(by_name.size(), 1u);
  EXPECT_EQ(by_name[0]->file, dir / "dup_b.so");
  EXPECT_EQ(by_name[0]->name, "duplicate");
  const auto by_file = reg.rejections_for("wrong_abi");  // rejected before it said its name
  ASSERT_EQ(by_file.size(), 1u);
  EXPECT_EQ(by_file[0]->file, dir / "wrong_abi.so");
  EXPECT_TRUE(reg.rejections_for("toy").empty());
}

TEST(LoaderProbe, AFolderOrFileReachedTwiceIsProbedOnce) {
  const fs::path dir = copy_test_plugins("twice", {"good_toy"});
  hg::PluginRegistry reg;
  reg.probe_directories({dir, dir / "good_toy.so", dir / "." / ".."/ "twice"});
  EXPECT_EQ(reg.found().size(), 1u);
  EXPECT_TRUE(reg.rejections().empty()) << reg.rejections()[0].reason;
}

// The folder of the C library: thousands of shared libraries that are no
// plugins, among them runtimes that exit the process they are loaded into
// (the sanitizers'). Probing it must leave this process standing and reject
// each library with a reason.
TEST(LoaderProbe, TheSystemLibraryFolderIsSurvived) {
  Dl_info where{};
  // gnu_get_libc_version, not fputs: a sanitizer runtime intercepts fputs,
  // and dladdr would then name the test program's folder.
  ASSERT_NE(::dladdr(reinterpret_cast<void*>(&::gnu_get_libc_version), &where), 0);
  const fs::path system_dir = fs::canonical(where.dli_fname).parent_path();
  hg::PluginRegistry reg;
  reg.probe_directories({system_dir});
  EXPECT_GT(reg.rejections().size(), 50u) << system_dir;
  std::size_t not_plugins = 0;
  for (const auto& r : reg.rejections()) {
    EXPECT_FALSE(r.reason.empty()) << r.file;
    not_plugins += r.not_a_plugin;
  }
  EXPECT_GT(not_plugins, 50u);
  EXPECT_TRUE(reg.plugins().empty());
  // libc.so, where the C library's development files are installed, is a linker script.
  const hg::PluginRejection* script = rejection_for(reg, "libc.so");
  if (script && fs::file_size(script->file) < 4096) {
    EXPECT_TRUE(script->not_a_plugin);
    EXPECT_EQ(script->reason, "not a library: a linker script");
  }
}

// ---- the search path ----

TEST(LoaderSearchPath, CliDirsThenEnvironmentThenBuiltFolder) {
  const ScopedEnv env("HEADGRAD_PLUGIN_PATH", "/env/one::/env/two:");
  const auto dirs = hg::plugin_search_path({"/cli/a", "/cli/b"});
  ASSERT_EQ(dirs.size(), 5u);
  EXPECT_EQ(dirs[0], "/cli/a");
  EXPECT_EQ(dirs[1], "/cli/b");
  EXPECT_EQ(dirs[2], "/env/one");  // empty entries are dropped
  EXPECT_EQ(dirs[3], "/env/two");
  EXPECT_EQ(dirs[4].filename(), "plugins");
  // Run from the build tree, the last folder is the built plugins.
  EXPECT_TRUE(fs::equivalent(dirs[4], kBuiltPluginDir)) << dirs[4];
}

TEST(LoaderSearchPath, WithoutCliOrEnvironmentOnlyTheBuiltFolder) {
  const ScopedEnv env("HEADGRAD_PLUGIN_PATH", std::nullopt);
  const auto dirs = hg::plugin_search_path({});
  ASSERT_EQ(dirs.size(), 1u);
  EXPECT_TRUE(fs::equivalent(dirs[0], kBuiltPluginDir)) << dirs[0];
}

TEST(LoaderSearchPath, EarlierFolderWinsANameClash) {
  const fs::path first = copy_test_plugins("first", {"dup_b"});
  const fs::path second = copy_test_plugins("second", {"dup_a", "good_toy"});
  hg::PluginRegistry reg;
  reg.load_directories({first, scratch_root() / "no_such_folder", second});
  EXPECT_EQ(reg.get("duplicate").file, first / "dup_b.so");  // folder order beats file order
  ASSERT_NE(reg.find("toy"), nullptr);
  const hg::PluginRejection* r = rejection_for(reg, "dup_a.so");
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(contains(r->reason, "already provided by " + (first / "dup_b.so").string()));
}

// ---- the core library itself ----

// Loading libheadgrad sets nothing in the environment (choosing BLIS's
// kernels is the headgrad program's job, in its main()). Checked in a fresh
// copy of this test program, started without BLIS_ARCH_TYPE.
TEST(CoreLibrary, LoadingItSetsNoEnvironmentVariable) {
  if (std::getenv("HEADGRAD_TEST_FRESH_COPY")) {
    EXPECT_EQ(std::getenv("BLIS_ARCH_TYPE"), nullptr) << "set while libheadgrad loaded";
    return;
  }
  const std::string cmd = "env -u BLIS_ARCH_TYPE HEADGRAD_TEST_FRESH_COPY=1 /proc/" + std::to_string(::getpid()) +
                          "/exe --gtest_filter=CoreLibrary.LoadingItSetsNoEnvironmentVariable > /dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
}

// ---- the real plugins ----

TEST(BuiltPlugins, LoadWithMhaAndCoreLevels) {
  const ScopedEnv env("HEADGRAD_PLUGIN_PATH", std::nullopt);
  hg::PluginRegistry reg;
  reg.load_directories(hg::plugin_search_path({}));
  std::vector<std::string> expected = {"per_head", "batched"};
  if (fs::exists(kBuiltPluginDir / "fused_sdpa" / "fused_sdpa.so")) expected.push_back("fused_sdpa");
  for (const auto& name : expected) {
    SCOPED_TRACE(name);
    const hg::LoadedPlugin* p = reg.find(name);
    ASSERT_NE(p, nullptr) << "rejected as: "
                          << [&] {
                               const auto* r = rejection_for(reg, name + ".so");
                               return r ? r->reason : std::string("(not found)");
                             }();
    EXPECT_EQ(p->file.filename(), name + ".so");
    EXPECT_EQ(p->abi_version, hg::plugin_abi_version);
    EXPECT_FALSE(p->info.mutant);
    EXPECT_FALSE(p->info.version.empty());
    EXPECT_FALSE(p->info.description.empty());
    EXPECT_TRUE(p->info.capabilities.mha);
    EXPECT_TRUE(p->info.capabilities.core);
    EXPECT_TRUE(contains(hg::capabilities_str(p->info.capabilities), "mha, core"));
  }
}

// Hidden visibility: a plugin exports its two entry points and nothing of its
// own classes. Only C names (headgrad_*) are compared: which C++ symbols a
// build exports besides (weak instantiations of std and boost templates over
// headgrad's types, more of them without optimization, sanitizer metadata)
// depends on the build type, not on the plugin.
std::string defined_dynamic_symbols(const fs::path& lib) {
  const std::string cmd = "nm -DC --defined-only '" + lib.string() + "' 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(cmd.c_str(), "r"), ::pclose);
  if (!pipe) return {};
  std::string out;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), pipe.get()) != nullptr) out += buf.data();
  return out;
}

TEST(BuiltPlugins, ExportOnlyTheirEntryPoints) {
  if (std::system("nm --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "nm not found";
  std::vector<std::pair<std::string, std::string>> plugins = {{"batched", "Batched"},
                                                              {"per_head", "PerHead"}};
  if (fs::exists(kBuiltPluginDir / "fused_sdpa" / "fused_sdpa.so"))
    plugins.emplace_back("fused_sdpa", "FusedSdpa");
  for (const auto& [name, class_name] : plugins) {
    SCOPED_TRACE(name);
    const std::string symbols = defined_dynamic_symbols(kBuiltPluginDir / name / (name + ".so"));
    std::vector<std::string> headgrad_symbols;
    std::istringstream lines(symbols);
    for (std::string line; std::getline(lines, line);) {
      EXPECT_EQ(line.find(class_name), std::string::npos) << "exported: " << line;
      const std::string name = line.substr(line.rfind(' ') + 1);
      if (name.rfind("headgrad_", 0) == 0) headgrad_symbols.push_back(name);
    }
    std::sort(headgrad_symbols.begin(), headgrad_symbols.end());
    EXPECT_EQ(headgrad_symbols,
              (std::vector<std::string>{"headgrad_create_plugin", "headgrad_plugin_build"}))
        << symbols;
  }
}

}  // namespace

}  // namespace test_loader
