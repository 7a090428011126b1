// The child-process helper (headgrad/child_process.hpp) and what rests on it:
// one wording for how a child ended (the probe, a side and a -j worker say
// the same words for the same crash), a worker's exception rethrown as its
// own kind, and a fork that fails reported as headgrad's own failure (exit
// code 4), never as bad input; a child's later children keep the pipes it
// made (the -j 2 Python failure), a program exec'd with its pipes on stdin and
// stdout, a disowned child left alive.
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>
#include <headgrad/child_process.hpp>
#include <headgrad/loader.hpp>
#include <headgrad/parallel.hpp>
#include <nlohmann/json.hpp>

#include "exec/execute.hpp"
#include "headgrad_cli.hpp"
#include "job/workers.hpp"

namespace test_child_process {  // this file's names: test files share unity builds (tests/meson.build)

namespace fs = std::filesystem;
using namespace headgrad;
using namespace headgrad::runner;

// This binary's own fork(): the real one unless a test asks it to fail as a
// full process table does. headgrad's libraries call it in place of libc's.
namespace {
bool g_fork_fails = false;
}
extern "C" pid_t fork(void) {
  if (g_fork_fails) {
    errno = EAGAIN;
    return -1;
  }
  static auto real = reinterpret_cast<pid_t (*)()>(::dlsym(RTLD_NEXT, "fork"));
  return real();
}

namespace {

const std::string kSegv = "crashed with SIGSEGV (segmentation fault)";

class ForkFails {
 public:
  ForkFails() { g_fork_fails = true; }
  ~ForkFails() { g_fork_fails = false; }
};

[[noreturn]] void segfault() {
  ::signal(SIGSEGV, SIG_DFL);  // a real SIGSEGV with the default action, whatever a sanitizer installed
  ::raise(SIGSEGV);
  ::_exit(99);
}

ChildEnd run_to_end(const std::function<int(const ChildEnds&)>& body, double limit_s = 5) {
  ChildProcess child = ChildProcess::spawn({.to_parent = true}, body);
  Message m;
  const auto deadline = ChildProcess::Clock::now() +
                        std::chrono::duration_cast<ChildProcess::Clock::duration>(std::chrono::duration<double>(limit_s));
  return child.read_message(m, deadline, limit_s, 1 << 20).end;
}

}  // namespace

// ---- the helper and its words ----

TEST(ChildProcess, SaysHowAChildEndedInOneWording) {
  EXPECT_EQ(describe_end(run_to_end([](const ChildEnds&) -> int { segfault(); })), kSegv);
  EXPECT_EQ(describe_end(run_to_end([](const ChildEnds&) { return 3; })), "exited with status 3");
  EXPECT_EQ(describe_end(run_to_end([](const ChildEnds&) -> int { std::abort(); }), "in info()"),
            "crashed with SIGABRT (aborted) in info()");
  const auto t0 = std::chrono::steady_clock::now();
  const ChildEnd hung = run_to_end(
      [](const ChildEnds&) {
        ::pause();
        return 0;
      },
      0.3);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3.0);
  EXPECT_TRUE(hung.timed_out);
  EXPECT_EQ(describe_end(hung), "did not finish within 0.3 s; killed");
  EXPECT_EQ(describe_end(hung, "in info()"), "did not finish within 0.3 s (hung in info()); killed");
  EXPECT_EQ(signal_description(SIGBUS), "SIGBUS (bus error)");
}

TEST(ChildProcess, AMessageComesBackWholeAndTheChildStartsWithDefaultSignals) {
  // The parent ignores SIGTERM; the child must not (its actions are reset).
  struct sigaction ignore {}, previous {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGTERM, &ignore, &previous);
  ChildProcess child = ChildProcess::spawn({.to_parent = true}, [](const ChildEnds& ends) {
    struct sigaction now {};
    ::sigaction(SIGTERM, nullptr, &now);
    send_message(ends.to_parent, now.sa_handler == SIG_DFL ? std::string(100000, 'x') + "default" : "inherited");
    return 0;
  });
  ::sigaction(SIGTERM, &previous, nullptr);
  Message m;
  const auto r = child.read_message(m, ChildProcess::Clock::now() + std::chrono::seconds(5), 5, 1 << 20);
  ASSERT_TRUE(m.complete());
  EXPECT_FALSE(r.oversized);
  EXPECT_EQ(m.body(), std::string(100000, 'x') + "default");
  EXPECT_FALSE(child.running());
}

