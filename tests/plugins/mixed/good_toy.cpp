// good_toy: a working plugin named "toy", core level only. The one library in
// the mixed folder that must load among the broken ones.
//
// The same toy under other names: dup_a.so and dup_b.so, "duplicate" both
// (two libraries whose plugins share a name: dup_a.so sorts first, so it
// wins; dup_b.so must be skipped, naming both files), and hostile/forged_name
// and asan/needs_asan_runtime. These and good_toy compile this file once
// (HEADGRAD_TOY_NAME_FROM_LIBRARY, tests/plugins/meson.build): each library
// names its plugin in plugin_name.cpp, as ../one_unit.hpp describes.
// old_string_abi compiles it again, with the other string ABI, and names it
// with HEADGRAD_TOY_NAME.
//
// Shape legend: Tq/Tk query/key lengths, d head width, [...] leading dims.
#include <headgrad/plugin.hpp>

#ifdef HEADGRAD_TOY_NAME_FROM_LIBRARY
extern "C" const char headgrad_test_plugin_name[];  // ../plugin_name.cpp
#define HEADGRAD_TOY_NAME headgrad_test_plugin_name
#endif
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
