// good_toy: a working plugin named "toy", core level only. The one library in
// the mixed folder that must load among the broken ones.
//
// Shape legend: Tq/Tk query/key lengths, d head width, [...] leading dims.
#include <headgrad/plugin.hpp>

namespace {

using namespace headgrad;

class Toy final : public Attention {
 public:
  PluginInfo info() const override {
    PluginInfo i;
    i.name = "toy";
    i.version = "0.0.1";
    i.description = "test plugin: the composed attention core";
    i.capabilities.core = true;
    return i;
  }

  // q [..., Tq, d], k [..., Tk, d], v [..., Tk, dv] -> [..., Tq, dv]
  Variable core_forward(const Variable& q, const Variable& k, const Variable& v,
                        const AttentionSpec& spec) const override {
    return attention_core(q, k, v, spec);
  }
};

}  // namespace

HEADGRAD_PLUGIN(Toy)
