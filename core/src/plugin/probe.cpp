// Forked probes: start a child per library (a few at a time), collect what it
// writes, and turn a crash, a hang, an exit or garbage into a sentence.
//
// The records on the pipe: "<key> <length>\n<value>\n", values of at most
// kMaxValue bytes, at most kMaxAnswer bytes in all.
#include "plugin/probe.hpp"

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "headgrad/abi.hpp"
#include "headgrad/child_process.hpp"

namespace headgrad::detail {

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kMaxValue = 64 * 1024;
constexpr std::size_t kMaxAnswer = 1024 * 1024;
constexpr std::size_t kStderrKept = 4096;
constexpr int kChannelFd = 3;

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
  ChildProcess child;
  std::string out, err, printed;  // the channel, the child's stderr and stdout
  Clock::time_point deadline;
  bool overflow = false;
  bool left_a_process = false;  // something of its process group outlived the child
};

void drain_all(Running& r) {
  r.child.drain(ChildProcess::Stream::from_child, r.out, kMaxAnswer, false, &r.overflow);
  r.child.drain(ChildProcess::Stream::err, r.err, kStderrKept, true);
  r.child.drain(ChildProcess::Stream::out, r.printed, kStderrKept);
}

ProbeOutcome finish(const Running& r, const ChildEnd& end) {
  ProbeOutcome o;
  const Parsed p = parse(r.out);
  const std::string where = stage_phrase(p.stage);
  const std::string words = last_line(r.err);
  std::string said;
  if (!words.empty()) said.append("; its last words on stderr: ").append(words);
  if (end.timed_out || end.signaled()) {
    o.failure = describe_end(end, where) + said;
  } else if (p.garbage || r.overflow) {
    o.failure = "its probe answered something unreadable (the library wrote into headgrad's pipe?)";
  } else if (!p.ended) {
    o.failure = describe_end(end, where) + " (a plugin must never exit)" + said;
  } else if (end.exited() && end.exit_status() != 0) {
    o.failure = describe_end(end, "after answering") + said;
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
  write_all(fd_, rec);  // false: the parent went away, nothing to tell it
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

  // The child: stdin /dev/null, stdout and stderr captured, the channel on
  // descriptor 3 and nothing else open. A failing fork or pipe is headgrad's
  // own failure (InternalError), not the library's.
  ChildSpec spec;
  spec.to_parent = spec.capture_stdout = spec.capture_stderr = spec.null_stdin = true;
  spec.to_parent_fd = kChannelFd;
  spec.close_other_fds = true;
  auto start = [&](std::size_t index) {
    Running r;
    r.index = index;
    r.child = ChildProcess::spawn(spec, [&](const ChildEnds& ends) {
      ProbeChannel channel(ends.to_parent);
      body(files[index], channel);
      channel.put("end", "");
      return 0;
    });
    r.deadline = Clock::now() + timeout;
    running.push_back(std::move(r));
  };

  while (next < files.size() || !running.empty()) {
    while (next < files.size() && running.size() < window) start(next++);
    std::vector<pollfd> fds;
    for (const auto& r : running) {
      for (const int fd : {r.child.from_child(), r.child.stderr_fd(), r.child.stdout_fd()})
        if (fd >= 0) fds.push_back({fd, POLLIN, 0});
    }
    // Short waits: a child's exit is noticed by try_reap below, not by end of
    // file (a grandchild may hold the pipes open).
    poll_fds(fds, 20);
    const auto now = Clock::now();
    for (std::size_t i = 0; i < running.size();) {
      Running& r = running[i];
      drain_all(r);
      const bool ended = r.child.try_reap().has_value();
      if (!ended && now < r.deadline) {
        ++i;
        continue;
      }
      // The child is reaped, so only what it left can still be in its group.
      r.left_a_process = ended && r.child.group_alive();
      ChildEnd end;
      end.wait_status = r.child.kill_and_reap();  // the probe's group: the child if it hangs, and any grandchild
      end.timed_out = !ended;
      end.limit_s = timeout_s;
      drain_all(r);
      outcomes[r.index] = finish(r, end);
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  return outcomes;
}

}  // namespace headgrad::detail
