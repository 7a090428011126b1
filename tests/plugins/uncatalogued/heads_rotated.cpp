// heads_rotated: the heads' outputs are gathered into the merge with an index
// off by one, so head h's output lands in slot (h + 1) mod H.
#include "common.hpp"

namespace u_heads_rotated {
using namespace uncatalogued;

// slot h holds head (h - 1) mod H
Variable rotate(const Variable& o) {
  return reorder_heads(o, [](std::int64_t h, std::int64_t n) { return (h + n - 1) % n; });  // BUG
}

class Plugin final : public Attention {
 public:
  PluginInfo info() const override { return info_of("u_heads_rotated", "test: heads merged rotated by one", "mha"); }
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    const Heads p = project(x, w, spec);
    return finish(rotate(attention_core(p.q, p.k, p.v, spec)), w);
  }
};
HEADGRAD_TEST_PLUGIN(u_heads_rotated, Plugin)
}  // namespace u_heads_rotated
