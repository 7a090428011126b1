// stale_layout: a plugin built against a changed public struct. Its build
// description says sizeof(MemoryStats) is 16, as it was before MemoryStats
// grew from 2 to 5 fields; everything else is this build's. The loader must
// reject it naming MemoryStats and both sizes, before calling the factory.
#include <headgrad/plugin.hpp>

#include <cstring>
#include <vector>

namespace {

using namespace headgrad;

class StaleLayout final : public Attention {
 public:
  PluginInfo info() const override {
    PluginInfo i;
    i.name = "stale_layout";
    i.version = "0.0.1";
    i.description = "test plugin: describes an older MemoryStats";
    i.capabilities.core = true;
    return i;
  }
};

std::shared_ptr<Attention> make_stale_layout() { return std::make_shared<StaleLayout>(); }

HEADGRAD_DEFINE_BUILD_INFO(real_build);

// MemoryStats as it was: current and peak bytes only.
struct OldMemoryStats {
  std::size_t current_bytes;
  std::size_t peak_bytes;
};

const std::vector<headgrad_type_layout>& stale_rows() {
  static const std::vector<headgrad_type_layout> rows = [] {
    std::vector<headgrad_type_layout> r(real_build.layout, real_build.layout + real_build.layout_count);
    for (auto& row : r)
      if (std::strcmp(row.name, "MemoryStats") == 0) row.size = sizeof(OldMemoryStats);
    return r;
  }();
  return rows;
}

}  // namespace

extern "C" BOOST_SYMBOL_EXPORT const headgrad_build_info* headgrad_plugin_build() {
  static const headgrad_build_info stale = [] {
    headgrad_build_info b = real_build;
    b.layout = stale_rows().data();
    b.layout_count = static_cast<std::uint32_t>(stale_rows().size());
    return b;
  }();
  return &stale;
}
BOOST_DLL_ALIAS(make_stale_layout, headgrad_create_plugin)
