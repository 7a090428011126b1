// no_factory: the right ABI version but no factory symbol (HEADGRAD_PLUGIN
// forgotten, the ABI function written by hand). The loader must say the
// factory is missing.
#include <headgrad/plugin.hpp>

namespace {

using namespace headgrad;

// Never reachable from outside: nothing creates it.
class NoFactory final : public Attention {
 public:
  PluginInfo info() const override {
    PluginInfo i;
    i.name = "no_factory";
    i.version = "0.0.1";
    i.description = "test plugin: exports no factory";
    i.capabilities.core = true;
    return i;
  }
};

}  // namespace

namespace {
HEADGRAD_DEFINE_BUILD_INFO(this_build);
}  // namespace

extern "C" BOOST_SYMBOL_EXPORT const headgrad_build_info* headgrad_plugin_build() { return &this_build; }
