// Forked probes: start a child per library (a few at a time), collect what it
// writes, and turn a crash, a hang, an exit or garbage into a sentence.
//
// The records on the pipe: "<key> <length>\n<value>\n", values of at most
// kMaxValue bytes, at most kMaxAnswer bytes in all.
#include "plugin/probe.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>

#include "headgrad/abi.hpp"

namespace headgrad::detail {

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kMaxValue = 64 * 1024;
constexpr std::size_t kMaxAnswer = 1024 * 1024;
constexpr std::size_t kStderrKept = 4096;
constexpr int kChannelFd = 3;

void write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // the parent went away: nothing to tell it
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

// Control characters and bytes that are not printable ASCII, as \xNN: what a
// library writes must not forge lines in headgrad's output.
std::string printable(std::string_view s) {
  std::string out;
  for (const unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

// The last non-empty line of what the child wrote on stderr, shortened.
std::string last_line(const std::string& err) {
  std::size_t end = err.size();
  while (end > 0 && (err[end - 1] == '\n' || err[end - 1] == '\r')) --end;
  const std::size_t start = err.rfind('\n', end == 0 ? 0 : end - 1);
  std::string line = err.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1));
  if (line.size() > 200) line = line.substr(0, 200) + "...";
  return printable(line);
}

struct Parsed {
  bool garbage = false;
  bool ended = false;
  std::string stage;  // the last one announced
  std::map<std::string, std::vector<std::string>> fields;
};

Parsed parse(const std::string& buf) {
  Parsed p;
  std::size_t i = 0;
  while (i < buf.size()) {
    const std::size_t sp = buf.find(' ', i);
    if (sp == std::string::npos || sp - i > 32 || sp == i) {
      p.garbage = p.garbage || sp != std::string::npos || buf.size() - i > 32;
      return p;  // a record cut short (the child died while writing) or junk
    }
    const std::string key = buf.substr(i, sp - i);
    if (!std::all_of(key.begin(), key.end(), [](char c) { return (c >= 'a' && c <= 'z') || c == '_' || c == '.'; })) {
      p.garbage = true;
      return p;
    }
    const std::size_t nl = buf.find('\n', sp + 1);
    if (nl == std::string::npos) return p;
    const std::string len_text = buf.substr(sp + 1, nl - sp - 1);
    if (len_text.empty() || len_text.size() > 6 ||
        !std::all_of(len_text.begin(), len_text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      p.garbage = true;
      return p;
    }
    const std::size_t len = std::stoul(len_text);
    if (len > kMaxValue) {
      p.garbage = true;
      return p;
    }
    if (nl + 1 + len + 1 > buf.size()) return p;
    if (buf[nl + 1 + len] != '\n') {
      p.garbage = true;
      return p;
    }
    std::string value = buf.substr(nl + 1, len);
    i = nl + 1 + len + 1;
    if (p.ended) {
      p.garbage = true;  // nothing may follow "end"
      return p;
    }
    if (key == "stage") p.stage = std::move(value);
    else if (key == "end") p.ended = true;
    else p.fields[key].push_back(std::move(value));
  }
  return p;
}

struct Running {
  std::size_t index = 0;
  pid_t pid = -1;
  int out_fd = -1, err_fd = -1, stdout_fd = -1;  // the channel, the child's stderr and stdout
  std::string out, err, printed;
  Clock::time_point deadline;
  bool overflow = false;
  bool left_a_process = false;  // something of its process group outlived the child
};

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Reads what is there without blocking; false at end of file or error.
bool drain(int& fd, std::string& into, std::size_t cap, bool keep_tail, bool& overflow) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      into.append(buf, static_cast<std::size_t>(n));
      if (into.size() > cap) {
        if (keep_tail) into.erase(0, into.size() - cap);
        else {
          overflow = true;
          into.resize(cap);
        }
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    close_fd(fd);
    return false;
  }
}

void drain_all(Running& r) {
  bool ignored = false;
  if (r.out_fd >= 0) drain(r.out_fd, r.out, kMaxAnswer, false, r.overflow);
  if (r.err_fd >= 0) drain(r.err_fd, r.err, kStderrKept, true, ignored);
  if (r.stdout_fd >= 0) drain(r.stdout_fd, r.printed, kStderrKept, false, ignored);
}

[[noreturn]] void child_main(const std::filesystem::path& file, int out_w, int err_w, int stdout_w,
                             const std::function<void(const std::filesystem::path&, ProbeChannel&)>& body) {
  ::setpgid(0, 0);
  for (int sig : {SIGINT, SIGTERM, SIGPIPE, SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGCHLD, SIGALRM})
    ::signal(sig, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  // Above the standard descriptors first, so that the dup2s below cannot clobber them.
  const int out = ::fcntl(out_w, F_DUPFD, 10), err = ::fcntl(err_w, F_DUPFD, 10);
  const int printed = ::fcntl(stdout_w, F_DUPFD, 10);
  const int devnull = ::open("/dev/null", O_RDWR);
  if (out < 0 || err < 0 || printed < 0 || devnull < 0) ::_exit(120);
  ::dup2(devnull, STDIN_FILENO);
  ::dup2(printed, STDOUT_FILENO);
  ::dup2(err, STDERR_FILENO);
  ::dup2(out, kChannelFd);
  ::close_range(kChannelFd + 1, ~0U, 0);
  ProbeChannel channel(kChannelFd);
  body(file, channel);
  channel.put("end", "");
  ::_exit(0);  // no static destructors, no atexit handlers of the library
}

std::string signal_name(int sig) {
  const char* d = ::strsignal(sig);
  return "signal " + std::to_string(sig) + (d ? std::string(" (") + d + ")" : "");
}

ProbeOutcome finish(const Running& r, std::optional<int> status, double timeout_s) {
  ProbeOutcome o;
  const Parsed p = parse(r.out);
  std::string where(" ");
  where.append(stage_phrase(p.stage));
  const std::string words = last_line(r.err);
  std::string said;
  if (!words.empty()) said.append("; its last words on stderr: ").append(words);
  if (!status) {
    char t[32];
    std::snprintf(t, sizeof t, "%g", timeout_s);
    o.failure = std::string("did not answer within ") + t + " s (hung" + where + "); killed" + said;
  } else if (WIFSIGNALED(*status)) {
    o.failure = "crashed with " + signal_name(WTERMSIG(*status)) + where + said;
  } else if (p.garbage || r.overflow) {
    o.failure = "its probe answered something unreadable (the library wrote into headgrad's pipe?)";
  } else if (!p.ended) {
    const int code = WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
    o.failure = "exited with code " + std::to_string(code) + where + " (a plugin must never exit)" + said;
  } else if (WIFEXITED(*status) && WEXITSTATUS(*status) != 0) {
    o.failure = "exited with code " + std::to_string(WEXITSTATUS(*status)) + " after answering" + said;
  } else if (r.left_a_process) {
    // It would fork in headgrad's process and in every run's child too.
    o.failure = "left a process running after its probe (it forks while loading or in info()); killed";
  } else if (!r.printed.empty()) {
    // headgrad's reports go to stdout: a plugin that writes there corrupts them.
    o.failure = "wrote on stdout while loading or in info() (\"" + last_line(r.printed.substr(0, 200)) +
                "\"); a plugin must not write on stdout, where headgrad's reports go (use stderr)";
  } else {
    o.fields = p.fields;
  }
  return o;
}

}  // namespace

void ProbeChannel::put(std::string_view key, std::string_view value) {
  if (value.size() > kMaxValue) value = value.substr(0, kMaxValue);
  std::string rec(key);
  rec += ' ';
  rec += std::to_string(value.size());
  rec += '\n';
  rec += value;
  rec += '\n';
  write_all(fd_, rec.data(), rec.size());
}

std::string stage_phrase(std::string_view stage) {
  if (stage == "load") return "while loading the library (its static constructors)";
  if (stage == "build") return "in " HEADGRAD_BUILD_INFO_SYMBOL "()";
  if (stage == "c_abi") return "in headgrad_c_abi_version()";
  if (stage == "factory") return "in its factory";
  if (stage == "info") return "in info()";
  if (stage == "answer") return "while answering";
  return "before loading the library";
}

std::vector<ProbeOutcome> run_probes(const std::vector<std::filesystem::path>& files,
                                     const std::function<void(const std::filesystem::path&, ProbeChannel&)>& body,
                                     const ProbeSettings& settings) {
  std::vector<ProbeOutcome> outcomes(files.size());
  const double timeout_s = std::isfinite(settings.timeout_s) && settings.timeout_s > 0 ? settings.timeout_s : 10.0;
  const auto timeout = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  const std::size_t window = static_cast<std::size_t>(std::max(1, settings.parallel));
  std::vector<Running> running;
  std::size_t next = 0;

  auto start = [&](std::size_t index) {
    int pipes[3][2];  // the channel, stderr, stdout
    for (int i = 0; i < 3; ++i) {
      if (::pipe2(pipes[i], O_CLOEXEC) == 0) continue;
      outcomes[index].failure = std::string("cannot start a probe: pipe: ") + std::strerror(errno);
      for (int j = 0; j < i; ++j) {
        ::close(pipes[j][0]);
        ::close(pipes[j][1]);
      }
      return;
    }
    std::fflush(nullptr);  // nothing buffered in this process is written twice
    const pid_t pid = ::fork();
    if (pid == 0) child_main(files[index], pipes[0][1], pipes[1][1], pipes[2][1], body);
    for (auto& p : pipes) ::close(p[1]);
    if (pid < 0) {
      for (auto& p : pipes) ::close(p[0]);
      outcomes[index].failure = std::string("cannot start a probe: fork: ") + std::strerror(errno);
      return;
    }
    ::setpgid(pid, pid);  // the child does it too; whichever runs first
    for (auto& p : pipes) ::fcntl(p[0], F_SETFL, O_NONBLOCK);
    Running r;
    r.index = index;
    r.pid = pid;
    r.out_fd = pipes[0][0];
    r.err_fd = pipes[1][0];
    r.stdout_fd = pipes[2][0];
    r.deadline = Clock::now() + timeout;
    running.push_back(std::move(r));
  };

  while (next < files.size() || !running.empty()) {
    while (next < files.size() && running.size() < window) start(next++);
    std::vector<pollfd> fds;
    for (const auto& r : running) {
      for (const int fd : {r.out_fd, r.err_fd, r.stdout_fd})
        if (fd >= 0) fds.push_back({fd, POLLIN, 0});
    }
    // Short waits: a child's exit is noticed by waitpid below, not by end of
    // file (a grandchild may hold the pipes open).
    ::poll(fds.data(), fds.size(), 20);
    const auto now = Clock::now();
    for (std::size_t i = 0; i < running.size();) {
      Running& r = running[i];
      drain_all(r);
      int status = 0;
      const pid_t w = ::waitpid(r.pid, &status, WNOHANG);
      std::optional<int> ended;
      if (w == r.pid) ended = status;
      else if (w < 0 && errno == ECHILD) ended = 0;  // reaped elsewhere (SIGCHLD ignored): judge by its answer
      else if (now < r.deadline) {
        ++i;
        continue;
      }
      // The child is reaped, so only what it left can still be in its group.
      // (Its pid is not reused this quickly: pids are handed out in turn.)
      r.left_a_process = ended && ::kill(-r.pid, 0) == 0;
      ::kill(-r.pid, SIGKILL);  // the probe's group: the child if it hangs, and any grandchild
      if (!ended) {
        ::kill(r.pid, SIGKILL);
        while (::waitpid(r.pid, &status, 0) < 0 && errno == EINTR) {
        }
      }
      drain_all(r);
      close_fd(r.out_fd);
      close_fd(r.err_fd);
      close_fd(r.stdout_fd);
      outcomes[r.index] = finish(r, ended, timeout_s);
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  return outcomes;
}

}  // namespace headgrad::detail
