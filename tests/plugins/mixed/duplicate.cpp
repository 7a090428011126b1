// duplicate: built twice (dup_a.so, dup_b.so, HEADGRAD_DUP_COPY = "a" / "b"),
// two libraries whose plugins share the name "duplicate". dup_a.so sorts
// first, so it wins; dup_b.so must be skipped, naming both files.
#include <headgrad/plugin.hpp>

namespace {

using namespace headgrad;

class Duplicate final : public Attention {
 public:
  PluginInfo info() const override {
    PluginInfo i;
    i.name = "duplicate";
    i.version = "0.0.1";
    i.description = std::string("test plugin: the name clash, copy ") + HEADGRAD_DUP_COPY;
    i.capabilities.core = true;
    return i;
  }

  Variable core_forward(const Variable& q, const Variable& k, const Variable& v,
                        const AttentionSpec& spec) const override {
    return attention_core(q, k, v, spec);
  }
};

}  // namespace

HEADGRAD_PLUGIN(Duplicate)
