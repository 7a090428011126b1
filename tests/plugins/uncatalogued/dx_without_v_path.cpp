// dx_without_v_path: a hand-written MHA backward that sums the input gradient
// of the query and key projections and forgets the value projection's: only
// dx is wrong.
#include "common.hpp"

namespace u_dx_without_v_path {
using namespace uncatalogued;

class Plugin final : public Attention {
 public:
  PluginInfo info() const override { return info_of("u_dx_without_v_path", "test: dx without V's projection", "mha"); }
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    const std::int64_t h = spec.num_heads;
    const Variable q = split_heads(linear(x, w.wq), h);
    const Variable k = split_heads(linear(x, w.wk), h);
    const Variable v = split_heads(linear(no_grad(x), w.wv), h);  // BUG: no gradient from v to x
    return finish(attention_core(q, k, v, spec), w);
  }
};
HEADGRAD_TEST_PLUGIN(u_dx_without_v_path, Plugin)
}  // namespace u_dx_without_v_path
