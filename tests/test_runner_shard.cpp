// Sharded and parallel runs through the real headgrad program: three
// --shard runs merged equal the unsharded run case for case; GTEST_* select
// the same shard as --shard; -j 2 reports what -j 1 reports; bad --shard,
// bad -j and bad merge inputs exit 2 naming what is wrong. The suite is
// tests/runner/shard.yaml (cases from configs/default.yaml and mutants.yaml).
#include <gtest/gtest.h>

#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "headgrad_cli.hpp"
#include "job/workers.hpp"
#include "judge/run_case.hpp"

namespace test_runner_shard {  // this file's names: test files share unity builds (tests/meson.build)

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const fs::path kSuite = fs::path(RUNNER_FIXTURES) / "shard.yaml";

using headgrad::test::headgrad;
using headgrad::test::Outcome;
using headgrad::test::slurp;

// The report without what differs from run to run: every "seconds",
// "compute_seconds", the peak memory figures, and the notes.
json without_timings(json j) {
  if (j.is_object()) {
    j.erase("seconds");
    j.erase("compute_seconds");
    // measurements like the timings: resident pages vary run to run, and a
    // kernel's scratch grows with the threads a -j worker gets
    j.erase("peak_rss_bytes");
    j.erase("peak_tensor_bytes");
    for (auto& [k, v] : j.items()) v = without_timings(v);
  } else if (j.is_array()) {
    for (auto& v : j) v = without_timings(v);
  }
  return j;
}

// Case names of a report, in its order.
std::vector<std::string> names(const json& report) {
  std::vector<std::string> out;
  for (const auto& c : report.at("cases")) out.push_back(c.at("name"));
  return out;
}

// Runs on the shard suite are expensive (a mutant's analysis re-runs it at a
// dozen shapes): the unsharded -j 1 run and the three shards are made once.
class Shards : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / ("headgrad_shard_" + std::to_string(::getpid())));
    fs::remove_all(*dir_);
    fs::create_directories(*dir_);
    whole_ = new Outcome(headgrad({"run", kSuite.string(), "-j", "1", "--json", (*dir_ / "whole.json").string()}));
    for (int k = 1; k <= 3; ++k) {
      const std::string shard = std::to_string(k) + "/3";
      shard_codes_[k - 1] =
          headgrad({"run", kSuite.string(), "--shard", shard, "--json", shard_file(k).string()}).code;
    }
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    delete whole_;
  }
  static fs::path shard_file(int k) { return *dir_ / ("shard" + std::to_string(k) + ".json"); }
  static json read(const fs::path& p) { return json::parse(slurp(p)); }

  static fs::path* dir_;
  static Outcome* whole_;
  static int shard_codes_[3];
};
fs::path* Shards::dir_ = nullptr;
Outcome* Shards::whole_ = nullptr;
int Shards::shard_codes_[3] = {};

TEST_F(Shards, TheWholeRunFailsOnTheUnexpectedMutantAndNamesIt) {
  // scale-bug-unexpected fails (no expect): exit 1; the expected mutant is an xfail
  ASSERT_EQ(whole_->code, 1) << whole_->out << whole_->err;
  const json j = read(*dir_ / "whole.json");
  ASSERT_EQ(j["cases"].size(), 15u);  // 1 + 8 sweep points + 6
  EXPECT_EQ(j["summary"]["counts"]["fail"], 1);
  EXPECT_EQ(j["summary"]["counts"]["xfail"], 1);
  EXPECT_EQ(j["shard"]["index"], 1);
  EXPECT_EQ(j["shard"]["count"], 1);
  EXPECT_EQ(j["suite_identity"]["selected"], 15);
  const json& bug = j["cases"][14];
  ASSERT_EQ(bug["name"], "scale-bug-unexpected");
  EXPECT_EQ(bug["diagnosis"]["best"], "scale_one_over_d");
  EXPECT_FALSE(bug["localization"].is_null());
  EXPECT_FALSE(bug["error_maps"].empty());
}

