// The one fork of headgrad (see child_process.hpp), and the words for how a
// child ended.
#include "headgrad/child_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include "headgrad/parallel.hpp"

namespace headgrad {

void throw_system_failure(const std::string& what) {
  throw InternalError(what + ": " + std::strerror(errno));
}

bool ChildEnd::signaled() const { return !timed_out && WIFSIGNALED(wait_status); }
int ChildEnd::signal() const { return WTERMSIG(wait_status); }
bool ChildEnd::exited() const { return !timed_out && WIFEXITED(wait_status); }
int ChildEnd::exit_status() const { return WEXITSTATUS(wait_status); }

std::string signal_description(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  if (!abbrev) return "signal " + std::to_string(sig);
  std::string out = std::string("SIG") + abbrev;
  if (const char* d = ::sigdescr_np(sig)) {
    std::string words = d;
    std::transform(words.begin(), words.end(), words.begin(), [](unsigned char c) { return std::tolower(c); });
    out += " (" + words + ")";
  }
  return out;
}

std::string format_seconds(double s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

std::string describe_end(const ChildEnd& end, std::string_view context) {
  std::string out;
  if (end.timed_out) {
    out.append("did not finish within ").append(format_seconds(end.limit_s)).append(" s");
    if (!context.empty()) out.append(" (hung ").append(context).append(")");
    return out.append("; killed");
  }
  if (end.signaled()) out.append("crashed with ").append(signal_description(end.signal()));
  else if (end.exited()) out.append("exited with status ").append(std::to_string(end.exit_status()));
  else out.append("ended with wait status ").append(std::to_string(end.wait_status));
  if (!context.empty()) out.append(" ").append(context);
  return out;
}

namespace {

// The parent's ends of the pipes of every live child: a new child closes them
// (they are the other children's business, and a child holding one open would
// hide the other child's end of file).
std::mutex g_fds_mutex;
std::vector<int> g_parent_fds;

void remember_fd(int fd) {
  std::lock_guard lock(g_fds_mutex);
  g_parent_fds.push_back(fd);
}

void close_and_forget(int& fd) {
  if (fd < 0) return;
  {
    std::lock_guard lock(g_fds_mutex);
    g_parent_fds.erase(std::remove(g_parent_fds.begin(), g_parent_fds.end(), fd), g_parent_fds.end());
  }
  ::close(fd);
  fd = -1;
}

struct Pipe {
  int read = -1, write = -1;
};

void close_pipe(Pipe& p) {
  for (int* fd : {&p.read, &p.write})
    if (*fd >= 0) ::close(*fd), *fd = -1;
}

// Moves fd to `target` exactly (target >= 3), or above 10 when target < 0.
int place(int fd, int target) {
  if (fd < 0) return -1;
  if (target < 0) return ::fcntl(fd, F_DUPFD, 10);
  if (fd == target) return fd;
  return ::dup2(fd, target);
}

[[noreturn]] void child_main(const ChildSpec& spec, Pipe to_parent, Pipe from_parent, Pipe out, Pipe err,
                             const std::vector<int>& others, pid_t parent,
                             const std::function<int(const ChildEnds&)>& body) {
  ::setpgid(0, 0);  // its own group: whatever it forks is killed with it
  for (int sig = 1; sig < NSIG; ++sig)
    if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);  // glibc's reserved ones fail: harmless
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // headgrad gone (Ctrl-C, killed): the child goes too
  if (::getppid() != parent) ::_exit(0);  // it went before prctl took effect
  const struct rlimit no_core = {0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);  // a crashing plugin leaves no core file behind
  for (int fd : others) ::close(fd);
  // This process's copy of the list names descriptors it has just closed; a
  // child it forks later must not close whatever reuses those numbers (a -j
  // worker's Python worker pipes did, and its sides found them closed).
  g_parent_fds.clear();
  for (int fd : {to_parent.read, from_parent.write, out.read, err.read})
    if (fd >= 0) ::close(fd);
  // Above the standard descriptors first, so that the dup2s below cannot clobber them.
  int up = place(to_parent.write, -1), down = place(from_parent.read, -1);
  const int printed = place(out.write, -1), said = place(err.write, -1);
  const int devnull = spec.null_stdin ? ::open("/dev/null", O_RDONLY) : -1;
  if ((to_parent.write >= 0 && up < 0) || (from_parent.read >= 0 && down < 0) || (out.write >= 0 && printed < 0) ||
      (err.write >= 0 && said < 0) || (spec.null_stdin && devnull < 0))
    ::_exit(120);
  if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
  if (printed >= 0) ::dup2(printed, STDOUT_FILENO);
  if (said >= 0) ::dup2(said, STDERR_FILENO);
  int next = 3;
  if (spec.to_parent_fd >= 3 && up >= 0) {
    up = ::dup2(up, spec.to_parent_fd);
    next = spec.to_parent_fd + 1;
  }
  if (spec.close_other_fds) {
    // The child's own ends packed at next, next + 1, ..., then the rest closed.
    if (up >= 0 && up >= next) up = ::dup2(up, next++);
    if (down >= 0) down = ::dup2(down, next++);
    ::close_range(static_cast<unsigned>(next), ~0U, 0);
  }
  int rc = 125;
  try {
    rc = body(ChildEnds{up, down});
  } catch (...) {
  }
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  ::_exit(rc);  // no static destructors, no atexit handlers of the parent's state
}

}  // namespace

ChildProcess ChildProcess::spawn(const ChildSpec& spec, const std::function<int(const ChildEnds&)>& body) {
  Pipe pipes[4];  // to_parent, from_parent, stdout, stderr
  const bool wanted[4] = {spec.to_parent, spec.from_parent, spec.capture_stdout, spec.capture_stderr};
  for (int i = 0; i < 4; ++i) {
    if (!wanted[i]) continue;
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      const int saved = errno;
      for (auto& p : pipes) close_pipe(p);
      errno = saved;
      throw_system_failure("pipe");
    }
    pipes[i] = {fds[0], fds[1]};
  }
  // !! A forked child inherits the pool's bookkeeping but not its threads,
  // and would wait for them forever: no workers in this process across fork. !!
  const int threads = num_threads();
  set_num_threads(1);
  std::cout.flush();  // anything buffered now would be printed twice (once by the child)
  std::cerr.flush();
  std::fflush(nullptr);
  std::vector<int> others;
  {
    std::lock_guard lock(g_fds_mutex);
    others = g_parent_fds;
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) child_main(spec, pipes[0], pipes[1], pipes[2], pipes[3], others, parent, body);
  set_num_threads(threads);  // this process computes on as before (the comparison, the next inputs)
  if (pid < 0) {
    const int saved = errno;
    for (auto& p : pipes) close_pipe(p);
    errno = saved;
    throw_system_failure("fork");
  }
  ::setpgid(pid, pid);  // the child does it too; whichever runs first
  ChildProcess c;
  c.pid_ = pid;
  const bool remember = !spec.shared_with_later_children;
  for (int i : {0, 2, 3}) {
    if (pipes[i].write >= 0) ::close(pipes[i].write);
    if (pipes[i].read >= 0) {
      ::fcntl(pipes[i].read, F_SETFL, O_NONBLOCK);
      if (remember) remember_fd(pipes[i].read);
    }
  }
  if (pipes[1].read >= 0) ::close(pipes[1].read);
  if (pipes[1].write >= 0 && remember) remember_fd(pipes[1].write);
  c.from_child_ = pipes[0].read;
  c.to_child_ = pipes[1].write;
  c.stdout_ = pipes[2].read;
  c.stderr_ = pipes[3].read;
  return c;
}

