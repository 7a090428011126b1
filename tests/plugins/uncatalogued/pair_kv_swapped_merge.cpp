// pair_kv_swapped_merge: two catalog bugs at once: k and v exchanged in the
// core call, and the heads merged by a reshape without the transpose back.
#include "common.hpp"

namespace u_pair_kv_swapped_merge {
using namespace uncatalogued;

class Plugin final : public Attention {
 public:
  PluginInfo info() const override { return info_of("u_pair_kv_swapped_merge", "test: kv_swapped + merge_without_transpose", "mha"); }
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    const Heads p = project(x, w, spec);
    const Variable o = attention_core(p.q, p.v, p.k, spec);  // BUG 1: k and v exchanged
    return linear(reshape(o, x.shape()), w.wo);                // BUG 2: [B, H, T, d] read as [B, T, D]
  }
};
HEADGRAD_TEST_PLUGIN(u_pair_kv_swapped_merge, Plugin)
}  // namespace u_pair_kv_swapped_merge
