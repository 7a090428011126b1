// dup_b: one of two libraries whose plugins share the name "duplicate".
// dup_a.so sorts first, so it wins; dup_b.so must be skipped, naming both files.
#include <headgrad/plugin.hpp>

namespace {

using namespace headgrad;

class DuplicateB final : public Attention {
 public:
  PluginInfo info() const override {
    PluginInfo i;
    i.name = "duplicate";
    i.version = "0.0.1";
    i.description = "test plugin: the name clash, copy b";
    i.capabilities.core = true;
    return i;
  }

  Variable core_forward(const Variable& q, const Variable& k, const Variable& v,
                        const AttentionSpec& spec) const override {
    return attention_core(q, k, v, spec);
  }
};

}  // namespace

HEADGRAD_PLUGIN(DuplicateB)
