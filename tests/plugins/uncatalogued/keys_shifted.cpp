// keys_shifted: a ring buffer of keys read one slot late: query i scores
// key (j + 1) mod Tk where it should score key j (values are read right).
#include "common.hpp"

namespace u_keys_shifted {
using namespace uncatalogued;

class Plugin final : public Attention {
 public:
  PluginInfo info() const override {
    return info_of("u_keys_shifted", "test: keys read one slot late", "core");
  }
  Variable core_forward(const Variable& q, const Variable& k, const Variable& v, const AttentionSpec& spec) const override {
    const std::int64_t t = k.size(-2);
    const Variable late = t == 1 ? k : cat({narrow(k, -2, 1, t - 1), narrow(k, -2, 0, 1)}, -2);  // BUG
    return attention_core(q, late, v, spec);
  }
};
HEADGRAD_TEST_PLUGIN(u_keys_shifted, Plugin)
}  // namespace u_keys_shifted
