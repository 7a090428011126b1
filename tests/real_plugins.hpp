// The three real plugins (per_head, batched, fused_sdpa) by file, as the build
// lists them: tests/meson.build passes HEADGRAD_REAL_PLUGIN_FILES, colon
// separated. A test that needs them loads exactly these files and FAILS when
// one is missing or rejected: a plugin that was not built is a regression,
// never a reason to skip.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "headgrad/loader.hpp"

namespace headgrad::test {

inline std::vector<std::filesystem::path> real_plugin_files() {
  std::vector<std::filesystem::path> files;
  const std::string list = HEADGRAD_REAL_PLUGIN_FILES;
  for (std::size_t start = 0; start <= list.size();) {
    const std::size_t end = std::min(list.find(':', start), list.size());
    if (end > start) files.emplace_back(list.substr(start, end - start));
    start = end + 1;
  }
  return files;
}

// Loads every real plugin into `registry`. Returns one line per file that is
// missing or was rejected (with the loader's reason); empty when all loaded.
inline std::string load_real_plugins(PluginRegistry& registry) {
  std::string problems;
  for (const auto& file : real_plugin_files())
    if (!registry.load_file(file))
      problems += file.string() + ": " + registry.rejections().back().reason + "\n";
  return problems;
}

// Loads one plugin file into `registry`: "" when it loaded, else a line naming
// `what` with the loader's reason (to collect, as load_real_plugins does).
inline std::string load_plugin_file(PluginRegistry& registry, const std::filesystem::path& file,
                                    const std::string& what) {
  if (registry.load_file(file)) return "";
  return what + ": " + registry.rejections().back().reason + "\n";
}

}  // namespace headgrad::test
