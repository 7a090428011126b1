// Finding and loading attention plugins (Boost.DLL).
//
//   PluginRegistry reg;
//   reg.load_directories(plugin_search_path({"./my_plugins"}));
//   for (const auto& r : reg.rejections()) std::cerr << r.file << ": " << r.reason << "\n";
//   const LoadedPlugin& p = reg.get("batched");   // throws naming the known plugins
//   Variable out = p.attention->mha_forward(x, w, spec);
//
// A plugin's library stays loaded while its Attention object lives, and the
// registry keeps every library it loaded until it is destroyed. Variables made
// by a plugin carry backward code from its library: keep the registry (or the
// LoadedPlugin) alive while they do.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "headgrad/plugin.hpp"

namespace headgrad {

struct LoadedPlugin {
  PluginInfo info;
  int abi_version = 0;
  std::filesystem::path file;
  std::shared_ptr<const Attention> attention;  // holds the library open
};

struct PluginRejection {
  std::filesystem::path file;
  std::string reason;  // "ABI version 0, expected 1", "no symbol ...", ...
};

// The plugin folders in search order: each of `cli_dirs`, then the entries of
// HEADGRAD_PLUGIN_PATH (colon-separated), then the built plugin folder (when
// running from a build tree) or the installed one (<libdir>/headgrad/plugins,
// found next to the libheadgrad.so in use, so a moved installation works).
// Folders that do not exist are kept: load_directories() reports them.
std::vector<std::filesystem::path> plugin_search_path(
    const std::vector<std::filesystem::path>& cli_dirs);

class PluginRegistry {
 public:
  // Loads every shared library found in each folder (recursively); a path that
  // names a file is loaded as one plugin. Earlier folders win a name clash; the
  // later plugin is rejected with both files named.
  void load_directories(const std::vector<std::filesystem::path>& dirs);
  // Loads one library; returns false (and records a rejection) when it cannot.
  // A C plugin (<headgrad/c_plugin.h>) loads too, as a core-level Attention.
  bool load_file(const std::filesystem::path& file);

  const std::vector<LoadedPlugin>& plugins() const { return plugins_; }
  const std::vector<PluginRejection>& rejections() const { return rejections_; }
  const LoadedPlugin* find(const std::string& name) const;
  // Throws std::invalid_argument naming the plugin and listing the known ones.
  const LoadedPlugin& get(const std::string& name) const;

 private:
  std::vector<LoadedPlugin> plugins_;
  std::vector<PluginRejection> rejections_;
};

// A plugin's build description against headgrad's (<headgrad/abi.hpp>).
struct BuildComparison {
  std::vector<std::string> mismatches;  // each rejects the plugin: "built with _GLIBCXX_USE_CXX11_ABI=0, headgrad uses 1"
  std::vector<std::string> notes;       // differences that are allowed (compiler, library release), logged
  bool compatible() const { return mismatches.empty(); }
  std::string reason() const;  // the mismatches, "; "-separated
};
BuildComparison compare_builds(const headgrad_build_info& plugin, const headgrad_build_info& host);
// headgrad's own build, as HEADGRAD_PLUGIN describes a plugin's.
const headgrad_build_info& host_build_info();

// "mha, core, causal, mask, Tq!=Tk, float32, float64"
std::string capabilities_str(const Capabilities& caps);

}  // namespace headgrad
