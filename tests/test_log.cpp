// The loggers' level from HEADGRAD_LOG_LEVEL: an unknown name is not silently
// dropped; the first logger use says it was ignored and why, and the default
// (warn) stays. The environment is read once per process, so this file is its
// own test program and sets the variable before any logger exists.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "headgrad/log.hpp"

namespace test_log {  // this file's names: test files share unity builds (tests/meson.build)

namespace {

TEST(Log, UnknownLevelInTheEnvironmentIsReportedAndIgnored) {
  ASSERT_EQ(::setenv("HEADGRAD_LOG_LEVEL", "loud", 1), 0);
  ::testing::internal::CaptureStderr();
  const auto logger = headgrad::logging::runner();  // the first use reads the variable
  logger->info("not shown at warn");
  logger->warn("shown at warn");
  logger->flush();
  headgrad::logging::core()->flush();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("HEADGRAD_LOG_LEVEL ignored: unknown log level 'loud' (expected trace, debug, info, "
                     "warn, error, critical or off); logging at warn"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("not shown at warn"), std::string::npos) << err;
  EXPECT_NE(err.find("shown at warn"), std::string::npos) << err;
  EXPECT_EQ(logger->level(), spdlog::level::warn);
}

}  // namespace

}  // namespace test_log
