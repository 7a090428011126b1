// libFuzzer target: headgrad merge's reader (runner::merge_shard_reports: the
// bounded file read, the JSON parse, the schema's checks of every field, the
// shard and identity checks) on arbitrary bytes as one shard report, then,
// for a report it accepts, every report made from the result (JSON, JUnit,
// HTML, the terminal lines): what merge writes after reading. The input is
// an in-memory file (memfd) opened through /proc/self/fd. A rejection must
// be a std::invalid_argument (ReportError, MergeError) whose message starts
// with that path; anything else is a finding.
// Run longer: see README, "Sanitizers and fuzzing".
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "report/report.hpp"

namespace {

struct MemFile {
  int fd;
  std::filesystem::path path;  // /proc/self/fd/<fd>
};

const MemFile& report_file() {
  static const MemFile file = [] {
    const int fd = ::memfd_create("fuzz.json", 0);
    if (fd < 0) {
      std::perror("fuzz_merge: memfd_create");
      std::abort();  // no input can be tried: stop the fuzzer loudly
    }
    return MemFile{fd, std::filesystem::path("/proc/self/fd") / std::to_string(fd)};
  }();
  return file;
}

void write_report_bytes(const std::uint8_t* data, std::size_t size) {
  const int fd = report_file().fd;
  if (::ftruncate(fd, 0) != 0) std::abort();
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    if (n <= 0) std::abort();
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace runner = headgrad::runner;
  write_report_bytes(data, size);
  const std::string name = report_file().path.string();
  try {
    const runner::SuiteResult result = runner::merge_shard_reports({report_file().path});
    (void)runner::json_report(result).dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
    (void)runner::junit_report(result);
    (void)runner::html_report(result);
    std::ostringstream terminal;
    std::vector<const runner::CaseSpec*> specs;
    for (const auto& c : result.cases) specs.push_back(&c.spec);
    const runner::TerminalStyle style = runner::terminal_style(specs, false, false, true);
    for (const auto& c : result.cases) runner::print_case(terminal, c, style);
    runner::print_summary(terminal, result, style);
  } catch (const std::invalid_argument& e) {
    if (!std::string_view(e.what()).starts_with(name)) std::abort();  // the message must name the file
  }
  return 0;
}
