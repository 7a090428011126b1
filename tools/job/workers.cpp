#include "job/workers.hpp"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <thread>

#include <headgrad/child_process.hpp>
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
  ChildProcess process;
  std::optional<std::size_t> slot;  // the case it runs; none: idle
  Message wire;
};

// What a check threw, by kind, so that the parent rethrows the same kind (and
// main gives it the same exit code as a serial run would).
enum class Thrown : char {
  invalid_argument = 'I',  // bad input (ConfigError, NpyError, ...); a filesystem_error names a path, so it goes here too
  internal = 'S',          // InternalError: fork, pipe, poll
  out_of_memory = 'M',     // std::bad_alloc
  logic_error = 'L',       // a broken invariant
  runtime_error = 'R',     // the environment, or any other std::exception
  other = 'X',             // not a std::exception
};

Thrown thrown_kind(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::invalid_argument&) {
    return Thrown::invalid_argument;
  } catch (const std::filesystem::filesystem_error&) {
    return Thrown::invalid_argument;
  } catch (const InternalError&) {
    return Thrown::internal;
  } catch (const std::bad_alloc&) {
    return Thrown::out_of_memory;
  } catch (const std::logic_error&) {
    return Thrown::logic_error;
  } catch (const std::exception&) {
    return Thrown::runtime_error;
  } catch (...) {
    return Thrown::other;
  }
}

[[noreturn]] void rethrow(Thrown kind, const std::string& what) {
  switch (kind) {
    case Thrown::invalid_argument: throw std::invalid_argument(what);
    case Thrown::internal: throw InternalError(what);
    case Thrown::out_of_memory: throw std::bad_alloc();
    case Thrown::logic_error: throw std::logic_error(what);
    case Thrown::runtime_error: throw std::runtime_error(what);
    case Thrown::other: break;
  }
  throw InternalError(what);  // not a std::exception: nothing says it was the user's to fix
}

// In the worker: each case asked for, its result as CBOR ('R') or what it
// threw ('E', its kind, its message).
int worker_main(const ChildEnds& ends, const std::vector<const CaseSpec*>& cases, const CaseCheck& check,
                const RunOptions& options) {
  if (options.threads_per_case > 0)
    ::setenv("HEADGRAD_NUM_THREADS", std::to_string(options.threads_per_case).c_str(), 1);
  for (std::uint64_t slot = 0; read_exactly(ends.from_parent, &slot, sizeof slot) && slot < cases.size();) {
    std::string message;
    try {
      const auto cbor = nlohmann::json::to_cbor(case_report_json(check(*cases[slot], options), /*exact=*/true));
      message = 'R' + std::string(cbor.begin(), cbor.end());
    } catch (...) {
      const Thrown kind = thrown_kind(std::current_exception());
      std::string what = "a non-standard exception";
      try {
        throw;
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      message = std::string("E") + static_cast<char>(kind) + what;
    }
    std::cout.flush();
    std::cerr.flush();
    if (!send_message(ends.to_parent, message)) break;
  }
  return 0;
}

// The worker gets `options` without the callbacks: they are the parent's
// (its terminal, its progress line), not the worker's.
Worker start_worker(const std::vector<const CaseSpec*>& cases, const CaseCheck& check, const RunOptions& options) {
  RunOptions quiet = options;
  quiet.on_case_start = nullptr;
  quiet.on_case_done = nullptr;
  quiet.on_wait = nullptr;
  Worker w;
  w.process = ChildProcess::spawn({.to_parent = true, .from_parent = true},
                                  [&](const ChildEnds& ends) { return worker_main(ends, cases, check, quiet); });
  return w;
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

// The worker's complete answer for its case: the result, or (thrown) what
// check threw, with its kind.
CaseResult worker_result(const Worker& w, const CaseSpec& spec, std::optional<std::pair<Thrown, std::string>>& thrown) {
  const std::string message = w.wire.body();
  if (!message.empty() && message[0] == 'E') {
    const Thrown kind = message.size() > 1 ? static_cast<Thrown>(message[1]) : Thrown::other;
    std::string what = message.size() > 2 ? message.substr(2) : "case " + spec.name + " threw an exception without a message";
    thrown = {kind, what};
    return worker_error(spec, what);
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
  std::optional<std::pair<Thrown, std::string>> thrown;
  try {
    while (workers.size() < std::min(options.jobs, n)) workers.push_back(start_worker(cases, check, options));
    while (emitted < n) {
      for (Worker& w : workers) {
        if (w.slot || next >= n || thrown_at) continue;
        if (options.on_case_start) options.on_case_start(next, n, *cases[next]);
        const std::uint64_t slot = next;
        w.slot = next++;
        w.wire.wire.clear();
        // A dead worker: seen below, on its result pipe.
        write_all(w.process.to_child(), std::string_view(reinterpret_cast<const char*>(&slot), sizeof slot));
      }
      std::vector<pollfd> fds;
      for (const Worker& w : workers) fds.push_back({w.slot ? w.process.from_child() : -1, POLLIN, 0});  // idle: not polled
      if (poll_fds(fds, 200) == 0) {
        if (options.on_wait) options.on_wait();
        continue;
      }
      char chunk[1 << 16];
      for (std::size_t i = 0; i < workers.size(); ++i) {
        Worker& w = workers[i];
        if (!w.slot || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const ssize_t got = ::read(w.process.from_child(), chunk, sizeof chunk);
        if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (got > 0) w.wire.wire.append(chunk, static_cast<std::size_t>(got));
        if (got > 0 && !w.wire.complete()) continue;
        const std::size_t slot = *w.slot;
        w.slot.reset();
        if (w.wire.complete()) {
          std::optional<std::pair<Thrown, std::string>> what;
          done[slot] = worker_result(w, *cases[slot], what);
          if (what && (!thrown_at || slot < *thrown_at)) {
            thrown_at = slot;
            thrown = what;
          }
          continue;
        }
        // Died on this case: said how, and a new worker takes the remaining cases.
        ChildEnd end;
        end.wait_status = w.process.kill_and_reap();
        done[slot] = worker_error(*cases[slot], "the process running this case " + describe_end(end, end.exited() ? "without a result" : ""));
        w = start_worker(cases, check, options);
      }
      // In suite order: each result once every case before it is in.
      while (emitted < n && done[emitted] && (!thrown_at || emitted < *thrown_at)) {
        if (options.on_case_done) options.on_case_done(*done[emitted]);
        ++emitted;
      }
      if (thrown_at && emitted == *thrown_at) rethrow(thrown->first, thrown->second);
    }
  } catch (...) {
    workers.clear();  // each worker killed and reaped
    throw;
  }
  workers.clear();
  for (auto& r : done) results.push_back(std::move(*r));
  return results;
}

}  // namespace headgrad::runner
