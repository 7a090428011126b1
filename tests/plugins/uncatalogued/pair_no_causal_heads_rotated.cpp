// pair_no_causal_heads_rotated: a catalog bug and one outside it: the causal
// flag is ignored (missing_causal_mask), and the heads are merged rotated by
// one (head h's output in slot (h + 1) mod H).
#include "common.hpp"

namespace u_pair_no_causal_heads_rotated {
using namespace uncatalogued;

class Plugin final : public Attention {
 public:
  PluginInfo info() const override { return info_of("u_pair_no_causal_heads_rotated", "test: missing_causal_mask + heads rotated", "mha"); }
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    const Heads p = project(x, w, spec);
    AttentionSpec open = spec;
    open.causal = false;  // BUG 1: the causal flag ignored
    const Variable o = attention_core(p.q, p.k, p.v, open);
    return finish(reorder_heads(o, [](std::int64_t h, std::int64_t n) { return (h + n - 1) % n; }), w);  // BUG 2
  }
};
HEADGRAD_TEST_PLUGIN(u_pair_no_causal_heads_rotated, Plugin)
}  // namespace u_pair_no_causal_heads_rotated
