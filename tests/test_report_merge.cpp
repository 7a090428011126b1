// `headgrad merge` on hostile shard reports (docs/design.md, merge): two
// real shards of tests/runner/merge.yaml, corrupted one field at a time. Each
// must exit 2 naming the file (and the JSON path where one field is wrong),
// leave every output untouched, and neither hang nor fill memory: the program
// runs with a time limit and (outside ASan, which reserves terabytes of
// address space) an address-space limit.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "checks.hpp"
#include "headgrad_cli.hpp"

namespace test_report_merge {  // this file's names: test files share unity builds (tests/meson.build)

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using headgrad::test::headgrad;
using headgrad::test::Outcome;
using headgrad::test::slurp;

const fs::path kSuite = fs::path(RUNNER_FIXTURES) / "merge.yaml";

// headgrad with a deadline (killed after `seconds`: code -1) and at most
// 4 GiB of address space, so that a merge that allocates without bound fails
// this test instead of the machine.
Outcome limited(const std::vector<std::string>& args, double seconds = 30) {
  const fs::path tmp = fs::temp_directory_path();
  const std::string tag = std::to_string(::getpid());
  const fs::path out_file = tmp / ("headgrad_merge_out_" + tag), err_file = tmp / ("headgrad_merge_err_" + tag);
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::FILE* out = std::freopen(out_file.c_str(), "w", stdout);
    std::FILE* err = std::freopen(err_file.c_str(), "w", stderr);
    if (!out || !err) ::_exit(127);
#ifndef HG_UNDER_ASAN
    const rlimit as{4ull << 30, 4ull << 30};
    ::setrlimit(RLIMIT_AS, &as);
#endif
    ::unsetenv("HEADGRAD_LOG_LEVEL");
    std::vector<char*> argv{const_cast<char*>(HEADGRAD_EXE)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(HEADGRAD_EXE, argv.data());
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  bool timed_out = false;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Outcome r;
  r.code = timed_out ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out_file);
  r.err = slurp(err_file);
  fs::remove(out_file);
  fs::remove(err_file);
  return r;
}

void write_json(const fs::path& p, const json& j) { std::ofstream(p, std::ios::binary) << j.dump(1); }

class MergeHostile : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / ("headgrad_merge_" + std::to_string(::getpid())));
    fs::remove_all(*dir_);
    fs::create_directories(*dir_);
    for (int k = 1; k <= 2; ++k) {
      const Outcome r =
          headgrad({"run", kSuite.string(), "--shard", std::to_string(k) + "/2", "--json", shard(k).string()});
      ASSERT_EQ(r.code, 0) << r.out << r.err;
    }
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  static fs::path shard(int k) { return *dir_ / ("shard" + std::to_string(k) + ".json"); }
  static json read(int k) { return json::parse(slurp(shard(k))); }

  void SetUp() override {
    // Outputs that already exist: a refused merge must leave them as they are.
    for (const char* name : {"out.json", "out.xml", "out.html"}) std::ofstream(*dir_ / name) << "old";
  }
  // merge of `files` into the three outputs; every output still "old" afterwards.
  static Outcome merge_refused(const std::vector<fs::path>& files) {
    std::vector<std::string> args{"merge"};
    for (const auto& f : files) args.push_back(f.string());
    for (const auto& [opt, name] : {std::pair{"--json", "out.json"}, {"--junit", "out.xml"}, {"--html", "out.html"}}) {
      args.push_back(opt);
      args.push_back((*dir_ / name).string());
    }
    const Outcome r = limited(args);
    for (const char* name : {"out.json", "out.xml", "out.html"})
      EXPECT_EQ(slurp(*dir_ / name), "old") << name << " was written by a refused merge";
    EXPECT_EQ(r.err.find("json.exception"), std::string::npos) << r.err;
    return r;
  }
  // shard 1 with `edit` applied, merged with shard 2: exit 2 naming the edited file and `says`.
  static void expect_refused(const std::function<void(json&)>& edit, const std::string& says) {
    json j = read(1);
    edit(j);
    const fs::path bad = *dir_ / "bad1.json";
    write_json(bad, j);
    const Outcome r = merge_refused({bad, shard(2)});
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find(bad.string() + ": "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << "expected: " << says << "\ngot: " << r.err;
    EXPECT_LT(r.err.size(), 4000u) << "a bounded message";
  }
  // Index in shard 1's cases of the case with error maps (the mutant).
  static std::size_t mapped_case(const json& j) {
    for (std::size_t i = 0; i < j["cases"].size(); ++i)
      if (!j["cases"][i]["error_maps"].empty()) return i;
    ADD_FAILURE() << "shard 1 has no case with error maps";
    return 0;
  }

  static fs::path* dir_;
};
fs::path* MergeHostile::dir_ = nullptr;