// Two messages in the pipe at once: read with last = false, the first comes
// back alone, the child still running; the second then ends it.
TEST(ChildProcess, MessagesOneAfterAnotherComeBackOneByOne) {
  ChildProcess child = ChildProcess::spawn({.to_parent = true}, [](const ChildEnds& ends) {
    std::string both;
    for (const std::string& body : {std::string(70000, 'a'), std::string("second")}) {
      const std::uint64_t n = body.size();
      both.append(reinterpret_cast<const char*>(&n), sizeof n).append(body);
    }
    write_all(ends.to_parent, both);  // one write: the second is in the pipe before the first is read
    return 0;
  });
  const auto deadline = ChildProcess::Clock::now() + std::chrono::seconds(5);
  Message first, second;
  const auto r1 = child.read_message(first, deadline, 5, 1 << 20, {}, /*last=*/false);
  ASSERT_TRUE(first.complete());
  EXPECT_FALSE(r1.oversized);
  EXPECT_EQ(first.wire.size(), sizeof(std::uint64_t) + 70000);
  EXPECT_EQ(first.body(), std::string(70000, 'a'));
  EXPECT_FALSE(child.status());  // not reaped
  const auto r2 = child.read_message(second, deadline, 5, 1 << 20);
  ASSERT_TRUE(second.complete());
  EXPECT_EQ(second.body(), "second");
  EXPECT_FALSE(child.running());
  EXPECT_TRUE(r2.end.exited() || r2.end.signaled());
}

// The pool is stopped across the fork and started again in the parent: after
// a child, the parent's parallel work runs on as many workers as before (it
// ran on one: the comparison, the next case's inputs, bench --check's GEMM).
TEST(ChildProcess, TheParentComputesOnItsWorkersAfterAChild) {
  const int before = num_threads();
  set_num_threads(2);
  ChildProcess child = ChildProcess::spawn({.to_parent = true}, [](const ChildEnds& ends) {
    send_message(ends.to_parent, "done");
    return 0;
  });
  Message m;
  child.read_message(m, ChildProcess::Clock::now() + std::chrono::seconds(5), 5, 1 << 10);
  ASSERT_TRUE(m.complete());
  EXPECT_EQ(num_threads(), 2);
  std::atomic<int> workers_seen{0};
  std::array<std::atomic<bool>, 2> seen{};
  parallel_for(2, [&](std::int64_t, std::int64_t, int w) {
    if (!seen[static_cast<std::size_t>(w)].exchange(true)) ++workers_seen;
  }, 1);
  EXPECT_EQ(workers_seen.load(), 2);
  set_num_threads(before);
}

TEST(ChildProcess, ABodyLongerThanAllowedIsCutShort) {
  ChildProcess child = ChildProcess::spawn({.to_parent = true}, [](const ChildEnds& ends) {
    send_message(ends.to_parent, std::string(200000, 'y'));
    return 0;
  });
  Message m;
  const auto r = child.read_message(m, ChildProcess::Clock::now() + std::chrono::seconds(5), 5, 1000);
  EXPECT_TRUE(r.oversized);
  EXPECT_FALSE(child.running());  // killed and reaped all the same
}

// Waits for the child to end (up to 10 s) and gives its status, reaped.
int wait_for(ChildProcess& c) {
  for (int i = 0; i < 1000 && !c.has_exited(); ++i) ::usleep(10000);
  const auto s = c.try_reap();
  return s ? *s : -1;
}