ChildProcess ChildProcess::spawn_program(const ChildSpec& spec, const std::vector<std::string>& argv,
                                         const std::vector<std::pair<std::string, std::string>>& env) {
  if (argv.empty()) throw std::logic_error("ChildProcess::spawn_program: no program");
  // Everything exec needs is made here, before the fork.
  std::vector<std::string> vars;
  for (char** e = environ; *e; ++e) {
    const std::string_view v(*e);
    const auto name = v.substr(0, v.find('='));
    if (std::none_of(env.begin(), env.end(), [&](const auto& kv) { return kv.first == name; })) vars.emplace_back(v);
  }
  for (const auto& [name, value] : env) vars.push_back(name + "=" + value);
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  for (const auto& v : vars) envp.push_back(const_cast<char*>(v.c_str()));
  args.push_back(nullptr);
  envp.push_back(nullptr);
  const std::string failed = "headgrad: cannot run " + argv[0] + ": ";
  ChildProcess c = spawn(spec, [&](const ChildEnds& ends) {
    // The ends are at 3 or above (spawn placed them), so the dup2s clobber nothing.
    if (ends.from_parent >= 0) ::dup2(ends.from_parent, STDIN_FILENO);
    if (ends.to_parent >= 0) ::dup2(ends.to_parent, STDOUT_FILENO);
    ::close_range(3, ~0U, 0);
    ::execvpe(args[0], args.data(), envp.data());
    const std::string msg = failed + std::strerror(errno) + "\n";
    (void)!::write(STDERR_FILENO, msg.data(), msg.size());
    return 127;
  });
  return c;
}