TEST_F(MergeHostile, TheTwoShardsMergeAndTheMutantHasErrorMaps) {
  const Outcome r = limited({"merge", shard(2).string(), shard(1).string(), "--json", (*dir_ / "out.json").string()});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  const json j = json::parse(slurp(*dir_ / "out.json"));
  ASSERT_EQ(j["cases"].size(), 4u);
  EXPECT_EQ(j["cases"][2]["name"], "scale-bug");
  EXPECT_FALSE(j["cases"][2]["error_maps"].empty());
  EXPECT_EQ(read(1)["cases"][mapped_case(read(1))]["name"], "scale-bug");
}

// Under --filter the indices are the expanded suite's (2 and 3 here), not
// positions in the selection: shards of a filtered run still merge.
TEST_F(MergeHostile, FilteredShardsMergeAsTheFilteredRun) {
  for (int k = 1; k <= 2; ++k)
    ASSERT_EQ(headgrad({"run", kSuite.string(), "--filter", "s*", "--shard", std::to_string(k) + "/2", "--json",
                        (*dir_ / ("f" + std::to_string(k) + ".json")).string()})
                  .code,
              0);
  const Outcome r = limited({"merge", (*dir_ / "f2.json").string(), (*dir_ / "f1.json").string(), "--json",
                             (*dir_ / "out.json").string()});
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(slurp(*dir_ / "out.json"));
  EXPECT_EQ(j["shard"]["cases"], json::array({2, 3}));
  ASSERT_EQ(j["cases"].size(), 2u);
  EXPECT_EQ(j["cases"][0]["name"], "scale-bug");
  EXPECT_EQ(j["cases"][1]["name"], "small");
}

// Item 2: an error map without maps, or with fewer cells than rows x cols.
TEST_F(MergeHostile, ErrorMapsWithoutMapsOrShortCellsAreRefusedBeforeAnyOutput) {
  const std::size_t c = mapped_case(read(1));
  const std::string at = "$.cases[" + std::to_string(c) + "].error_maps[0]";
  expect_refused([&](json& j) { j["cases"][c]["error_maps"][0]["maps"] = json::array(); }, at + ".maps: ");
  for (int shorter : {1, 8}) {
    json m = read(1)["cases"][c]["error_maps"][0]["maps"][0];
    const std::size_t want = m["cells"].size();
    ASSERT_GT(want, 8u);
    expect_refused(
        [&](json& j) {
          auto& cells = j["cases"][c]["error_maps"][0]["maps"][0]["cells"];
          for (int i = 0; i < shorter; ++i) cells.erase(cells.size() - 1);
        },
        at + ".maps[0].cells: expected " + std::to_string(want) + " numbers (cell_rows x cell_cols), got " +
            std::to_string(want - shorter));
  }
}

