// The programs' heap allocator (meson.build, -Dmalloc): the headgrad program
// and the test programs take malloc from jemalloc in a build with it, from
// glibc in one without. Checked where it is decided: the order in which the
// dynamic loader searches a program's libraries (jemalloc before libc, so
// its malloc is the one every library and plugin calls), and the library
// that this process's malloc comes from. With jemalloc, its compiled-in
// settings (tools/headgrad/malloc_conf.cpp: huge pages) are the ones it
// runs with, and MALLOC_CONF still overrides them. Each check says what a
// build of each kind must show, so none is skipped.
#include <dlfcn.h>

#include <cstddef>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "headgrad_cli.hpp"

namespace test_heap_allocator {  // this file's names: allocator checks

using headgrad::test::headgrad;

const std::string kBuiltWith = HEADGRAD_MALLOC;  // "jemalloc", "system" or "sanitizer"

// The file this process's malloc is defined in, as the dynamic loader found it.
std::string library_of_malloc() {
  Dl_info info{};
  void* const symbol = ::dlsym(RTLD_DEFAULT, "malloc");
  if (symbol == nullptr || ::dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

TEST(HeapAllocator, ThisProgramsMallocIsTheBuildsChoice) {
  const std::string lib = library_of_malloc();
  if (kBuiltWith == "jemalloc") {
    EXPECT_NE(lib.find("libjemalloc"), std::string::npos) << lib;
  } else if (kBuiltWith == "system") {
    EXPECT_NE(lib.find("libc.so"), std::string::npos) << lib;
  } else {  // the sanitizer's malloc is linked into the program itself
    EXPECT_EQ(std::filesystem::path(lib).filename(), std::filesystem::read_symlink("/proc/self/exe").filename())
        << lib;
  }
}

// LD_TRACE_LOADED_OBJECTS=1 makes the dynamic loader list the program's
// libraries in the order it searches them for a symbol (what ldd prints),
// then exit before main.
TEST(HeapAllocator, HeadgradSearchesJemallocBeforeLibc) {
  const auto r = headgrad({"--version"}, std::filesystem::current_path(), {{"LD_TRACE_LOADED_OBJECTS", "1"}});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto libc = r.out.find("libc.so.6"), jemalloc = r.out.find("libjemalloc");
  ASSERT_NE(libc, std::string::npos) << r.out;
  if (kBuiltWith == "jemalloc") {
    ASSERT_NE(jemalloc, std::string::npos) << r.out;
    EXPECT_LT(jemalloc, libc) << r.out;
  } else {  // glibc's malloc, or the sanitizer's
    EXPECT_EQ(jemalloc, std::string::npos) << r.out;
  }
}

// jemalloc's own word for one of its string options (mallctl "opt.NAME"),
// looked up at run time: a build without jemalloc has no mallctl.
std::string jemalloc_option(const char* name) {
  using Mallctl = int (*)(const char*, void*, std::size_t*, void*, std::size_t);
  const auto mallctl = reinterpret_cast<Mallctl>(::dlsym(RTLD_DEFAULT, "mallctl"));
  if (mallctl == nullptr) return "";
  const char* value = nullptr;
  std::size_t size = sizeof value;
  if (mallctl((std::string("opt.") + name).c_str(), &value, &size, nullptr, 0) != 0 || value == nullptr) return "";
  return value;
}

TEST(HeapAllocator, JemallocAsksForHugePages) {
  // the headgrad program: jemalloc prints its settings at exit (stats_print), to stderr
  const auto defaults = headgrad({"--version"}, std::filesystem::current_path(), {{"MALLOC_CONF", "stats_print:true"}});
  ASSERT_EQ(defaults.code, 0) << defaults.err;
  if (kBuiltWith != "jemalloc") {  // no jemalloc here, nor in the program
    EXPECT_EQ(jemalloc_option("thp"), "");
    EXPECT_EQ(defaults.err.find("opt.thp"), std::string::npos) << defaults.err.substr(0, 2000);
    return;
  }
  EXPECT_EQ(jemalloc_option("thp"), "always");
  EXPECT_NE(defaults.err.find("opt.thp: \"always\""), std::string::npos) << defaults.err.substr(0, 2000);
  // a user's MALLOC_CONF wins over the compiled-in settings
  const auto mine = headgrad({"--version"}, std::filesystem::current_path(),
                             {{"MALLOC_CONF", "thp:never,stats_print:true"}});
  ASSERT_EQ(mine.code, 0) << mine.err;
  EXPECT_NE(mine.err.find("opt.thp: \"never\""), std::string::npos) << mine.err.substr(0, 2000);
}

}  // namespace test_heap_allocator
