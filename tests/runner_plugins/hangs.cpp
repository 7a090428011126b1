// hangs: never returns. The runner must kill it at the case's time limit.
#include <chrono>
#include <thread>

#include "common.hpp"

namespace runner_hangs {

using namespace runner_test;

[[noreturn]] void sleep_forever() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

class Hangs final : public Attention {
 public:
  PluginInfo info() const override { return test_info("hangs", "test plugin: sleeps forever"); }
  Variable mha_forward(const Variable&, const MhaWeights&, const AttentionSpec&) const override { sleep_forever(); }
  Variable core_forward(const Variable&, const Variable&, const Variable&, const AttentionSpec&) const override {
    sleep_forever();
  }
};

HEADGRAD_TEST_PLUGIN(hangs, Hangs)

}  // namespace runner_hangs
