// libFuzzer target: the YAML suite parser (runner::parse_suite: YAML, then
// defaults, sweeps and validation) on arbitrary text. It reads no file but
// the text, so the suite's path is a made-up name. A rejection must be a
// ConfigError whose message starts with that name (FILE:LINE:COL); any other
// exception, a crash or a sanitizer report is a finding.
// Run longer: see README, "Sanitizers and fuzzing".
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "case/suite.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace runner = headgrad::runner;
  constexpr std::string_view kFile = "fuzz.yaml";
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const runner::Suite suite = runner::parse_suite(text, kFile);
    for (const runner::CaseSpec& c : suite.cases) (void)runner::describe_case(c);  // every case prints
  } catch (const runner::ConfigError& e) {
    if (!std::string_view(e.what()).starts_with(kFile)) std::abort();  // the message must say where
  }
  return 0;
}
