// dq_scaled_twice: the backward of the scores multiplies dQ by the 1/sqrt(d)
// scale once more (the chain rule applied to an already scaled dS).
#include "common.hpp"

namespace u_dq_scaled_twice {
using namespace uncatalogued;

class Plugin final : public Attention {
 public:
  PluginInfo info() const override { return info_of("u_dq_scaled_twice", "test: dQ scaled by 1/sqrt(d) twice"); }
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    const Heads p = project(x, w, spec);
    return finish(core_forward(p.q, p.k, p.v, spec), w);
  }
  Variable core_forward(const Variable& q, const Variable& k, const Variable& v, const AttentionSpec& spec) const override {
    const double s = spec.scale_for(q.size(-1));
    return attention_core(grad_times(q, s), k, v, spec);  // BUG: dQ times the scale again
  }
};
HEADGRAD_TEST_PLUGIN(u_dq_scaled_twice, Plugin)
}  // namespace u_dq_scaled_twice
