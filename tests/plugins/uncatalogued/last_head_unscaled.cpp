// last_head_unscaled: a kernel whose remainder loop (the last head) forgets
// the 1/sqrt(d) scale of the scores; every other head is exact.
#include "common.hpp"

namespace u_last_head_unscaled {
using namespace uncatalogued;

class Plugin final : public Attention {
 public:
  PluginInfo info() const override { return info_of("u_last_head_unscaled", "test: the last head unscaled"); }
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    const Heads p = project(x, w, spec);
    return finish(core_forward(p.q, p.k, p.v, spec), w);
  }
  Variable core_forward(const Variable& q, const Variable& k, const Variable& v, const AttentionSpec& spec) const override {
    const std::int64_t n = q.size(-3);
    const Variable first = attention_core(narrow(q, -3, 0, n - 1), narrow(k, -3, 0, n - 1), narrow(v, -3, 0, n - 1), spec);
    AttentionSpec unscaled = spec;
    unscaled.scale = 1.0;  // BUG: the last head's scores unscaled
    const Variable last = attention_core(narrow(q, -3, n - 1, 1), narrow(k, -3, n - 1, 1), narrow(v, -3, n - 1, 1), unscaled);
    return n == 1 ? last : cat({first, last}, -3);
  }
};
HEADGRAD_TEST_PLUGIN(u_last_head_unscaled, Plugin)
}  // namespace u_last_head_unscaled
