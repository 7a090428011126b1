// Running a function in a forked child process: the one place headgrad forks
// (the plugin probe, a side of a case, the -j workers), and the one way it
// says how a child ended.
//
//   ChildProcess child = ChildProcess::spawn({.to_parent = true}, [&](const ChildEnds& ends) {
//     send_message(ends.to_parent, compute());
//     return 0;                                   // the child's exit status
//   });
//   Message m;
//   const ChildWait w = child.read_message(m, deadline, [] { tick(); });
//   if (!m.complete()) std::cout << "child " << describe_end(w.end);   // "crashed with SIGSEGV (segmentation fault)"
//
// Not part of the plugin SDK (not installed).
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <cstddef>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace headgrad {

// headgrad could not do its own work (fork, pipe, poll failed): exit code 4,
// never "bad input". The message names the call: "fork: Resource temporarily unavailable".
class InternalError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// An InternalError "what: strerror(errno)".
[[noreturn]] void throw_system_failure(const std::string& what);

// How a child ended: its wait status, or killed at its deadline.
struct ChildEnd {
  bool timed_out = false;
  double limit_s = 0;   // the deadline, when timed_out
  int wait_status = 0;  // waitpid's status otherwise
  bool signaled() const;
  int signal() const;  // when signaled()
  bool exited() const;
  int exit_status() const;  // when exited()
};

// "SIGSEGV (segmentation fault)", "signal 64" for one without a name.
std::string signal_description(int sig);
// One wording everywhere; `context` (", in info()") follows the main words:
//   "crashed with SIGSEGV (segmentation fault)" + " " + context
//   "exited with status 3" + " " + context
//   "did not finish within 10 s" + " (hung " + context + ")" + "; killed"
std::string describe_end(const ChildEnd& end, std::string_view context = {});
// Seconds as a person writes them: 10, 0.5, 1e-05.
std::string format_seconds(double s);

// What the child gets, all optional.
struct ChildSpec {
  bool to_parent = false;        // a pipe the child writes and the parent reads (ChildEnds::to_parent)
  bool from_parent = false;      // a pipe the parent writes and the child reads (ChildEnds::from_parent)
  bool capture_stdout = false;   // the child's stdout into a pipe (ChildProcess::stdout_fd)
  bool capture_stderr = false;   // the child's stderr into a pipe (ChildProcess::stderr_fd)
  bool null_stdin = false;       // stdin from /dev/null
  int to_parent_fd = -1;         // >= 3: to_parent moved to this descriptor number in the child
  bool close_other_fds = false;  // every descriptor but 0, 1, 2 and the child's pipe ends closed
  // The parent's ends stay open in the children this process forks later (a
  // long-lived server they talk to: the Python worker). Otherwise each later
  // child closes them, as the other children's business.
  bool shared_with_later_children = false;
};

// The child's ends of its pipes (-1 where not asked for).
struct ChildEnds {
  int to_parent = -1;
  int from_parent = -1;
};

// A forked child, in a process group of its own (whatever it forks is killed
// with it). Movable, not copyable; destroying one that was not reaped kills
// its group and reaps it.
class ChildProcess {
 public:
  using Clock = std::chrono::steady_clock;

  // Forks a child that runs body and leaves with _exit(body's value): no
  // destructor or atexit handler of this process runs there. In the child:
  // its own process group; every signal's action back to the default and an
  // empty signal mask; SIGKILL when this process dies (PR_SET_PDEATHSIG); no
  // core file; the parent's ends of every other live child's pipes closed.
  // body must not throw (if it does, the child exits with status 125).
  // Before the fork, headgrad's thread pool is stopped (set_num_threads(1)):
  // a child inherits the pool's bookkeeping but not its threads and would wait
  // for them forever. The parent starts its workers again right after the
  // fork; a child that computes calls set_num_threads(0) to start its own.
  // Buffered output is flushed first, so that nothing is printed twice.
  // Throws InternalError naming pipe or fork when they fail.
  static ChildProcess spawn(const ChildSpec& spec, const std::function<int(const ChildEnds&)>& body);
  // spawn, then exec argv[0] (a path, or a name searched on PATH) with argv,
  // the environment plus `env` (each NAME=VALUE replacing NAME): from_parent
  // becomes the program's stdin, to_parent its stdout, stderr is shared and no
  // other descriptor stays open.
  // A program that cannot be run exits with status 127 after saying
  // "headgrad: cannot run PROGRAM: REASON" on stderr.
  static ChildProcess spawn_program(const ChildSpec& spec, const std::vector<std::string>& argv,
                                    const std::vector<std::pair<std::string, std::string>>& env = {});

  ChildProcess() = default;
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !status_; }
  // The parent's ends, non-blocking for reading (-1 where not asked for, or closed).
  int from_child() const { return from_child_; }
  int to_child() const { return to_child_; }
  int stdout_fd() const { return stdout_; }
  int stderr_fd() const { return stderr_; }
  void close_from_child();
  void close_to_child();
  void close_stdout();
  void close_stderr();

  // Reads what one of the child's pipes holds without blocking, appending to
  // `into`, at most `cap` bytes kept (the last ones with keep_tail; else
  // *overflow is set and the rest discarded); false at end of file, where the
  // pipe is closed.
  enum class Stream { from_child, out, err };
  bool drain(Stream which, std::string& into, std::size_t cap = SIZE_MAX, bool keep_tail = false,
             bool* overflow = nullptr);

  // Ended (a zombie until reaped, so its pid and group cannot be reused yet).
  bool has_exited() const;
  // Reaps the child if it has ended: its status, else nothing.
  std::optional<int> try_reap();
  // Whether a process of its group is still there (once the child is reaped:
  // what it forked and left behind).
  bool group_alive() const;
  // SIGKILL to the whole group (grandchildren included) and to the child
  // itself (should it have left the group), then reaps it: its status.
  int kill_and_reap();
  // The status once reaped.
  std::optional<int> status() const { return status_; }
  // In a process forked from the one that spawned the child: closes this
  // process's copies of the parent's ends and forgets the child, which is
  // not this process's to kill or reap (its owner still talks to it).
  void disown();

  // Reads what the child writes on to_parent as one Message (length first)
  // until it is complete, the child ends without completing it, the deadline
  // passes or `max_bytes` is exceeded; calls on_wait about every 200 ms. Then
  // kills the group and reaps the child (a child that crashed is reported with
  // its own signal, not with the SIGKILL). With last = false, a complete
  // message leaves the child running and its pipe open for the next one
  // (nothing past this message is read); end is then empty.
  struct ReadOutcome {
    ChildEnd end;
    bool oversized = false;  // it sent more than max_bytes
  };
  class Message;
  ReadOutcome read_message(Message& into, Clock::time_point deadline, double limit_s, std::uint64_t max_bytes,
                           const std::function<void()>& on_wait = {}, bool last = true);

 private:
  void close_all();
  pid_t pid_ = -1;
  int from_child_ = -1, to_child_ = -1, stdout_ = -1, stderr_ = -1;
  std::optional<int> status_;
};

// A length-first message: u64 length, then the bytes.
class ChildProcess::Message {
 public:
  std::string wire;  // as read so far
  std::optional<std::uint64_t> length() const;
  bool complete() const;
  // The message without its length (complete() only).
  std::string body() const;
  // In place, for a large message: wire becomes the body.
  std::string& take_body();
};
using Message = ChildProcess::Message;

// Writes `body` length-first to fd; false when the other end is gone.
bool send_message(int fd, std::string_view body);
// Writes all of data (retrying on EINTR); false when the other end is gone.
bool write_all(int fd, std::string_view data);
// Reads exactly `size` bytes (blocking); false at end of file or error.
bool read_exactly(int fd, void* out, std::size_t size);
// poll() that retries EINTR as "nothing ready" and throws InternalError
// "poll: ..." on a real failure: the number of descriptors ready.
int poll_fds(std::vector<pollfd>& fds, int timeout_ms);

}  // namespace headgrad
