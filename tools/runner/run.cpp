#include "runner/run.hpp"

#include <fnmatch.h>
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
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <thread>

#include <headgrad/log.hpp>
#include <headgrad/parallel.hpp>
#include <nlohmann/json.hpp>

#include "runner/report.hpp"

#include "runner/golden.hpp"

namespace headgrad::runner {

std::string_view case_status_name(CaseStatus s) {
  switch (s) {
    case CaseStatus::pass: return "pass";
    case CaseStatus::fail: return "fail";
    case CaseStatus::error: return "error";
    case CaseStatus::xfail: return "xfail";
    case CaseStatus::xpass: return "xpass";
  }
  return "?";
}

bool is_success(CaseStatus s) { return s == CaseStatus::pass || s == CaseStatus::xfail; }

double CaseResult::max_abs() const {
  double m = 0;
  for (const auto& t : tensors) {
    if (!t.problem.empty()) continue;
    if (std::isnan(t.max_abs)) return t.max_abs;
    m = std::max(m, t.max_abs);
  }
  return m;
}

std::size_t CaseResult::differing_tensors() const {
  std::size_t n = 0;
  for (const auto& t : tensors) n += t.allclose ? 0 : 1;
  return n;
}

std::size_t SuiteResult::count(CaseStatus s) const {
  std::size_t n = 0;
  for (const auto& c : cases) n += c.status == s ? 1 : 0;
  return n;
}

int SuiteResult::exit_code() const {
  if (count(CaseStatus::error) > 0) return 3;
  if (count(CaseStatus::fail) + count(CaseStatus::xpass) > 0) return 1;
  return 0;
}

MutationScore SuiteResult::mutation_score() const {
  MutationScore score;
  for (const auto& c : cases) {
    if (c.mutant.empty()) continue;
    ++score.mutants;
    const bool caught = c.status == CaseStatus::xfail || (c.status == CaseStatus::fail && c.differing_tensors() > 0);
    if (!caught) continue;
    ++score.caught;
    const std::string own = c.mutant.rfind("mutant_", 0) == 0 ? c.mutant.substr(7) : c.mutant;
    const std::string expected = c.spec.expect_diagnosis.empty() ? own : c.spec.expect_diagnosis;
    if (c.diagnosis && c.diagnosis->best() == expected) ++score.named;
  }
  return score;
}

bool glob_match(std::string_view pattern, std::string_view text) {
  return ::fnmatch(std::string(pattern).c_str(), std::string(text).c_str(), 0) == 0;
}

std::vector<const CaseSpec*> select_cases(const Suite& suite, const std::string& filter) {
  std::vector<const CaseSpec*> out;
  for (const auto& c : suite.cases)
    if (filter.empty() || filter == c.name || glob_match(filter, c.name) || glob_match(filter, c.base_name))
      out.push_back(&c);
  return out;
}

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

// ---- shards ----

namespace {

// A whole decimal number, nothing else ("3", not "3x", "-1" or "").
std::optional<std::size_t> whole_number(std::string_view text) {
  std::size_t n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return n;
}

std::uint64_t fnv1a(std::string_view bytes, std::uint64_t h = 14695981039346656037ull) {
  for (const char ch : bytes) {
    h ^= static_cast<unsigned char>(ch);
    h *= 1099511628211ull;
  }
  return h;
}

std::string hex16(std::uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace

ShardSpec parse_shard(std::string_view text) {
  const auto slash = text.find('/');
  const auto k = slash == std::string_view::npos ? std::nullopt : whole_number(text.substr(0, slash));
  const auto n = slash == std::string_view::npos ? std::nullopt : whole_number(text.substr(slash + 1));
  if (!k || !n || *n == 0 || *k == 0 || *k > *n)
    throw std::invalid_argument("--shard: expected K/N with 1 <= K <= N (shards are numbered from 1), got '" +
                                std::string(text) + "'");
  return {*k, *n};
}

std::optional<ShardSpec> shard_from_environment() {
  const char* index = std::getenv("GTEST_SHARD_INDEX");
  const char* total = std::getenv("GTEST_TOTAL_SHARDS");
  if (!index && !total) return std::nullopt;
  if (!index || !total)
    throw std::invalid_argument(std::string(index ? "GTEST_SHARD_INDEX is set but GTEST_TOTAL_SHARDS is not"
                                                  : "GTEST_TOTAL_SHARDS is set but GTEST_SHARD_INDEX is not"));
  const auto k = whole_number(index), n = whole_number(total);
  if (!k || !n || *n == 0 || *k >= *n)
    throw std::invalid_argument("GTEST_SHARD_INDEX=" + std::string(index) + " GTEST_TOTAL_SHARDS=" + total +
                                ": expected 0 <= GTEST_SHARD_INDEX < GTEST_TOTAL_SHARDS (0-based, as GoogleTest)");
  return ShardSpec{*k + 1, *n};
}

std::vector<const CaseSpec*> shard_cases(const std::vector<const CaseSpec*>& selected, ShardSpec shard) {
  std::vector<const CaseSpec*> out;
  for (std::size_t p = shard.index - 1; p < selected.size(); p += shard.count) out.push_back(selected[p]);
  return out;
}

namespace {

std::string case_key(const CaseSpec& c) {
  return c.name + '\0' + describe_case(c) + '\0' + join(c.compare) + '\0' + c.reference_text + '\0' +
         join(c.check) + '\0' + std::to_string(c.seed) + '\0' + (c.expect_fail ? "x" : "") + c.expect_diagnosis +
         '\0';
}

}  // namespace

std::string case_hash(const CaseSpec& c) { return hex16(fnv1a(case_key(c))); }

SuiteIdentity suite_identity(const Suite& suite, const std::vector<const CaseSpec*>& selected) {
  SuiteIdentity id;
  std::ifstream in(suite.file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  id.file_hash = hex16(fnv1a(bytes));
  std::uint64_t h = fnv1a("");
  for (const CaseSpec* c : selected) {
    const std::string key = case_key(*c);
    h = fnv1a(key, h);
    id.case_hashes.push_back(hex16(fnv1a(key)));
  }
  id.cases_hash = hex16(h);
  id.selected = selected.size();
  id.expanded = suite.cases.size();
  return id;
}

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

std::string not_loaded_cause(const std::string& name, const PluginRegistry& registry) {
  std::vector<std::string> names;
  std::string loaded;
  std::size_t mutants = 0;
  for (const auto& p : registry.plugins()) {
    names.push_back(p.info.name);
    if (p.info.mutant) ++mutants;
    else loaded += (loaded.empty() ? "" : ", ") + p.info.name;
  }
  if (mutants) loaded += (loaded.empty() ? "" : ", ") + std::to_string(mutants) + " mutants";
  const std::string near = closest_match(name, names);
  std::string cause = "plugin " + name + " is not loaded" + (near.empty() ? "" : " (did you mean '" + near + "'?)") +
                      "; loaded: " + (loaded.empty() ? "none" : loaded);
  for (const auto& r : registry.rejections()) cause += "; rejected " + r.file.string() + ": " + r.reason;
  return cause;
}

namespace {

void join_cause(std::string& cause, const std::string& more) {
  cause += (cause.empty() ? "" : "; ") + more;
}

}  // namespace

CaseResult run_case(const CaseSpec& spec, const PluginRegistry& registry, const RunOptions& options,
                    CaseInputs* inputs_out) {
  const auto t0 = Clock::now();
  CaseResult res;
  res.spec = spec;
  res.lhs_label = spec.compare.at(0);
  res.rhs_label = spec.is_reference() ? spec.reference_text : spec.compare.at(1);
  auto finish = [&](CaseStatus status) {
    res.status = status;
    if (spec.expect_fail && status == CaseStatus::fail) res.status = CaseStatus::xfail;
    if (spec.expect_fail && status == CaseStatus::pass) {
      res.status = CaseStatus::xpass;
      res.cause = "expected to fail (expect: {fail: true}), but every checked tensor matched";
    }
    if (res.status == CaseStatus::pass && !options.keep_tensors) {
      res.lhs.clear();
      res.rhs.clear();
    }
    res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    logging::runner()->debug("case '{}': {} in {:.3f} s", res.spec.name, case_status_name(res.status), res.seconds);
    return std::move(res);  // each caller returns right away
  };

  // A plugin the suite names but that is not loaded fails the case, not the suite.
  for (const auto& name : spec.compare) {
    if (registry.find(name)) continue;
    SideResult side;
    side.plugin = name;
    side.status = SideStatus::not_loaded;
    side.cause = not_loaded_cause(name, registry);
    join_cause(res.cause, side.cause);
    res.sides.push_back(side);
  }
  if (!res.sides.empty()) return finish(CaseStatus::error);
  for (const auto& name : spec.compare)
    if (registry.get(name).info.mutant) res.mutant = name;

  CaseInputs inputs;
  try {
    load_case_files(res.spec);  // a no-op when load_suite read them (dims filled in)
    inputs = make_inputs(res.spec);
  } catch (const std::exception& e) {
    res.cause = e.what();
    return finish(CaseStatus::error);
  }

  ExecOptions exec;
  exec.isolate = options.isolate;
  exec.timeout_s = options.timeout_s.value_or(spec.timeout_s);
  exec.on_wait = options.on_wait;
  for (const auto& name : spec.compare) res.sides.push_back(run_side(res.spec, inputs, registry.get(name), exec));
  std::optional<GoldenRun> golden;
  if (res.spec.relative_rule()) golden = run_golden(res.spec, inputs, registry, exec);

  bool plugin_error = false, wrong_output = false;
  for (const auto& s : res.sides) {
    if (s.status == SideStatus::ok) continue;
    join_cause(res.cause, s.cause);
    (is_plugin_error(s.status) ? plugin_error : wrong_output) = true;
  }
  // Tensors to compare exist unless a side failed to produce any.
  bool comparable = true;
  for (const auto& s : res.sides)
    comparable = comparable && (s.status == SideStatus::ok || s.status == SideStatus::non_finite);
  if (comparable) {
    res.lhs = std::move(res.sides[0].tensors);
    res.rhs = spec.is_reference() ? inputs.expected : std::move(res.sides[1].tensors);
    res.tensors = compare_sets(res.lhs, res.rhs, res.spec, res.lhs_label, res.rhs_label);
    if (golden && golden->cause.empty()) {
      judge_sides(res.tensors, res.spec, *golden, res.lhs, res.rhs, res.lhs_label, res.rhs_label);
      res.golden_label = golden->golden_label;
      res.baseline_label = golden->baseline_label;
    }
  }
  if (golden && !golden->cause.empty()) {
    join_cause(res.cause, golden->cause);
    if (golden->plugin_error) plugin_error = true;
    else wrong_output = true;
  }
  for (auto& s : res.sides) s.tensors.clear();
  if (inputs_out) *inputs_out = std::move(inputs);
  if (plugin_error) return finish(CaseStatus::error);
  if (wrong_output) return finish(CaseStatus::fail);

  std::string differing;
  for (const auto& t : res.tensors)
    if (!t.allclose) differing += (differing.empty() ? "" : ", ") + t.name;
  if (differing.empty()) return finish(CaseStatus::pass);
  res.cause = std::to_string(res.differing_tensors()) + " of " + std::to_string(res.tensors.size()) +
              " tensors differ: " + differing;
  return finish(CaseStatus::fail);
}

void keep_report_data(CaseResult& r, bool keep_tensors) {
  if (r.status != CaseStatus::pass) r.error_maps = error_maps(r.spec, r.tensors, r.lhs, r.rhs);
  r.spec.files.reset();  // the suite's to keep, not each result's
  if (keep_tensors) return;
  r.lhs = TensorSet();
  r.rhs = TensorSet();
}

}  // namespace headgrad::runner
