// Running untrusted code in a forked probe (internal to core): the loader
// opens each library, checks its build and calls its factory and info() in
// a child process with a time limit, so that a library that crashes, hangs,
// exits, forks or chatters takes nothing down but its probe.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace headgrad::detail {

// The child's side: records written to the parent through a pipe. "stage"
// records say what the child is about to do (so that a crash can be placed);
// the last record is "end".
class ProbeChannel {
 public:
  explicit ProbeChannel(int fd) : fd_(fd) {}
  void put(std::string_view key, std::string_view value);
  void stage(std::string_view what) { put("stage", what); }

 private:
  int fd_;
};

// What came back from one probe.
struct ProbeOutcome {
  // Set when the child did not finish cleanly, in describe_end's words
  // (child_process.hpp): "crashed with SIGSEGV (segmentation fault) in
  // info()", "exited with status 0 while loading the library ...", "did not
  // finish within 10 s (hung in info()); killed"; or "answered something unreadable".
  std::string failure;
  std::map<std::string, std::vector<std::string>> fields;  // every record but "stage" and "end"
};

struct ProbeSettings {
  double timeout_s = 10.0;  // per library
  int parallel = 4;         // probes running at once
};

// The stages a ProbeBody announces, as a failure message places them.
// "load" -> "while loading the library (its static constructors)", ...
std::string stage_phrase(std::string_view stage);

// Runs body(file, channel) in a forked child for each file: stdin is
// /dev/null, stdout and stderr are captured (anything on stdout is a failure;
// stderr's last line joins one), other descriptors are closed, the child is
// its own process group (killed whole at the end, so a grandchild cannot
// outlive it holding a pipe; one that was still there is a failure). The
// child ends with _exit(0) after body returns; body must catch its exceptions.
// A fork or pipe that fails throws InternalError (headgrad's failure, not the library's).
std::vector<ProbeOutcome> run_probes(const std::vector<std::filesystem::path>& files,
                                     const std::function<void(const std::filesystem::path&, ProbeChannel&)>& body,
                                     const ProbeSettings& settings);

}  // namespace headgrad::detail
