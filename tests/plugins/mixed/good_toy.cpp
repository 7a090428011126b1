// good_toy: a working plugin named "toy", core level only. The one library in
// the mixed folder that must load among the broken ones.
//
// Also built twice more as dup_a.so and dup_b.so with HEADGRAD_TOY_NAME
// "duplicate": two libraries whose plugins share a name. dup_a.so sorts
// first, so it wins; dup_b.so must be skipped, naming both files.
//
// Shape legend: Tq/Tk query/key lengths, d head width, [...] leading dims.
#include <headgrad/plugin.hpp>

#ifndef HEADGRAD_TOY_NAME
#define HEADGRAD_TOY_NAME "toy"
#endif
// Called first in info(): the hostile plugins (tests/plugins/hostile) are this
// toy with a misbehaviour here.
#ifndef HEADGRAD_TOY_ON_INFO
#define HEADGRAD_TOY_ON_INFO()
#endif

namespace {

using namespace headgrad;

class Toy final : public Attention {
 public:
  PluginInfo info() const override {
    HEADGRAD_TOY_ON_INFO();
    PluginInfo i;
    i.name = HEADGRAD_TOY_NAME;
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
