// wq_wv_swapped: a packed projection unpacked as q, v, k = ... instead of
// q, k, v: then q is x Wv^T and v is x Wq^T (k stays right).
#include "common.hpp"

namespace u_wq_wv_swapped {
using namespace uncatalogued;

class Plugin final : public Attention {
 public:
  PluginInfo info() const override { return info_of("u_wq_wv_swapped", "test: Wq and Wv exchanged", "mha"); }
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    const std::int64_t h = spec.num_heads;
    const Variable q = split_heads(linear(x, w.wv), h);  // BUG: Wv for q
    const Variable k = split_heads(linear(x, w.wk), h);
    const Variable v = split_heads(linear(x, w.wq), h);  // BUG: Wq for v
    return finish(attention_core(q, k, v, spec), w);
  }
};
HEADGRAD_TEST_PLUGIN(u_wq_wv_swapped, Plugin)
}  // namespace u_wq_wv_swapped
