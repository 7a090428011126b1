// aborts: calls std::abort(), as a failed assert() does. The runner must
// survive and say SIGABRT.
#include <cstdlib>

#include "common.hpp"

namespace runner_aborts {

using namespace runner_test;

class Aborts final : public Attention {
 public:
  PluginInfo info() const override { return test_info("aborts", "test plugin: calls std::abort()"); }
  Variable mha_forward(const Variable&, const MhaWeights&, const AttentionSpec&) const override { std::abort(); }
  Variable core_forward(const Variable&, const Variable&, const Variable&, const AttentionSpec&) const override {
    std::abort();
  }
};

HEADGRAD_TEST_PLUGIN(aborts, Aborts)

}  // namespace runner_aborts