// Item 4: claimed sizes larger than the data.
TEST_F(MergeHostile, ClaimedCountsLargerThanTheFileAreRefusedWithoutAllocating) {
  expect_refused([](json& j) { j["shard"]["count"] = -1; }, "$.shard.count: expected a whole number");
  for (const std::string count : {"1000000000000", "18446744073709551615"})
    expect_refused([&](json& j) { j["shard"]["count"] = std::stoull(count); }, "shard 1/" + count);
  // both shards claiming 10^12 shards: the missing ones are counted, not listed
  json a = read(1), b = read(2);
  a["shard"]["count"] = b["shard"]["count"] = 1000000000000ull;
  write_json(*dir_ / "a.json", a);
  write_json(*dir_ / "b.json", b);
  const Outcome r = merge_refused({*dir_ / "a.json", *dir_ / "b.json"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_LT(r.err.size(), 4000u);
  // an error map claiming 10^15 columns
  const std::size_t c = mapped_case(read(1));
  expect_refused([&](json& j) { j["cases"][c]["error_maps"][0]["maps"][0]["cols"] = 1000000000000000ll; },
                 "$.cases[" + std::to_string(c) + "].error_maps[0].maps[0]");
  // selected: more cases than the shards hold
  expect_refused([&](json& j) { j["suite_identity"]["selected"] = 1000000000000ull; }, "$.suite_identity");
}

TEST_F(MergeHostile, AReportLargerThanTheCapIsRefusedUnread) {
  const fs::path big = *dir_ / "big.json";
  fs::copy_file(shard(1), big, fs::copy_options::overwrite_existing);
  fs::resize_file(big, 1ull << 30);  // 1 GiB (sparse): a 1 GiB string or whitespace reads the same
  const Outcome r = merge_refused({big, shard(2)});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(big.string() + ": is 1.0 GiB; a report of headgrad run is at most"), std::string::npos)
      << r.err;
}

TEST_F(MergeHostile, AFifoOrAFolderGivenAsAReportIsRefusedWithTheReason) {
  const fs::path fifo = *dir_ / "fifo.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Outcome r = merge_refused({fifo, shard(2)});
  EXPECT_EQ(r.code, 2) << r.err;  // not -1: it must not block
  EXPECT_NE(r.err.find(fifo.string() + ": is a fifo, not a regular file"), std::string::npos) << r.err;
  const fs::path folder = *dir_ / "folder.json";
  fs::create_directories(folder);
  r = merge_refused({folder, shard(2)});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(folder.string()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("directory"), std::string::npos) << r.err;
}

// Item 5: inconsistent shards.
TEST_F(MergeHostile, CaseIndicesOutOfRangeNegativeOrFractionalAreRefused) {
  expect_refused([](json& j) { j["shard"]["cases"][1] = 99; },
                 "$.shard.cases[1]: case 99 is out of range: suite 'merge-hostile' expands to 4 cases");
  // within range but shard 2/2's
  expect_refused([](json& j) { j["shard"]["cases"][1] = 3; },
                 "$.shard.cases[1]: case 3 is held twice: here and in " + shard(2).string() + " ($.shard.cases[1])");
  expect_refused([](json& j) { j["shard"]["cases"][1] = -1; }, "$.shard.cases[1]: expected a whole number");
  expect_refused([](json& j) { j["shard"]["cases"][1] = 1.5; }, "$.shard.cases[1]: expected a whole number");
}

TEST_F(MergeHostile, IndicesSwappedBetweenShardsOrAnotherShardsCasesAreRefused) {
  json a = read(1), b = read(2);
  std::swap(a["shard"]["cases"], b["shard"]["cases"]);
  write_json(*dir_ / "a.json", a);
  write_json(*dir_ / "b.json", b);
  Outcome r = merge_refused({*dir_ / "a.json", *dir_ / "b.json"});
  EXPECT_EQ(r.code, 2) << r.err;
  // case 0 comes first in suite order, held by b.json (shard 2/2)
  EXPECT_NE(r.err.find((*dir_ / "b.json").string() + ": $.shard.cases[0]: case 0 is the suite's selected case 0, "
                                                      "which shard 1/2 holds, not shard 2/2"),
            std::string::npos)
      << r.err;
  // shard 2's file holding shard 1's cases (and indices)
  b = read(1);
  b["shard"]["index"] = 2;
  write_json(*dir_ / "b.json", b);
  r = merge_refused({shard(1), *dir_ / "b.json"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(shard(1).string() + ": $.shard.cases[0]: case 0 is held twice: here and in " +
                       (*dir_ / "b.json").string() + " ($.shard.cases[0])"),
            std::string::npos)
      << r.err;
  // the cases swapped within a shard, the indices left: each case is checked against the identity
  a = read(1);
  std::swap(a["cases"][0], a["cases"][1]);
  write_json(*dir_ / "a.json", a);
  r = merge_refused({*dir_ / "a.json", shard(2)});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find((*dir_ / "a.json").string() + ": $.cases[0]: case 'scale-bug' is not case 0 of suite"),
            std::string::npos)
      << r.err;
}

TEST_F(MergeHostile, AForeignSuitesShardWithTheIdentityCopiedIsRefused) {
  // Another suite of four cases, its shard 2/2 made to look like this suite's.
  const fs::path other = *dir_ / "other.yaml";
  std::string text = slurp(kSuite);
  for (const std::string from : {"name: core", "name: small"}) text.replace(text.find(from), from.size(), from + "-x");
  std::ofstream(other) << text;
  const fs::path foreign = *dir_ / "foreign.json";
  ASSERT_EQ(headgrad({"run", other.string(), "--shard", "2/2", "--json", foreign.string()}).code, 0);
  json f = json::parse(slurp(foreign));
  const json genuine = read(2);
  for (const char* key : {"suite", "file", "suite_identity"}) f[key] = genuine[key];
  write_json(foreign, f);
  const Outcome r = merge_refused({shard(1), foreign});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(foreign.string() + ": $.cases[0]: case 'core-x' is not case 1 of suite 'merge-hostile'"),
            std::string::npos)
      << r.err;
}