void ChildProcess::disown() {
  close_all();
  pid_ = -1;
  status_.reset();
}

ChildProcess::ChildProcess(ChildProcess&& o) noexcept { *this = std::move(o); }

ChildProcess& ChildProcess::operator=(ChildProcess&& o) noexcept {
  if (this == &o) return *this;
  if (running()) kill_and_reap();
  close_all();
  pid_ = std::exchange(o.pid_, -1);
  from_child_ = std::exchange(o.from_child_, -1);
  to_child_ = std::exchange(o.to_child_, -1);
  stdout_ = std::exchange(o.stdout_, -1);
  stderr_ = std::exchange(o.stderr_, -1);
  status_ = std::exchange(o.status_, std::nullopt);
  return *this;
}

ChildProcess::~ChildProcess() {
  if (running()) kill_and_reap();
  close_all();
}

void ChildProcess::close_all() {
  for (int* fd : {&from_child_, &to_child_, &stdout_, &stderr_}) close_and_forget(*fd);
}
void ChildProcess::close_from_child() { close_and_forget(from_child_); }
void ChildProcess::close_to_child() { close_and_forget(to_child_); }
void ChildProcess::close_stdout() { close_and_forget(stdout_); }
void ChildProcess::close_stderr() { close_and_forget(stderr_); }

bool ChildProcess::has_exited() const {
  if (status_) return true;
  siginfo_t info{};
  return ::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid_;
}

std::optional<int> ChildProcess::try_reap() {
  if (status_ || pid_ <= 0) return status_;
  int status = 0;
  const pid_t w = ::waitpid(pid_, &status, WNOHANG);
  if (w == pid_) status_ = status;
  else if (w < 0 && errno == ECHILD) status_ = 0;  // reaped elsewhere (SIGCHLD ignored): judged by what it sent
  return status_;
}

bool ChildProcess::group_alive() const { return pid_ > 0 && ::kill(-pid_, 0) == 0; }

int ChildProcess::kill_and_reap() {
  if (pid_ <= 0) return 0;
  // Its pid and group id are not reused while it is a zombie, nor this quickly
  // after (pids are handed out in turn).
  ::kill(-pid_, SIGKILL);
  if (!status_) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    pid_t w;
    while ((w = ::waitpid(pid_, &status, 0)) < 0 && errno == EINTR) {
    }
    status_ = w == pid_ ? status : 0;
  }
  return *status_;
}

bool ChildProcess::drain(Stream which, std::string& into, std::size_t cap, bool keep_tail, bool* overflow) {
  int& fd = which == Stream::from_child ? from_child_ : which == Stream::out ? stdout_ : stderr_;
  if (fd < 0) return false;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      into.append(buf, static_cast<std::size_t>(n));
      if (into.size() > cap) {
        if (keep_tail) {
          into.erase(0, into.size() - cap);
        } else {
          if (overflow) *overflow = true;
          into.resize(cap);
        }
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    close_and_forget(fd);
    return false;
  }
}

