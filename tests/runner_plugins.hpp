// A fixture holding the runner's test plugins (RUNNER_TEST_PLUGIN_DIR, defined
// by the test's meson target) in one registry per test suite: loaded before
// its first test, kept alive until its last (results carry code from the
// plugin libraries).
#pragma once

#include <gtest/gtest.h>

#include "headgrad/loader.hpp"

namespace headgrad::test {

class RunnerPluginsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    registry_ = new PluginRegistry();
    registry_->load_directories(plugin_search_path({RUNNER_TEST_PLUGIN_DIR}));
  }
  static void TearDownTestSuite() {
    delete registry_;
    registry_ = nullptr;
  }
  static inline PluginRegistry* registry_ = nullptr;
};

}  // namespace headgrad::test