TEST_F(Shards, EachShardHoldsEveryThirdCaseAndItsIndices) {
  const json whole = read(*dir_ / "whole.json");
  std::set<std::size_t> seen;
  for (int k = 1; k <= 3; ++k) {
    const json s = read(shard_file(k));
    EXPECT_EQ(s["shard"]["index"], k);
    EXPECT_EQ(s["shard"]["count"], 3);
    EXPECT_EQ(s["suite_identity"], whole["suite_identity"]);
    EXPECT_EQ(s["warnings"], whole["warnings"]);  // the whole selection's, in every shard
    const auto indices = s["shard"]["cases"].get<std::vector<std::size_t>>();
    ASSERT_EQ(indices.size(), s["cases"].size());
    for (std::size_t i = 0; i < indices.size(); ++i) {
      EXPECT_EQ(indices[i], k - 1 + 3 * i);  // round-robin over the expanded cases
      EXPECT_EQ(s["cases"][i]["name"], whole["cases"][indices[i]]["name"]);
      EXPECT_TRUE(seen.insert(indices[i]).second) << "case " << indices[i] << " in two shards";
    }
  }
  EXPECT_EQ(seen.size(), 15u);
  // 15 cases: shard 1 gets 0, 3, 6, 9, 12; shard 2 gets 1, 4, 7, 10, 13 (13: the
  // xfail, exit 0); shard 3 gets 2, 5, 8, 11, 14 (14: the failing mutant, exit 1)
  EXPECT_EQ(shard_codes_[0], 0);
  EXPECT_EQ(shard_codes_[1], 0);
  EXPECT_EQ(shard_codes_[2], 1);
}

TEST_F(Shards, MergedShardsEqualTheUnshardedRunCaseForCase) {
  const fs::path merged = *dir_ / "merged.json", junit = *dir_ / "merged.xml", html = *dir_ / "merged.html";
  // given out of order: the merge puts them in suite order
  const Outcome m = headgrad({"merge", shard_file(3).string(), shard_file(1).string(), shard_file(2).string(),
                              "--json", merged.string(), "--junit", junit.string(), "--html", html.string()});
  EXPECT_EQ(m.code, 1) << m.out << m.err;  // what the whole suite gave
  EXPECT_NE(m.out.find("14 passed, 1 failed"), std::string::npos) << m.out;
  const json whole = read(*dir_ / "whole.json"), j = read(merged);
  ASSERT_EQ(names(j), names(whole));
  // every case's verdict, tensors' figures, worst elements, analysis, error maps
  for (std::size_t i = 0; i < whole["cases"].size(); ++i)
    EXPECT_EQ(without_timings(j["cases"][i]), without_timings(whole["cases"][i])) << whole["cases"][i]["name"];
  EXPECT_EQ(without_timings(j), without_timings(whole));
  // JUnit and HTML made from the merged result: every case, the failure and its diagnosis
  const std::string x = slurp(junit), h = slurp(html);
  EXPECT_NE(x.find("tests=\"15\" failures=\"1\" errors=\"0\""), std::string::npos) << x.substr(0, 400);
  EXPECT_NE(x.find("testcase name=\"scale-bug-unexpected\""), std::string::npos);
  EXPECT_NE(h.find("scale_one_over_d"), std::string::npos);
}

