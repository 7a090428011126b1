// bias_ignored: declares the bias capability and never reads MhaWeights'
// biases (batched's recipe on wq, wk, wv, wo alone), as code does that builds
// its projections with bias=False. A bias case must fail it on out and on
// every bias gradient (none reaches bq, bk, bv, bo).
#include "common.hpp"

namespace runner_bias_ignored {

using namespace runner_test;

class BiasIgnored final : public Attention {
 public:
  PluginInfo info() const override {
    PluginInfo i = test_info("bias_ignored", "test plugin: declares bias, ignores the biases");
    i.capabilities.bias = true;
    return i;
  }
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    return good_mha(x, MhaWeights{w.wq, w.wk, w.wv, w.wo}, spec);  // BUG: bq, bk, bv, bo dropped
  }
};

HEADGRAD_TEST_PLUGIN(bias_ignored, BiasIgnored)

}  // namespace runner_bias_ignored
