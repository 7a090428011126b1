// dv_averaged_over_heads: a backward that averages V's gradient over the
// heads (a mean where the heads' contributions are separate), so dV is 1/H
// of the right one.
#include "common.hpp"

namespace u_dv_averaged_over_heads {
using namespace uncatalogued;

class Plugin final : public Attention {
 public:
  PluginInfo info() const override { return info_of("u_dv_averaged_over_heads", "test: dV divided by H"); }
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    const Heads p = project(x, w, spec);
    return finish(core_forward(p.q, p.k, p.v, spec), w);
  }
  Variable core_forward(const Variable& q, const Variable& k, const Variable& v, const AttentionSpec& spec) const override {
    const double heads = static_cast<double>(q.size(-3));
    return attention_core(q, k, grad_times(v, 1.0 / heads), spec);  // BUG: dV / H
  }
};
HEADGRAD_TEST_PLUGIN(u_dv_averaged_over_heads, Plugin)
}  // namespace u_dv_averaged_over_heads
