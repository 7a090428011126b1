// A plugin's build description (<headgrad/abi.hpp>) against headgrad's own,
// field by field. Every string and the layout table come from the plugin:
// they are read with bounds, never trusted to be terminated or sane.
#include <cstring>
#include <string>
#include <vector>

#include "headgrad/loader.hpp"

namespace headgrad {

namespace {

HEADGRAD_DEFINE_BUILD_INFO(g_host_build);

constexpr std::size_t kMaxText = 200;      // longest string read from a description
constexpr std::uint32_t kMaxRows = 1024;   // largest layout table read

std::string bounded(const char* s) {
  if (s == nullptr) return "(none)";
  return std::string(s, ::strnlen(s, kMaxText));
}

std::string stdlib_name(std::uint32_t id) {
  switch (id) {
    case HEADGRAD_STDLIB_LIBSTDCXX: return "libstdc++";
    case HEADGRAD_STDLIB_LIBCXX: return "libc++";
    default: return "an unknown C++ standard library (" + std::to_string(id) + ")";
  }
}

// "gcc 12" of "gcc 12.2.0": the family and major version.
std::string compiler_major(const std::string& compiler) {
  const auto dot = compiler.find('.');
  return dot == std::string::npos ? compiler : compiler.substr(0, dot);
}

}  // namespace

const headgrad_build_info& host_build_info() { return g_host_build; }

BuildComparison compare_builds(const headgrad_build_info& plugin, const headgrad_build_info& host) {
  BuildComparison out;
  auto differ = [&](std::string what) { out.mismatches.push_back(std::move(what)); };
  if (plugin.magic != HEADGRAD_BUILD_INFO_MAGIC) {
    differ("what " HEADGRAD_BUILD_INFO_SYMBOL "() returned is not a build description (wrong magic number)");
    return out;
  }
  if (plugin.info_size < sizeof(headgrad_build_info)) {
    differ("its build description has " + std::to_string(plugin.info_size) + " bytes, headgrad's " +
           std::to_string(sizeof(headgrad_build_info)) + ": built against an older SDK");
    return out;
  }
  if (plugin.abi_version != host.abi_version) {
    // Nothing else is comparable across ABI versions: the version says it all.
    differ("built for plugin ABI version " + std::to_string(plugin.abi_version) + " (headgrad " +
           bounded(plugin.headgrad_version) + "), headgrad uses " + std::to_string(host.abi_version));
    return out;
  }
  if (plugin.stdlib != host.stdlib)
    differ("built with " + stdlib_name(plugin.stdlib) + ", headgrad uses " + stdlib_name(host.stdlib));
  if (plugin.cxx11_abi != host.cxx11_abi)
    differ("built with _GLIBCXX_USE_CXX11_ABI=" + std::to_string(plugin.cxx11_abi) + ", headgrad uses " +
           std::to_string(host.cxx11_abi));
  const auto feature = [&](std::uint32_t bit, const char* on, const char* off) {
    if ((plugin.features & bit) != (host.features & bit))
      differ(std::string("built ") + ((plugin.features & bit) ? on : off) + ", headgrad " +
             ((host.features & bit) ? on : off));
  };
  feature(HEADGRAD_FEATURE_EXCEPTIONS, "with exceptions", "without exceptions (-fno-exceptions)");
  feature(HEADGRAD_FEATURE_RTTI, "with RTTI", "without RTTI (-fno-rtti)");
  feature(HEADGRAD_FEATURE_STDLIB_DEBUG, "with _GLIBCXX_DEBUG", "without _GLIBCXX_DEBUG");
  if (plugin.cplusplus != host.cplusplus)
    differ("built as __cplusplus " + std::to_string(plugin.cplusplus) + ", headgrad uses " +
           std::to_string(host.cplusplus) + " (-std=c++20)");

  if (plugin.layout == nullptr || plugin.layout_count > kMaxRows) {
    differ("its layout table is missing or has " + std::to_string(plugin.layout_count) + " rows");
  } else {
    for (std::uint32_t i = 0; i < host.layout_count; ++i) {
      const headgrad_type_layout& mine = host.layout[i];
      const headgrad_type_layout* theirs = nullptr;
      for (std::uint32_t j = 0; j < plugin.layout_count && !theirs; ++j)
        if (plugin.layout[j].name && bounded(plugin.layout[j].name) == mine.name) theirs = &plugin.layout[j];
      if (!theirs) {
        differ(std::string("its layout table does not describe ") + mine.name);
        continue;
      }
      if (theirs->size != mine.size)
        differ(std::string("sizeof(") + mine.name + ") is " + std::to_string(theirs->size) + " in the plugin, " +
               std::to_string(mine.size) + " in headgrad");
      if (theirs->align != mine.align)
        differ(std::string("alignof(") + mine.name + ") is " + std::to_string(theirs->align) +
               " in the plugin, " + std::to_string(mine.align) + " in headgrad");
    }
  }

  // Informational: the Itanium C++ ABI and the standard libraries' own ABI
  // promises let these differ; what would break is caught above.
  const std::string pc = bounded(plugin.compiler), hc = bounded(host.compiler);
  if (compiler_major(pc) != compiler_major(hc)) out.notes.push_back("compiled by " + pc + ", headgrad by " + hc);
  if (plugin.stdlib == host.stdlib && plugin.stdlib_version != host.stdlib_version)
    out.notes.push_back(stdlib_name(plugin.stdlib) + " headers " + std::to_string(plugin.stdlib_version) +
                        ", headgrad's " + std::to_string(host.stdlib_version));
  if (bounded(plugin.headgrad_version) != bounded(host.headgrad_version))
    out.notes.push_back("SDK headers of headgrad " + bounded(plugin.headgrad_version) + ", this is " +
                        bounded(host.headgrad_version));
  return out;
}

std::string BuildComparison::reason() const {
  std::string s;
  for (const auto& m : mismatches) s += (s.empty() ? "" : "; ") + m;
  return s;
}

}  // namespace headgrad
