// Named spdlog loggers, all writing to stderr so that reports on stdout stay
// clean. Their level comes from HEADGRAD_LOG_LEVEL (trace, debug, info, warn,
// error, critical, off; default warn) and later from the command line (-v, -q).
//
//   headgrad::logging::plugins()->info("loaded {} from {}", name, file);
#pragma once

#include <memory>
#include <string_view>

#include <spdlog/spdlog.h>

namespace headgrad::logging {

std::shared_ptr<spdlog::logger> core();     // the engine
std::shared_ptr<spdlog::logger> plugins();  // plugin loads and rejections
std::shared_ptr<spdlog::logger> runner();   // suites and cases

// Sets every headgrad logger; throws std::invalid_argument for an unknown name.
void set_level(std::string_view level);
void set_level(spdlog::level::level_enum level);

}  // namespace headgrad::logging
