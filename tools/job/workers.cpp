#include "job/workers.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <thread>

#include <headgrad/log.hpp>
#include <headgrad/parallel.hpp>
#include <nlohmann/json.hpp>

#include "case/select.hpp"
#include "report/report.hpp"

namespace headgrad::runner {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

// ---- parallel cases ----

namespace {

std::size_t cores() { return std::max(1u, std::thread::hardware_concurrency()); }

// HEADGRAD_NUM_THREADS when set to a whole number >= 1.
std::optional<std::size_t> threads_from_environment() {
  const char* env = std::getenv("HEADGRAD_NUM_THREADS");
  const auto n = env ? whole_number(env) : std::nullopt;
  return n && *n >= 1 ? n : std::nullopt;
}

}  // namespace

std::size_t default_jobs(std::size_t cases, bool isolate) {
  if (!isolate || cores() == 1 || cases < 4) return 1;
  const std::size_t threads = threads_from_environment().value_or(1);
  return std::clamp<std::size_t>(cores() / threads, 1, cases);
}

int threads_per_case(std::size_t jobs) {
  const std::size_t fit = std::max<std::size_t>(1, cores() / std::max<std::size_t>(1, jobs));
  return static_cast<int>(std::min(fit, threads_from_environment().value_or(fit)));
}

namespace {

// A forked worker: it reads case numbers (u64) on `command` and answers each
// with its result, length-first, on `result`. Forked once and kept for many
// cases, as a serial run keeps one process for all of them.
struct Worker {
  pid_t pid = -1;
  int command = -1, result = -1;
  std::optional<std::size_t> slot;  // the case it runs; none: idle
  std::string wire;
  bool complete() const {
    std::uint64_t n = 0;
    if (wire.size() < sizeof n) return false;
    std::memcpy(&n, wire.data(), sizeof n);
    return wire.size() - sizeof n >= n;
  }
};

bool write_all_to(int fd, const std::string& data) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

bool read_all_from(int fd, void* out, std::size_t size) {
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, static_cast<char*>(out) + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

// In the worker: each case asked for, its result as CBOR ('R') or what it threw ('E').
[[noreturn]] void worker_main(int command, int result, const std::vector<const CaseSpec*>& cases,
                              const CaseCheck& check, const RunOptions& options, pid_t parent) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the runner gone: its workers (and their sides) go too
  if (::getppid() != parent) ::_exit(0);
  if (options.threads_per_case > 0)
    ::setenv("HEADGRAD_NUM_THREADS", std::to_string(options.threads_per_case).c_str(), 1);
  for (std::uint64_t slot = 0; read_all_from(command, &slot, sizeof slot) && slot < cases.size();) {
    std::string message;
    try {
      const auto cbor = nlohmann::json::to_cbor(case_report_json(check(*cases[slot], options), /*exact=*/true));
      message = 'R' + std::string(cbor.begin(), cbor.end());
    } catch (const std::exception& e) {
      message = 'E' + std::string(e.what());
    } catch (...) {
      message = "Ea non-standard exception";
    }
    std::cout.flush();
    std::cerr.flush();
    const std::uint64_t length = message.size();
    if (!write_all_to(result, std::string(reinterpret_cast<const char*>(&length), sizeof length) + message)) break;
  }
  ::_exit(0);
}

// The worker gets `options` without the callbacks: they are the parent's
// (its terminal, its progress line), not the worker's.
Worker start_worker(const std::vector<const CaseSpec*>& cases, const CaseCheck& check, const RunOptions& options,
                    const std::vector<Worker>& others) {
  int cmd[2], res[2];
  if (::pipe2(cmd, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  if (::pipe2(res, O_CLOEXEC) != 0) {
    ::close(cmd[0]);
    ::close(cmd[1]);
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  set_num_threads(1);  // no pool threads across fork (see run_isolated in execute.cpp)
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    for (int fd : {cmd[0], cmd[1], res[0], res[1]}) ::close(fd);
    throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::signal(SIGPIPE, SIG_DFL);  // the parent ignores it (IgnoreSigpipe); the worker need not
    ::close(cmd[1]);
    ::close(res[0]);
    for (const Worker& w : others)  // the other workers' pipes are theirs
      for (int fd : {w.command, w.result})
        if (fd >= 0) ::close(fd);
    RunOptions quiet = options;
    quiet.on_case_start = nullptr;
    quiet.on_case_done = nullptr;
    quiet.on_wait = nullptr;
    worker_main(cmd[0], res[1], cases, check, quiet, parent);
  }
  ::close(cmd[0]);
  ::close(res[1]);
  Worker w;
  w.pid = pid;
  w.command = cmd[1];
  w.result = res[0];
  return w;
}

void stop_worker(Worker& w) {
  ::kill(w.pid, SIGKILL);
  ::close(w.command);
  ::close(w.result);
  int status = 0;
  while (::waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
  }
  w.command = w.result = -1;  // their numbers may be reused: never closed twice
}

// An error result for a case whose worker died (or sent nonsense), with why.
CaseResult worker_error(const CaseSpec& spec, const std::string& cause) {
  CaseResult r;
  r.spec = spec;
  r.spec.files.reset();
  r.lhs_label = spec.compare.at(0);
  r.rhs_label = spec.is_reference() ? spec.reference_text : spec.compare.at(1);
  r.status = CaseStatus::error;
  r.cause = cause;
  return r;
}

// The worker's complete answer for its case: the result, or (thrown) what check threw.
CaseResult worker_result(const Worker& w, const CaseSpec& spec, std::string& thrown) {
  const std::string message = w.wire.substr(sizeof(std::uint64_t));
  if (!message.empty() && message[0] == 'E') {
    thrown = message.size() > 1 ? message.substr(1) : "case " + spec.name + " threw an exception without a message";
    return worker_error(spec, thrown);
  }
  try {
    return case_result_from_json(nlohmann::json::from_cbor(message.substr(1)), &spec,
                                 "the result of case '" + spec.name + "'");
  } catch (const std::exception& e) {
    return worker_error(spec, std::string("the process running this case sent a malformed result (") + e.what() + ")");
  }
}

// While alive, SIGPIPE is ignored: a case number written to a worker that has
// just died fails with EPIPE (and the death is seen on its result pipe)
// instead of killing the runner.
class IgnoreSigpipe {
 public:
  IgnoreSigpipe() {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ignore, &previous_);
  }
  ~IgnoreSigpipe() { ::sigaction(SIGPIPE, &previous_, nullptr); }
  IgnoreSigpipe(const IgnoreSigpipe&) = delete;
  IgnoreSigpipe& operator=(const IgnoreSigpipe&) = delete;

 private:
  struct sigaction previous_ {};
};

}  // namespace

std::vector<CaseResult> run_cases(const std::vector<const CaseSpec*>& cases,
                                  const CaseCheck& check,
                                  const RunOptions& options) {
  std::vector<CaseResult> results;
  const std::size_t n = cases.size();
  if (options.jobs <= 1 || options.keep_tensors || !options.isolate || n <= 1) {
    for (std::size_t i = 0; i < n; ++i) {
      if (options.on_case_start) options.on_case_start(i, n, *cases[i]);
      results.push_back(check(*cases[i], options));
      if (options.on_case_done) options.on_case_done(results.back());
    }
    return results;
  }
  const IgnoreSigpipe no_sigpipe;
  std::vector<std::optional<CaseResult>> done(n);
  std::vector<Worker> workers;
  std::size_t next = 0, emitted = 0;
  // What the first case to throw threw (as check would have, serially): rethrown
  // once every case before it is reported; no case is started after it.
  std::optional<std::size_t> thrown_at;
  std::string thrown;
  try {
    while (workers.size() < std::min(options.jobs, n))
      workers.push_back(start_worker(cases, check, options, workers));
    while (emitted < n) {
      for (Worker& w : workers) {
        if (w.slot || next >= n || thrown_at) continue;
        if (options.on_case_start) options.on_case_start(next, n, *cases[next]);
        const std::uint64_t slot = next;
        w.slot = next++;
        w.wire.clear();
        write_all_to(w.command, std::string(reinterpret_cast<const char*>(&slot), sizeof slot));  // a dead worker: seen below
      }
      std::vector<pollfd> fds;
      for (const Worker& w : workers) fds.push_back({w.slot ? w.result : -1, POLLIN, 0});  // idle: not polled
      const int ready = ::poll(fds.data(), fds.size(), 200);
      if (ready < 0 && errno != EINTR) throw std::runtime_error(std::string("poll: ") + std::strerror(errno));
      if (ready <= 0) {
        if (options.on_wait) options.on_wait();
        continue;
      }
      char chunk[1 << 16];
      for (std::size_t i = 0; i < workers.size(); ++i) {
        Worker& w = workers[i];
        if (!w.slot || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const ssize_t got = ::read(w.result, chunk, sizeof chunk);
        if (got < 0 && errno == EINTR) continue;
        if (got > 0) w.wire.append(chunk, static_cast<std::size_t>(got));
        if (got > 0 && !w.complete()) continue;
        const std::size_t slot = *w.slot;
        w.slot.reset();
        if (w.complete()) {
          std::string what;
          done[slot] = worker_result(w, *cases[slot], what);
          if (!what.empty() && (!thrown_at || slot < *thrown_at)) {
            thrown_at = slot;
            thrown = what;
          }
          continue;
        }
        // Died on this case: said, and a new worker takes the remaining cases.
        stop_worker(w);
        done[slot] = worker_error(*cases[slot], "the process running this case ended without a result");
        w = start_worker(cases, check, options, workers);
      }
      // In suite order: each result once every case before it is in.
      while (emitted < n && done[emitted] && (!thrown_at || emitted < *thrown_at)) {
        if (options.on_case_done) options.on_case_done(*done[emitted]);
        ++emitted;
      }
      if (thrown_at && emitted == *thrown_at) throw std::invalid_argument(thrown);
    }
  } catch (...) {
    for (Worker& w : workers) stop_worker(w);
    throw;
  }
  for (Worker& w : workers) stop_worker(w);
  for (auto& r : done) results.push_back(std::move(*r));
  return results;
}

}  // namespace headgrad::runner