// What a child wrote to_parent until it closed the pipe (up to 10 s).
std::string read_all(ChildProcess& c, ChildProcess::Stream which = ChildProcess::Stream::from_child) {
  std::string out;
  for (int i = 0; i < 1000; ++i) {
    if (!c.drain(which, out)) break;
    ::usleep(10000);
  }
  return out;
}

// A -j worker is a child that forks children of its own. It closes the other
// children's pipes it inherited; the children it forks later must not close
// them again by number, now that the numbers may name its own pipes (its
// Python worker's, in the -j 2 failure this pins).
TEST(ChildProcess, AChildsLaterChildrenKeepPipesReusingTheNumbersOfItsSiblings) {
  ChildProcess sibling = ChildProcess::spawn({.to_parent = true}, [](const ChildEnds&) {
    ::pause();
    return 0;
  });
  const int sibling_fd = sibling.from_child();  // on the list of pipes later children close
  ASSERT_GE(sibling_fd, 0);
  ChildProcess worker = ChildProcess::spawn({}, [&](const ChildEnds&) {
    int p[2];
    if (::pipe(p) != 0) return 10;
    const int read_end = ::fcntl(p[0], F_DUPFD, 100);  // out of the way: pipe() may have reused that number
    if (read_end < 0 || ::dup2(p[1], sibling_fd) != sibling_fd) return 10;  // its own pipe, at that number
    ChildProcess grandchild = ChildProcess::spawn({}, [&](const ChildEnds&) {
      return ::write(sibling_fd, "x", 1) == 1 ? 0 : 11;  // 11: the number was closed in this child
    });
    const int status = wait_for(grandchild);
    char c = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return WIFEXITED(status) ? WEXITSTATUS(status) : 12;
    return ::read(read_end, &c, 1) == 1 && c == 'x' ? 0 : 13;
  });
  const int status = wait_for(worker);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "11: a grandchild closed its parent's own pipe by a sibling's stale number";
}

// spawn_program: from_parent is the program's stdin, to_parent its stdout,
// `env` replaces a variable, nothing else is open (0, 1, 2, and ls's own
// directory descriptor, 3).
TEST(ChildProcess, AProgramGetsThePipesOnStdinAndStdoutAndNothingElse) {
  ::setenv("HEADGRAD_TEST_VAR", "inherited", 1);
  ChildSpec spec;
  spec.to_parent = spec.from_parent = true;
  ChildProcess c = ChildProcess::spawn_program(
      spec, {"/bin/sh", "-c", "read line; echo \"$line $HEADGRAD_TEST_VAR\"; ls /proc/self/fd"},
      {{"HEADGRAD_TEST_VAR", "replaced"}});
  ASSERT_TRUE(write_all(c.to_child(), "hello\n"));
  c.close_to_child();
  EXPECT_EQ(read_all(c), "hello replaced\n0\n1\n2\n3\n");
  const int status = wait_for(c);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ::unsetenv("HEADGRAD_TEST_VAR");
}

TEST(ChildProcess, AProgramThatCannotRunExits127SayingWhy) {
  ChildSpec spec;
  spec.capture_stderr = true;
  ChildProcess c = ChildProcess::spawn_program(spec, {"/nonexistent/headgrad-test-program"});
  const std::string said = read_all(c, ChildProcess::Stream::err);
  const int status = wait_for(c);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 127) << status;
  EXPECT_NE(said.find("headgrad: cannot run /nonexistent/headgrad-test-program: No such file or directory"),
            std::string::npos) << said;
}

// A process forked from a child's owner disowns its copy: the child lives on.
TEST(ChildProcess, ADisownedChildIsNotKilled) {
  ChildProcess server = ChildProcess::spawn({.to_parent = true}, [](const ChildEnds&) {
    ::pause();
    return 0;
  });
  ChildProcess other = ChildProcess::spawn({}, [&](const ChildEnds&) {
    server.disown();
    return server.pid() == -1 && server.from_child() == -1 ? 0 : 1;  // and its destructor kills nothing
  });
  const int status = wait_for(other);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_TRUE(server.running());
  EXPECT_FALSE(server.has_exited());
}

// ---- the same crash, the same words: probe, side, worker ----

