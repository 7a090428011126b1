// limited: a correct plugin with few capabilities (mha level only, no causal
// mask, float64 only), for the runner's capability checks.
#include "common.hpp"

namespace runner_limited {

using namespace runner_test;

class Limited final : public Attention {
 public:
  PluginInfo info() const override {
    PluginInfo i = test_info("limited", "test plugin: mha level, no causal mask, float64 only");
    auto& c = i.capabilities;
    c.core = c.causal = c.bool_mask = c.cross_lengths = c.float32 = false;
    return i;
  }
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    return good_mha(x, w, spec);
  }
};

HEADGRAD_TEST_PLUGIN(limited, Limited)

}  // namespace runner_limited
