// wk_untransposed: the key projection written as x @ Wk (the other three as
// x @ W^T), a slip that square weights never complain about.
#include "common.hpp"

namespace u_wk_untransposed {
using namespace uncatalogued;

class Plugin final : public Attention {
 public:
  PluginInfo info() const override { return info_of("u_wk_untransposed", "test: k = x Wk", "mha"); }
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    const std::int64_t h = spec.num_heads;
    const Variable q = split_heads(linear(x, w.wq), h);
    const Variable k = split_heads(matmul(x, w.wk), h);  // BUG: not transposed
    const Variable v = split_heads(linear(x, w.wv), h);
    return finish(attention_core(q, k, v, spec), w);
  }
};
HEADGRAD_TEST_PLUGIN(u_wk_untransposed, Plugin)
}  // namespace u_wk_untransposed
