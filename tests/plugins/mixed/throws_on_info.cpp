// throws_on_info: the factory works but info() throws. The loader must catch
// the exception while the library is still loaded and skip the plugin.
#include <stdexcept>

#include <headgrad/plugin.hpp>

namespace {

using namespace headgrad;

class ThrowsOnInfo final : public Attention {
 public:
  PluginInfo info() const override { throw std::runtime_error("boom"); }

  Variable core_forward(const Variable& q, const Variable& k, const Variable& v,
                        const AttentionSpec& spec) const override {
    return attention_core(q, k, v, spec);
  }
};

}  // namespace

HEADGRAD_PLUGIN(ThrowsOnInfo)
