#include "headgrad/log.hpp"

#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace headgrad::logging {

namespace {
constexpr const char* kNames[] = {"core", "plugins", "runner"};

spdlog::level::level_enum parse_level(std::string_view name) {
  auto level = spdlog::level::from_str(std::string(name));
  // from_str maps anything unknown to off; only "off" itself may mean off.
  if (level == spdlog::level::off && name != "off")
    throw std::invalid_argument("unknown log level '" + std::string(name) +
                                "' (expected trace, debug, info, warn, error, critical or off)");
  return level;
}

std::shared_ptr<spdlog::logger> get(const char* name) {
  static std::once_flag once;
  std::call_once(once, [] {
    auto level = spdlog::level::warn;
    std::string bad_level;  // why HEADGRAD_LOG_LEVEL was ignored, if it was
    if (const char* env = std::getenv("HEADGRAD_LOG_LEVEL")) {
      try {
        level = parse_level(env);
      } catch (const std::invalid_argument& e) {
        bad_level = e.what();  // keep the default, and say so once the loggers exist
      }
    }
    for (const char* n : kNames) {
      auto logger = spdlog::stderr_color_mt(std::string("headgrad.") + n);
      logger->set_pattern("[%n] %^%l%$: %v");
      logger->set_level(level);
    }
    if (!bad_level.empty())
      spdlog::get("headgrad.core")->warn("HEADGRAD_LOG_LEVEL ignored: {}; logging at warn", bad_level);
  });
  return spdlog::get(std::string("headgrad.") + name);
}
}  // namespace

std::shared_ptr<spdlog::logger> core() { return get("core"); }
std::shared_ptr<spdlog::logger> plugins() { return get("plugins"); }
std::shared_ptr<spdlog::logger> runner() { return get("runner"); }

void set_level(spdlog::level::level_enum level) {
  for (const char* n : kNames) get(n)->set_level(level);
}
void set_level(std::string_view level) { set_level(parse_level(level)); }

}  // namespace headgrad::logging