TEST_F(Shards, GtestVariablesSelectTheSameShardAsTheOption) {
  const fs::path env_file = *dir_ / "env2.json";
  const Outcome r = headgrad({"run", kSuite.string(), "--json", env_file.string()}, fs::current_path(),
                             {{"GTEST_SHARD_INDEX", "1"}, {"GTEST_TOTAL_SHARDS", "3"}});  // 0-based: shard 2/3
  EXPECT_EQ(r.code, shard_codes_[1]) << r.out << r.err;
  EXPECT_EQ(without_timings(read(env_file)), without_timings(read(shard_file(2))));
  EXPECT_NE(r.out.find("shard 2/3: 5 of the 15 cases"), std::string::npos) << r.out;
  // --shard wins over the variables
  const Outcome both = headgrad({"run", kSuite.string(), "--shard", "2/3", "--filter", "closed-book"},
                                fs::current_path(), {{"GTEST_SHARD_INDEX", "x"}, {"GTEST_TOTAL_SHARDS", "3"}});
  EXPECT_EQ(both.code, 0) << both.out << both.err;  // one case, in shard 1 only: shard 2 runs none
}

TEST_F(Shards, BadMergeInputsExitTwoNamingTheFile) {
  // a shard missing
  Outcome r = headgrad({"merge", shard_file(1).string(), shard_file(3).string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("shard 2/3 of suite 'shard-subset' missing"), std::string::npos) << r.err;
  // a shard twice
  r = headgrad({"merge", shard_file(1).string(), shard_file(2).string(), shard_file(2).string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(shard_file(2).string() + ": is shard 2/3 again"), std::string::npos) << r.err;
  // not a report
  const fs::path junk = *dir_ / "junk.json";
  std::ofstream(junk) << "{\"hello\": 1}";
  r = headgrad({"merge", shard_file(1).string(), junk.string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(junk.string() + ": is not a JSON report of headgrad run"), std::string::npos) << r.err;
  std::ofstream(junk) << "not json at all";
  r = headgrad({"merge", junk.string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(junk.string() + ": is not a JSON report"), std::string::npos) << r.err;
  // a shard of another suite: the same suite file under another filter selects other cases
  const fs::path other = *dir_ / "other.json";
  ASSERT_EQ(headgrad({"run", kSuite.string(), "--filter", "closed-book", "--shard", "2/3", "--json", other.string()})
                .code,
            0);
  r = headgrad({"merge", shard_file(1).string(), other.string(), shard_file(3).string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(other.string() + ": is shard 2/3 of suite 'shard-subset'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("not of the suite of " + shard_file(1).string()), std::string::npos) << r.err;
}

TEST(ShardOption, BadShardsAndJobsExitTwoWithTheMessage) {
  for (const std::string bad : {"0/3", "4/3", "garbage", "1/0", "2", "1/3x", "-1/3"}) {
    const Outcome r = headgrad({"run", kSuite.string(), "--shard", bad});
    EXPECT_EQ(r.code, 2) << bad;
    EXPECT_NE(r.err.find("--shard: expected K/N with 1 <= K <= N (shards are numbered from 1), got '" + bad + "'"),
              std::string::npos)
        << r.err;
  }
  Outcome r = headgrad({"run", kSuite.string()}, fs::current_path(),
                       {{"GTEST_SHARD_INDEX", "3"}, {"GTEST_TOTAL_SHARDS", "3"}});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("expected 0 <= GTEST_SHARD_INDEX < GTEST_TOTAL_SHARDS"), std::string::npos) << r.err;
  r = headgrad({"run", kSuite.string()}, fs::current_path(), {{"GTEST_TOTAL_SHARDS", "3"}});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("GTEST_TOTAL_SHARDS is set but GTEST_SHARD_INDEX is not"), std::string::npos) << r.err;
  r = headgrad({"run", kSuite.string(), "-j", "0"});
  EXPECT_EQ(r.code, 2) << r.err;
  r = headgrad({"run", kSuite.string(), "-j", "2", "--no-isolation"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("-j 2 needs isolation"), std::string::npos) << r.err;
}

TEST(Jobs, TwoAtOnceReportWhatOneAtATimeReports) {
  const fs::path dir = fs::temp_directory_path() / ("headgrad_jobs_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const Outcome one = headgrad({"run", kSuite.string(), "-j", "1", "--json", (dir / "j1.json").string()});
  const Outcome two = headgrad({"run", kSuite.string(), "-j", "2", "--json", (dir / "j2.json").string()});
  EXPECT_EQ(one.code, 1) << one.err;
  EXPECT_EQ(two.code, 1) << two.err;
  const json j1 = json::parse(slurp(dir / "j1.json")), j2 = json::parse(slurp(dir / "j2.json"));
  ASSERT_EQ(names(j2), names(j1));
  for (std::size_t i = 0; i < j1["cases"].size(); ++i)
    EXPECT_EQ(without_timings(j2["cases"][i]), without_timings(j1["cases"][i])) << j1["cases"][i]["name"];
  EXPECT_EQ(without_timings(j2), without_timings(j1));
  // the terminal too, line for line, once the times are cut: "(6 tensors, 3 ms)", "15 cases in 65 ms;"
  auto lines = [](const std::string& text) {
    const std::regex time(R"(\d+(\.\d+)? (ms|s)\b)");
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) out.push_back(std::regex_replace(l, time, "T"));
    return out;
  };
  EXPECT_EQ(lines(two.out), lines(one.out));
  EXPECT_EQ(two.err, "");  // no progress line off a terminal
  fs::remove_all(dir);
}

TEST(ShardMerge, ExitsThreeWhenAPluginCrashedInAnyShard) {
  const fs::path dir = fs::temp_directory_path() / ("headgrad_merge3_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  // throws, throws-core, segfaults: the segfault lands in shard 1 (cases 0 and 2), throws-core in shard 2
  const std::string suite = (fs::path(RUNNER_FIXTURES) / "misbehaving.yaml").string();
  for (const char* k : {"1", "2"}) {
    const Outcome r = headgrad({"run", suite, "--plugin-path", RUNNER_TEST_PLUGIN_DIR, "--filter", "[st]*", "--shard",
                                std::string(k) + "/2", "--json", (dir / (std::string(k) + ".json")).string()});
    EXPECT_EQ(r.code, 3) << r.out << r.err;
  }
  const Outcome m = headgrad({"merge", (dir / "2.json").string(), (dir / "1.json").string(), "-q"});
  EXPECT_EQ(m.code, 3) << m.out << m.err;
  EXPECT_NE(m.out.find("0 passed, 3 failed"), std::string::npos) << m.out;
  EXPECT_NE(m.out.find("plugin segfaults crashed with SIGSEGV (segmentation fault)"), std::string::npos) << m.out;
  fs::remove_all(dir);
}

// run_cases itself, with a check of our own: results in suite order whatever
// finishes first, a worker that dies gives its case an error and the rest run
// on, what a check throws reaches the caller.
class RunCases : public ::testing::Test {
 protected:
  RunCases()
      : suite_(headgrad::runner::parse_suite("cases:\n"
                                             "  - {name: slow, compare: [a, b], shape: {B: 1, T: 2, D: 4, H: 2}}\n"
                                             "  - {name: dies, compare: [a, b], shape: {B: 1, T: 2, D: 4, H: 2}}\n"
                                             "  - {name: quick, compare: [a, b], shape: {B: 1, T: 2, D: 4, H: 2}}\n"
                                             "  - {name: last, compare: [a, b], shape: {B: 1, T: 2, D: 4, H: 2}}\n",
                                             "inline.yaml")) {
    for (const auto& c : suite_.cases) cases_.push_back(&c);
    options_.jobs = 2;
    options_.on_case_done = [this](const headgrad::runner::CaseResult& r) { order_.push_back(r.spec.name); };
  }
  headgrad::runner::Suite suite_;
  std::vector<const headgrad::runner::CaseSpec*> cases_;
  headgrad::runner::RunOptions options_;
  std::vector<std::string> order_;
};

TEST_F(RunCases, ADeadWorkerFailsItsCaseOnlyAndResultsStayInOrder) {
  using namespace headgrad::runner;
  const auto results = run_cases(
      cases_,
      [](const CaseSpec& c, const RunOptions& o) {
        if (c.name == "slow") ::usleep(300 * 1000);  // finishes after quick and last
        if (c.name == "dies") std::abort();
        CaseResult r;
        r.spec = c;
        r.lhs_label = "a";
        r.rhs_label = "b";
        r.cause = (o.on_case_done ? "with the parent's callbacks, " : "") + std::string("ran in ") +
                  std::to_string(::getpid());  // (an EXPECT here would fail in the worker, unseen)
        return r;
      },
      options_);
  ASSERT_EQ(results.size(), 4u);
  EXPECT_EQ(order_, (std::vector<std::string>{"slow", "dies", "quick", "last"}));
  EXPECT_EQ(results[1].status, CaseStatus::error);
  EXPECT_EQ(results[1].cause, "the process running this case crashed with SIGABRT (aborted)");
  for (std::size_t i : {0u, 2u, 3u}) {
    EXPECT_EQ(results[i].status, CaseStatus::pass) << results[i].spec.name;
    EXPECT_EQ(results[i].cause.rfind("ran in ", 0), 0u) << results[i].cause;  // no callbacks in the worker
    EXPECT_NE(results[i].cause, "ran in " + std::to_string(::getpid())) << "not in a worker";
  }
}

TEST_F(RunCases, WhatACheckThrowsReachesTheCaller) {
  using namespace headgrad::runner;
  auto check = [](const CaseSpec& c, const RunOptions&) -> CaseResult {
    if (c.name == "quick") throw std::invalid_argument("quick: a bad case");
    CaseResult r;
    r.spec = c;
    return r;
  };
  try {
    run_cases(cases_, check, options_);
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "quick: a bad case");
  }
  // results before the throw were reported, none after it
  EXPECT_EQ(order_, (std::vector<std::string>{"slow", "dies"}));
}

// On a terminal (a pseudo-terminal here): one progress line on stderr, its
// counts never going back (workers draw none of their own), each drawing
// followed by a clear before anything else is written.
TEST(Progress, OnATerminalItCountsUpAndNeverMixesIntoReportLines) {
  int pty = -1;
  const pid_t pid = ::forkpty(&pty, nullptr, nullptr, nullptr);
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::unsetenv("GTEST_SHARD_INDEX");
    ::unsetenv("GTEST_TOTAL_SHARDS");
    ::unsetenv("HEADGRAD_PLUGIN_PATH");
    const std::string suite = (fs::path(RUNNER_FIXTURES) / "misbehaving.yaml").string();
    ::execl(HEADGRAD_EXE, HEADGRAD_EXE, "run", suite.c_str(), "--plugin-path", RUNNER_TEST_PLUGIN_DIR, "--timeout",
            "3", "-j", "2", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(pty, buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(pty);
  EXPECT_EQ(WEXITSTATUS(status), 3) << out;  // plugins crashed and hung
  const std::regex drawn(R"(\r\x1b\[K\[(\d+)/8\] (\d+) failed, \d+\.\d s)");
  std::size_t draws = 0;
  int last_done = 0;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), drawn); it != std::sregex_iterator(); ++it) {
    ++draws;
    const int done = std::stoi((*it)[1]);
    EXPECT_GE(done, last_done) << "the progress went back: " << it->str();
    last_done = done;
    const std::size_t end = static_cast<std::size_t>(it->position() + it->length());
    EXPECT_EQ(out.compare(end, 4, "\r\x1b[K"), 0) << "written after the progress line: " << out.substr(end, 60);
  }
  EXPECT_GE(draws, 2u) << out;  // the hanging case holds the run for 3 s
  EXPECT_NE(out.find("] 4 failed, "), std::string::npos) << out;  // while hangs runs: 4 errors so far
}

}  // namespace

}  // namespace test_runner_shard
