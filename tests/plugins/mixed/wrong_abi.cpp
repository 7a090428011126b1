// wrong_abi: a plugin built against a newer SDK. It reports ABI version
// HEADGRAD_PLUGIN_ABI_VERSION + 1, so the loader must skip it before calling
// the factory. The exports are written by hand to lie about the version.
#include <headgrad/plugin.hpp>

namespace {

using namespace headgrad;

class WrongAbi final : public Attention {
 public:
  PluginInfo info() const override {
    PluginInfo i;
    i.name = "wrong_abi";
    i.version = "0.0.1";
    i.description = "test plugin: reports the next ABI version";
    i.capabilities.core = true;
    return i;
  }

  Variable core_forward(const Variable& q, const Variable& k, const Variable& v,
                        const AttentionSpec& spec) const override {
    return attention_core(q, k, v, spec);
  }
};

std::shared_ptr<Attention> make_wrong_abi() { return std::make_shared<WrongAbi>(); }

}  // namespace

namespace {
HEADGRAD_DEFINE_BUILD_INFO(real_build);
}  // namespace

// This build's description, but with the next ABI version.
extern "C" BOOST_SYMBOL_EXPORT const headgrad_build_info* headgrad_plugin_build() {
  static const headgrad_build_info next = [] {
    headgrad_build_info b = real_build;
    b.abi_version = HEADGRAD_PLUGIN_ABI_VERSION + 1;
    return b;
  }();
  return &next;
}
BOOST_DLL_ALIAS(make_wrong_abi, headgrad_create_plugin)