TEST(SameWords, ProbeSideAndWorkerDescribeASegfaultAlike) {
  PluginRegistry probed;
  probed.probe_directories({fs::path(HOSTILE_PLUGIN_DIR) / "segfault_in_info.so"});
  ASSERT_EQ(probed.rejections().size(), 1u);
  EXPECT_EQ(probed.rejections()[0].reason, kSegv + " in info()");

  const Suite suite = parse_suite(
      "suite: s\ncases:\n"
      "  - {name: a, compare: [segfaults, segfaults], shape: {B: 1, T: 2, D: 4, H: 2}}\n"
      "  - {name: b, compare: [segfaults, segfaults], shape: {B: 1, T: 2, D: 4, H: 2}}\n",
      "inline.yaml");
  PluginRegistry registry;
  registry.load_directories({fs::path(RUNNER_TEST_PLUGIN_DIR) / "segfaults.so"});
  const SideResult side = run_side(suite.cases[0], make_inputs(suite.cases[0]), registry.get("segfaults"), {});
  EXPECT_EQ(side.status, SideStatus::crashed);
  EXPECT_EQ(side.cause, "plugin segfaults " + kSegv);

  RunOptions options;
  options.jobs = 2;
  const auto results = run_cases({&suite.cases[0], &suite.cases[1]},
                                 [](const CaseSpec&, const RunOptions&) -> CaseResult { segfault(); }, options);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].cause, "the process running this case " + kSegv);
  EXPECT_EQ(results[1].cause, "the process running this case " + kSegv);
}

// ---- a worker's exception keeps its kind ----

class WorkerThrows : public ::testing::Test {
 protected:
  WorkerThrows()
      : suite_(parse_suite("suite: s\ncases:\n"
                           "  - {name: a, compare: [x, y], shape: {B: 1, T: 2, D: 4, H: 2}}\n"
                           "  - {name: b, compare: [x, y], shape: {B: 1, T: 2, D: 4, H: 2}}\n"
                           "  - {name: c, compare: [x, y], shape: {B: 1, T: 2, D: 4, H: 2}}\n",
                           "inline.yaml")) {
    for (const auto& c : suite_.cases) cases_.push_back(&c);
    options_.jobs = 2;
  }
  // run_cases where case b throws what `thrower` throws.
  void run(void (*thrower)()) {
    run_cases(
        cases_,
        [thrower](const CaseSpec& c, const RunOptions&) {
          if (c.name == "b") thrower();
          CaseResult r;
          r.spec = c;
          return r;
        },
        options_);
  }
  Suite suite_;
  std::vector<const CaseSpec*> cases_;
  RunOptions options_;
};

TEST_F(WorkerThrows, EachKindComesBackAsItself) {
  try {
    run([] { throw ConfigError({"suite.yaml", 3, 5}, "a bad key"); });
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "suite.yaml:3:5: a bad key");
  }
  try {
    run([] { throw InternalError("pipe: Too many open files"); });
    ADD_FAILURE() << "no exception";
  } catch (const InternalError& e) {
    EXPECT_STREQ(e.what(), "pipe: Too many open files");
  }
  EXPECT_THROW(run([] { throw std::bad_alloc(); }), std::bad_alloc);
  try {
    run([] { throw std::out_of_range("at: index [9] out of range"); });
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument&) {
    ADD_FAILURE() << "a broken invariant came back as bad input";
  } catch (const std::logic_error& e) {
    EXPECT_STREQ(e.what(), "at: index [9] out of range");
  }
  try {
    run([] { throw std::runtime_error("no such device"); });
    ADD_FAILURE() << "no exception";
  } catch (const InternalError&) {
    ADD_FAILURE() << "a runtime_error came back as an InternalError";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "no such device");
  }
  EXPECT_THROW(run([] { throw 42; }), InternalError);  // not a std::exception: not the user's to fix
}

// ---- fork fails: headgrad's own failure ----

