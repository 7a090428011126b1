// correct: the same pieces with no bug; it must pass and get no finding.
#include "common.hpp"

namespace u_correct {
using namespace uncatalogued;

class Plugin final : public Attention {
 public:
  PluginInfo info() const override { return info_of("u_correct", "test: no bug"); }
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    const Heads p = project(x, w, spec);
    return finish(attention_core(p.q, p.k, p.v, spec), w);
  }
  Variable core_forward(const Variable& q, const Variable& k, const Variable& v, const AttentionSpec& spec) const override {
    return attention_core(q, k, v, spec);
  }
};
HEADGRAD_TEST_PLUGIN(u_correct, Plugin)
}  // namespace u_correct
