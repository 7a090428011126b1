// Finding and loading attention plugins (Boost.DLL).
//
//   PluginRegistry reg;
//   reg.probe_directories(plugin_search_path({"./my_plugins"}));  // forked probes: nothing runs here
//   for (const auto& r : reg.rejections()) std::cerr << r.file << ": " << r.reason << "\n";
//   reg.load({"batched", "per_head"});             // only what is needed, into this process
//   const LoadedPlugin& p = reg.get("batched");   // throws naming the known plugins
//   Variable out = p.attention->mha_forward(x, w, spec);
//
// Every library is first probed in a forked child with a time limit: there it
// is opened, its build description checked (<headgrad/abi.hpp>), its factory
// and info() called. A library that crashes, hangs, exits, or is not a
// compatible plugin is rejected with the reason and nothing else is affected.
// A library whose file exports no headgrad symbol is not even opened.
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

// What a probe saw of a plugin; none of its code has run in this process.
struct FoundPlugin {
  PluginInfo info;
  int abi_version = 0;  // HEADGRAD_PLUGIN_ABI_VERSION, or HEADGRAD_C_ABI_VERSION for a C plugin
  std::filesystem::path file;
  bool c_abi = false;   // a C plugin (<headgrad/c_plugin.h>)
};

struct LoadedPlugin : FoundPlugin {
  std::shared_ptr<const Attention> attention;  // holds the library open
};

struct PluginRejection {
  std::filesystem::path file;
  std::string reason;  // "built with _GLIBCXX_USE_CXX11_ABI=0, headgrad uses 1", "crashed with SIGSEGV (segmentation fault) in info()", ...
  std::string name;    // the name the plugin declared, when its probe got that far
  bool not_a_plugin = false;  // a shared library without any headgrad symbol, or a linker script
  std::filesystem::path shadowed_by;  // a name clash: the earlier file that provides `name`
};

struct ProbeOptions {
  double timeout_s = 10.0;  // for each library's probe: loading, the checks, the factory and info()
  int parallel = 4;         // probes at once
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
  explicit PluginRegistry(ProbeOptions options = {}) : options_(options) {}

  // Probes every shared library found in each folder (recursively; a path
  // that names a file is probed as one plugin). Earlier folders win a name
  // clash; the later plugin is rejected with both files named. A folder or
  // file reached twice is probed once.
  void probe_directories(const std::vector<std::filesystem::path>& dirs);
  // Loads into this process the found plugins with these names (a name that
  // no probe found is left out: find() returns nullptr for it).
  void load(const std::vector<std::string>& names);
  void load_all();
  // probe_directories + load_all.
  void load_directories(const std::vector<std::filesystem::path>& dirs);
  // Probes and loads one library; returns false (and records a rejection)
  // when it cannot. A C plugin (<headgrad/c_plugin.h>) loads too, as a
  // core-level Attention.
  bool load_file(const std::filesystem::path& file);
  // Adds a plugin made in this process (a Python function run by a worker):
  // no library behind it. Throws std::invalid_argument when a plugin of its
  // name is already found or loaded.
  void add(LoadedPlugin plugin);

  const std::vector<FoundPlugin>& found() const { return found_; }
  const std::vector<LoadedPlugin>& plugins() const { return plugins_; }
  const std::vector<PluginRejection>& rejections() const { return rejections_; }
  const FoundPlugin* find_found(const std::string& name) const;
  const LoadedPlugin* find(const std::string& name) const;
  // Throws std::invalid_argument naming the plugin and listing the known ones.
  const LoadedPlugin& get(const std::string& name) const;
  // The rejected libraries that might have provided `name`: they declared it
  // (a duplicate) or their file is called like it (name.so).
  std::vector<const PluginRejection*> rejections_for(const std::string& name) const;

 private:
  void reject(PluginRejection r);
  bool load_found(const FoundPlugin& found);

  ProbeOptions options_;
  std::vector<std::filesystem::path> seen_;  // canonical paths of the files probed
  std::vector<FoundPlugin> found_;
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
