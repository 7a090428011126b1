// head_gates_arange: a per-head output gate meant to start at ones but
// initialized with arange(1, H + 1): head h's output is multiplied by h + 1
// before the merge.
#include "common.hpp"

namespace u_head_gates_arange {
using namespace uncatalogued;

class Plugin final : public Attention {
 public:
  PluginInfo info() const override { return info_of("u_head_gates_arange", "test: head h times h + 1"); }
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    const Heads p = project(x, w, spec);
    return finish(core_forward(p.q, p.k, p.v, spec), w);
  }
  Variable core_forward(const Variable& q, const Variable& k, const Variable& v, const AttentionSpec& spec) const override {
    const Variable o = attention_core(q, k, v, spec);
    std::vector<Variable> heads;
    for (std::int64_t h = 0; h < o.size(-3); ++h)
      heads.push_back(scale(narrow(o, -3, h, 1), static_cast<double>(h + 1)));  // BUG: gates 1, 2, 3, ...
    return cat(heads, -3);
  }
};
HEADGRAD_TEST_PLUGIN(u_head_gates_arange, Plugin)
}  // namespace u_head_gates_arange