ChildProcess::ReadOutcome ChildProcess::read_message(Message& into, Clock::time_point deadline, double limit_s,
                                                     std::uint64_t max_bytes, const std::function<void()>& on_wait,
                                                     bool last) {
  ReadOutcome res;
  auto remaining_ms = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  };
  bool timed_out = false;
  // A pipe hands over at most its capacity (64 KiB) per read. Not a larger
  // heap buffer: after a fork, each first write to it is a copy-on-write fault.
  char chunk[1 << 16];
  bool reserved = false;
  while (from_child_ >= 0 && !into.complete()) {
    const auto ms = remaining_ms();
    if (ms <= 0) {
      timed_out = true;
      break;
    }
    // Asked before polling: once the child has ended, everything it wrote is
    // in the pipe, so a poll that finds nothing means there is nothing more.
    const bool exited = has_exited();
    std::vector<pollfd> p{{from_child_, POLLIN, 0}};
    const int ready = poll_fds(p, exited ? 0 : static_cast<int>(std::min<long long>(ms, 200)));
    if (ready == 0) {
      if (exited) break;  // ended without closing the pipe: a process it forked holds the other end
      if (on_wait) on_wait();
      continue;
    }
    // Never past this message's end: the next one (last == false) stays in the pipe.
    const auto length = into.length();
    const std::size_t want = length ? std::min<std::uint64_t>(sizeof chunk, sizeof *length + *length - into.wire.size())
                                    : sizeof(std::uint64_t) - into.wire.size();
    const ssize_t n = ::read(from_child_, chunk, want);
    if (n > 0) {
      into.wire.append(chunk, static_cast<std::size_t>(n));
      const auto length = into.length();
      if ((length && *length > max_bytes) || into.wire.size() > max_bytes + sizeof(std::uint64_t)) {
        res.oversized = true;
        break;
      }
      if (length && !reserved) {  // once: no copy of what came so far each time the buffer doubles
        into.wire.reserve(sizeof *length + *length);
        reserved = true;
      }
    } else if (n == 0) {
      break;  // the child closed its end: done (or dead)
    } else if (errno != EINTR && errno != EAGAIN) {
      break;
    }
  }
  const bool got = !res.oversized && into.complete();
  if (got && !last) return res;  // the child goes on to its next message
  close_from_child();
  // No message, but the pipe is closed: let the child finish dying (a crash is
  // reported as its own signal, not as our SIGKILL).
  while (!got && !timed_out && !has_exited()) {
    if (remaining_ms() <= 0) timed_out = true;
    else std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  res.end.wait_status = kill_and_reap();  // finished or not: the whole group goes
  res.end.timed_out = timed_out && !got;
  res.end.limit_s = limit_s;
  return res;
}

std::optional<std::uint64_t> ChildProcess::Message::length() const {
  std::uint64_t n = 0;
  if (wire.size() < sizeof n) return std::nullopt;
  std::memcpy(&n, wire.data(), sizeof n);
  return n;
}

bool ChildProcess::Message::complete() const {
  const auto n = length();
  return n && wire.size() - sizeof *n >= *n;
}

std::string ChildProcess::Message::body() const { return wire.substr(sizeof(std::uint64_t), *length()); }

std::string& ChildProcess::Message::take_body() {
  const std::uint64_t n = *length();
  wire.erase(0, sizeof n);
  wire.resize(n);
  return wire;
}

bool write_all(int fd, std::string_view data) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;  // the other end is gone (or gave up)
    done += static_cast<std::size_t>(n);
  }
  return true;
}

bool send_message(int fd, std::string_view body) {
  const std::uint64_t length = body.size();
  return write_all(fd, std::string_view(reinterpret_cast<const char*>(&length), sizeof length)) &&
         write_all(fd, body);
}

bool read_exactly(int fd, void* out, std::size_t size) {
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, static_cast<char*>(out) + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

int poll_fds(std::vector<pollfd>& fds, int timeout_ms) {
  const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
  if (ready < 0 && errno == EINTR) return 0;
  if (ready < 0) throw_system_failure("poll");
  return ready;
}

}  // namespace headgrad
