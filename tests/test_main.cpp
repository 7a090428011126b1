// The main of the two test programs (test_engine, test_tools), each built from
// many tests/test_*.cpp files so that their headers are compiled once (a
// precompiled header per program) and two programs are linked, not forty-five.
// Each meson test runs one source file's tests: `--source=test_tensor.cpp`
// selects the tests defined in that file, within whatever --gtest_filter or
// GTEST_FILTER also says (their positive patterns narrow the selection, their
// negative ones still apply). Without --source every test runs, as with
// gtest_main.
#include <fnmatch.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t end = std::min(s.find(sep, start), s.size());
    if (end > start) parts.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

// gtest's filter patterns: '*' and '?' as in a shell glob, '.' and '/' plain.
bool matches_any(const std::vector<std::string>& patterns, const std::string& name) {
  for (const auto& p : patterns)
    if (::fnmatch(p.c_str(), name.c_str(), 0) == 0) return true;
  return false;
}

// Narrows gtest's filter to the tests defined in `source`; false if it defines none.
bool select_source(const std::string& source) {
  const std::string filter = GTEST_FLAG_GET(filter);
  const std::size_t dash = filter.find('-');
  std::vector<std::string> positive = split(filter.substr(0, dash), ':');
  if (positive.empty()) positive = {"*"};
  const std::string negative = dash == std::string::npos ? "" : filter.substr(dash);

  std::string selected;
  bool defines_any = false;
  const auto& unit = *::testing::UnitTest::GetInstance();
  for (int i = 0; i < unit.total_test_suite_count(); ++i) {
    const auto& suite = *unit.GetTestSuite(i);
    for (int j = 0; j < suite.total_test_count(); ++j) {
      const auto& info = *suite.GetTestInfo(j);
      if (std::filesystem::path(info.file()).filename() != source) continue;
      defines_any = true;
      const std::string name = std::string(suite.name()) + "." + info.name();
      if (matches_any(positive, name)) selected += (selected.empty() ? "" : ":") + name;
    }
  }
  // Nothing left after the filter: a pattern that matches no test name.
  GTEST_FLAG_SET(filter, (selected.empty() ? std::string("-*") : selected) + negative);
  return defines_any;
}

}  // namespace

int main(int argc, char** argv) {
  std::string source;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    constexpr std::string_view flag = "--source=";
    if (std::string_view(argv[i]).substr(0, flag.size()) == flag)
      source = argv[i] + flag.size();
    else
      argv[kept++] = argv[i];
  }
  argc = kept;
  ::testing::InitGoogleTest(&argc, argv);
  if (!source.empty() && !select_source(source)) {
    std::fprintf(stderr, "%s: no test is defined in '%s' (--source= takes a file name such as test_tensor.cpp)\n",
                 argv[0], source.c_str());
    return 2;
  }
  return RUN_ALL_TESTS();
}
