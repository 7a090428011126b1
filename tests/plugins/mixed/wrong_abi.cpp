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

extern "C" BOOST_SYMBOL_EXPORT int headgrad_plugin_abi_version() {
  return HEADGRAD_PLUGIN_ABI_VERSION + 1;
}
BOOST_DLL_ALIAS(make_wrong_abi, headgrad_create_plugin)
