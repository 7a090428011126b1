// dk_accumulated_twice: a hand-written backward that adds dK once per pass
// over the key tiles and runs two passes, so K's gradient is twice the right
// one (the forward is exact).
#include "common.hpp"

namespace u_dk_accumulated_twice {
using namespace uncatalogued;

class Plugin final : public Attention {
 public:
  PluginInfo info() const override { return info_of("u_dk_accumulated_twice", "test: dK added twice"); }
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    const Heads p = project(x, w, spec);
    return finish(core_forward(p.q, p.k, p.v, spec), w);
  }
  Variable core_forward(const Variable& q, const Variable& k, const Variable& v, const AttentionSpec& spec) const override {
    return attention_core(q, grad_times(k, 2.0), v, spec);  // BUG: dK accumulated twice
  }
};
HEADGRAD_TEST_PLUGIN(u_dk_accumulated_twice, Plugin)
}  // namespace u_dk_accumulated_twice
