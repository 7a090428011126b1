// dwo_mean_over_tokens: the output projection's backward reduces over the
// B*T tokens with a mean instead of a sum, so dWo is 1/(B*T) of the right
// one; everything else is exact.
#include "common.hpp"

namespace u_dwo_mean_over_tokens {
using namespace uncatalogued;

class Plugin final : public Attention {
 public:
  PluginInfo info() const override { return info_of("u_dwo_mean_over_tokens", "test: dWo a mean over tokens", "mha"); }
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    const Heads p = project(x, w, spec);
    const double tokens = static_cast<double>(x.numel() / x.size(-1));
    return linear(merge_heads(attention_core(p.q, p.k, p.v, spec)), grad_times(w.wo, 1.0 / tokens));  // BUG
  }
};
HEADGRAD_TEST_PLUGIN(u_dwo_mean_over_tokens, Plugin)
}  // namespace u_dwo_mean_over_tokens
