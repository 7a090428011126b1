// throws: both levels throw std::runtime_error, as a plugin with a failed
// check would. The runner must name the plugin and the message.
#include "common.hpp"

namespace runner_throws {

using namespace runner_test;

class Throws final : public Attention {
 public:
  PluginInfo info() const override { return test_info("throws", "test plugin: every forward throws"); }
  Variable mha_forward(const Variable&, const MhaWeights&, const AttentionSpec&) const override {
    throw std::runtime_error("deliberate failure in mha_forward");
  }
  Variable core_forward(const Variable&, const Variable&, const Variable&, const AttentionSpec&) const override {
    throw std::runtime_error("deliberate failure in core_forward");
  }
};

HEADGRAD_TEST_PLUGIN(throws, Throws)

}  // namespace runner_throws