TEST_F(MergeHostile, WrongTypesNameTheFileAndThePathNeverABareJsonError) {
  expect_refused([](json& j) { j["cases"][0]["tensors"][0]["max_abs"] = "big"; },
                 "$.cases[0].tensors[0].max_abs: expected a number or null, got a string");
  expect_refused([](json& j) { j["suite"] = 7; }, "$.suite: expected a string, got a number");
  expect_refused([](json& j) { j["summary"]["seconds"] = json::array(); }, "$.summary.seconds: expected a number");
  expect_refused([](json& j) { j["cases"][0]["sides"][1]["status"] = "fine"; },
                 "$.cases[0].sides[1].status: expected one of ok, not_loaded");
  expect_refused([](json& j) { j["cases"] = json::object(); }, "$.cases: expected an array, got an object");
  expect_refused([](json& j) { j["cases"][0]["compare"] = json::array(); },
                 "$.cases[0].compare: expected 2 plugins (the case has no reference), got 0");
}

// Item 9: every string of a merged report is escaped in the HTML, error_maps.axes too.
TEST_F(MergeHostile, EveryStringIsEscapedInTheHtmlAxesToo) {
  json j = read(1);
  const std::size_t c = mapped_case(j);
  j["cases"][c]["error_maps"][0]["axes"] = "<script>alert(1)</script>";
  j["cases"][c]["error_maps"][0]["maps"][0]["title"] = "</svg><img src=x>";
  write_json(*dir_ / "a.json", j);
  const fs::path html = *dir_ / "merged.html";
  const Outcome r = limited({"merge", (*dir_ / "a.json").string(), shard(2).string(), "--html", html.string()});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string h = slurp(html);
  EXPECT_EQ(h.find("<script>alert"), std::string::npos);
  EXPECT_NE(h.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
  EXPECT_EQ(h.find("<img src=x>"), std::string::npos);
  // the axes of a real run read as text: no entity escaped twice
  const fs::path html1 = *dir_ / "plain.html";
  ASSERT_EQ(limited({"merge", shard(1).string(), shard(2).string(), "--html", html1.string()}).code, 0);
  const std::string h1 = slurp(html1);
  EXPECT_EQ(h1.find("&amp;times;"), std::string::npos);
  EXPECT_NE(h1.find("rows: positions t; columns: heads \xc3\x97 channels (d = 4)"), std::string::npos);
}

}  // namespace

}  // namespace test_report_merge