TEST(ForkFailure, EveryForkingCallerThrowsInternalErrorNamingFork) {
  const Suite suite = parse_suite(
      "suite: s\ncases:\n"
      "  - {name: a, compare: [segfaults, segfaults], shape: {B: 1, T: 2, D: 4, H: 2}}\n"
      "  - {name: b, compare: [segfaults, segfaults], shape: {B: 1, T: 2, D: 4, H: 2}}\n",
      "inline.yaml");
  PluginRegistry registry;
  registry.load_directories({fs::path(RUNNER_TEST_PLUGIN_DIR) / "segfaults.so"});
  const CaseInputs in = make_inputs(suite.cases[0]);
  const ForkFails fails;
  const std::string expected = std::string("fork: ") + std::strerror(EAGAIN);
  try {
    run_side(suite.cases[0], in, registry.get("segfaults"), {});
    ADD_FAILURE() << "no exception";
  } catch (const InternalError& e) {
    EXPECT_EQ(e.what(), expected);
  }
  RunOptions options;
  options.jobs = 2;
  try {
    run_cases({&suite.cases[0], &suite.cases[1]}, [](const CaseSpec& c, const RunOptions&) {
                CaseResult r;
                r.spec = c;
                return r;
              },
              options);
    ADD_FAILURE() << "no exception";
  } catch (const InternalError& e) {
    EXPECT_EQ(e.what(), expected);
  }
  PluginRegistry probed;
  try {
    probed.probe_directories({fs::path(RUNNER_TEST_PLUGIN_DIR) / "segfaults.so"});
    ADD_FAILURE() << "no exception";
  } catch (const InternalError& e) {
    EXPECT_EQ(e.what(), expected);
  }
}

// The program under an LD_PRELOAD shim whose fork() fails: exit 4 naming
// fork, not 2 (bad input) nor 3 (a plugin's fault). Every fork failing, the
// first is a probe's; with as many allowed as libraries are probed, a side's.
TEST(ForkFailure, TheProgramExitsFourNamingFork) {
  // Under ASan the shim comes before its runtime: allowed, the rest of the options kept.
  const char* asan = std::getenv("ASAN_OPTIONS");
  const std::string asan_options = (asan ? std::string(asan) + ":" : "") + "verify_asan_link_order=0";
  const auto listed = headgrad::test::headgrad({"plugins", "--all", "--json"});
  ASSERT_EQ(listed.code, 0) << listed.err;
  const auto j = nlohmann::json::parse(listed.out);
  std::size_t probed = j["plugins"].size();
  for (const auto& r : j["rejected"]) probed += r["not_a_plugin"].get<bool>() ? 0 : 1;

  const std::string suite = (fs::path(RUNNER_FIXTURES) / "pass.yaml").string();
  const std::string no_fork = std::string("fork: ") + std::strerror(EAGAIN) + " (headgrad could not do its own work)";
  for (const std::size_t allowed : {std::size_t{0}, probed}) {
    SCOPED_TRACE(allowed);
    const auto r = headgrad::test::headgrad(
        {"run", suite, "--filter", "closed-book"}, fs::current_path(),
        {{"LD_PRELOAD", FORK_FAILS_SHIM}, {"HEADGRAD_TEST_FORKS_ALLOWED", std::to_string(allowed)},
         {"ASAN_OPTIONS", asan_options}});
    EXPECT_EQ(r.code, 4) << r.out << r.err;
    EXPECT_NE(r.err.find("headgrad: error: " + no_fork), std::string::npos) << r.err;
    // Probing done (the header is printed after it): the fork that failed was the side's.
    if (allowed > 0) {
      EXPECT_NE(r.out.find("plugins: per_head"), std::string::npos) << r.out;
    }
  }
  const auto plugins = headgrad::test::headgrad({"plugins"}, fs::current_path(),
                                                {{"LD_PRELOAD", FORK_FAILS_SHIM}, {"ASAN_OPTIONS", asan_options}});
  EXPECT_EQ(plugins.code, 4) << plugins.out << plugins.err;
  EXPECT_NE(plugins.err.find(no_fork), std::string::npos) << plugins.err;
}

}  // namespace test_child_process
