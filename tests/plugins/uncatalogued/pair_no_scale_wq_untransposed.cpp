// pair_no_scale_wq_untransposed: a catalog bug and one outside it: the scores
// are not scaled (no_scale), and the query projection is x @ Wq, untransposed.
#include "common.hpp"

namespace u_pair_no_scale_wq_untransposed {
using namespace uncatalogued;

class Plugin final : public Attention {
 public:
  PluginInfo info() const override { return info_of("u_pair_no_scale_wq_untransposed", "test: no_scale + q = x Wq", "mha"); }
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    const std::int64_t h = spec.num_heads;
    const Variable q = split_heads(matmul(x, w.wq), h);  // BUG 2: not transposed
    const Variable k = split_heads(linear(x, w.wk), h);
    const Variable v = split_heads(linear(x, w.wv), h);
    AttentionSpec unscaled = spec;
    unscaled.scale = 1.0;  // BUG 1: no 1/sqrt(d)
    return finish(attention_core(q, k, v, unscaled), w);
  }
};
HEADGRAD_TEST_PLUGIN(u_pair_no_scale_wq_untransposed, Plugin)
}  // namespace u_pair_no_scale_wq_untransposed
