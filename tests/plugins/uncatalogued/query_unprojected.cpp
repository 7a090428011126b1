// query_unprojected: q taken straight from x (the query projection skipped),
// so Wq is never used and the plugin returns no gradient for it.
#include "common.hpp"

namespace u_query_unprojected {
using namespace uncatalogued;

class Plugin final : public Attention {
 public:
  PluginInfo info() const override { return info_of("u_query_unprojected", "test: Wq unused", "mha"); }
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    const std::int64_t h = spec.num_heads;
    const Variable q = split_heads(x, h);  // BUG: no query projection
    const Variable k = split_heads(linear(x, w.wk), h);
    const Variable v = split_heads(linear(x, w.wv), h);
    return finish(attention_core(q, k, v, spec), w);
  }
};
HEADGRAD_TEST_PLUGIN(u_query_unprojected, Plugin)
}  // namespace u_query_unprojected
