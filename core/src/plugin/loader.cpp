#include "headgrad/loader.hpp"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <system_error>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>

#include "headgrad/c_plugin.h"
#include "headgrad/log.hpp"
#include "plugin/c_adapter.hpp"

namespace fs = std::filesystem;

namespace headgrad {

namespace {

// Where this build's or installation's plugins are. The core library knows
// where it was loaded from: inside the build tree it serves the built plugins,
// anywhere else the installed ones, found next to the library itself
// (<libdir>/headgrad/plugins) so that an installation can be moved (a DESTDIR
// staging, a relocated prefix); the configured prefix is the fallback.
fs::path default_plugin_dir() {
  std::error_code ec;
  const fs::path here = fs::weakly_canonical(boost::dll::this_line_location().string(), ec);
  const fs::path build_core = fs::weakly_canonical(HEADGRAD_BUILD_CORE_DIR, ec);
  if (!here.empty() && here.parent_path() == build_core) return HEADGRAD_BUILD_PLUGIN_DIR;
  if (!here.empty()) {
    const fs::path beside = here.parent_path() / HEADGRAD_PLUGIN_SUBDIR;
    if (fs::is_directory(beside, ec)) return beside;
  }
  return HEADGRAD_PLUGIN_DIR;
}

// Keeps the library open until the object it made is gone: members are
// destroyed in reverse order, so `object` goes first.
struct PluginKeeper {
  std::shared_ptr<boost::dll::shared_library> library;
  std::shared_ptr<Attention> object;
};

// What a C plugin exports instead of the C++ symbols (<headgrad/c_plugin.h>).
constexpr const char* c_abi_symbol = "headgrad_c_abi_version";
constexpr const char* c_plugin_symbol = "headgrad_c_plugin";
// What plugins of the first SDK (ABI 1) exported instead of a build description.
constexpr const char* old_abi_symbol = "headgrad_plugin_abi_version";

bool is_shared_library(const fs::path& p) {
  const std::string name = p.filename().string();
  return p.extension() == ".so" || name.find(".so.") != std::string::npos;
}

}  // namespace

std::vector<fs::path> plugin_search_path(const std::vector<fs::path>& cli_dirs) {
  std::vector<fs::path> dirs = cli_dirs;
  if (const char* env = std::getenv("HEADGRAD_PLUGIN_PATH")) {
    std::stringstream ss(env);
    std::string item;
    while (std::getline(ss, item, ':'))
      if (!item.empty()) dirs.emplace_back(item);
  }
  dirs.push_back(default_plugin_dir());
  return dirs;
}

void PluginRegistry::load_directories(const std::vector<fs::path>& dirs) {
  for (const auto& dir : dirs) {
    std::error_code ec;
    if (fs::is_regular_file(dir, ec)) {
      load_file(dir);
      continue;
    }
    if (!fs::is_directory(dir, ec)) {
      logging::plugins()->warn("plugin folder {} does not exist; skipped", dir.string());
      continue;
    }
    std::vector<fs::path> files;
    for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
         it.increment(ec)) {
      if (it->is_regular_file(ec) && is_shared_library(it->path())) files.push_back(it->path());
    }
    std::sort(files.begin(), files.end());  // the same order on every run
    for (const auto& f : files) load_file(f);
  }
}

bool PluginRegistry::load_file(const fs::path& file) {
  auto reject = [&](std::string reason) {
    logging::plugins()->warn("skipped plugin {}: {}", file.string(), reason);
    rejections_.push_back({file, std::move(reason)});
    return false;
  };

  std::error_code fec;
  if (!fs::exists(file, fec)) return reject("no such file");

  auto library = std::make_shared<boost::dll::shared_library>();
  boost::system::error_code ec;
  // rtld_local: two plugins may define the same internal names without clashing.
  library->load(boost::dll::fs::path(file.string()), ec,
                boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  if (ec) return reject("cannot load the library: " + ec.message());

  // The ABI check comes first and is a plain C call: nothing of C++ crosses the
  // boundary until both sides agree on how their builds lay out the SDK's types.
  // A C plugin (<headgrad/c_plugin.h>) has its own symbols and version, which
  // do not move with the C++ types.
  const bool c_plugin = library->has(c_abi_symbol) && library->has(c_plugin_symbol);
  int abi = 0;
  if (c_plugin) {
    abi = library->get<int()>(c_abi_symbol)();
    if (abi != HEADGRAD_C_ABI_VERSION)
      return reject("C ABI version " + std::to_string(abi) + ", expected " +
                    std::to_string(HEADGRAD_C_ABI_VERSION) +
                    "; rebuild the plugin against this headgrad's <headgrad/c_plugin.h>");
  } else if (library->has(plugin_build_symbol)) {
    const headgrad_build_info* build = library->get<const headgrad_build_info*()>(plugin_build_symbol)();
    if (build == nullptr) return reject(std::string(plugin_build_symbol) + "() returned NULL");
    const BuildComparison cmp = compare_builds(*build, host_build_info());
    if (!cmp.compatible())
      return reject(cmp.reason() + "; rebuild the plugin with headgrad's toolchain (docs/plugin-guide.md)");
    for (const auto& note : cmp.notes) logging::plugins()->info("plugin {}: {}", file.string(), note);
    abi = static_cast<int>(build->abi_version);
  } else if (library->has(old_abi_symbol)) {
    return reject(std::string("built for an older headgrad: it exports '") + old_abi_symbol + "', not '" +
                  plugin_build_symbol + "'; rebuild the plugin against this headgrad");
  } else {
    return reject(std::string("not a headgrad plugin: no symbol '") + plugin_build_symbol + "' (C++) or '" +
                  c_abi_symbol + "' (C)");
  }
  if (!c_plugin && !library->has(plugin_factory_symbol))
    return reject(std::string("no factory: the symbol '") + plugin_factory_symbol +
                  "' is missing (export it with HEADGRAD_PLUGIN(YourClass))");

  auto keeper = std::make_shared<PluginKeeper>();
  keeper->library = library;
  PluginInfo info;
  try {
    if (c_plugin)
      keeper->object = detail::make_c_attention(
          library->get<const hg_c_plugin*()>(c_plugin_symbol)(), library);
    else
      keeper->object = library->get_alias<PluginFactory>(plugin_factory_symbol)();
    if (!keeper->object) return reject("the factory returned no object");
    info = keeper->object->info();
  } catch (const std::exception& e) {
    return reject(std::string(c_plugin ? "bad C plugin descriptor: " : "the plugin threw while starting: ") +
                  e.what());
  } catch (...) {
    return reject("the plugin threw while starting (not a std::exception)");
  }
  if (info.name.empty()) return reject("the plugin declares an empty name");
  if (const LoadedPlugin* other = find(info.name))
    return reject("a plugin named '" + info.name + "' is already loaded from " +
                  other->file.string() + "; names must be unique");

  LoadedPlugin loaded;
  loaded.info = std::move(info);
  loaded.abi_version = abi;
  loaded.file = file;
  loaded.attention = std::shared_ptr<const Attention>(keeper, keeper->object.get());
  logging::plugins()->info("loaded plugin '{}' {} from {}{}", loaded.info.name, loaded.info.version,
                           file.string(), c_plugin ? " (C ABI)" : "");
  plugins_.push_back(std::move(loaded));
  return true;
}

const LoadedPlugin* PluginRegistry::find(const std::string& name) const {
  for (const auto& p : plugins_)
    if (p.info.name == name) return &p;
  return nullptr;
}

const LoadedPlugin& PluginRegistry::get(const std::string& name) const {
  if (const LoadedPlugin* p = find(name)) return *p;
  std::string known;
  for (const auto& p : plugins_) known += (known.empty() ? "" : ", ") + p.info.name;
  std::string msg = "no plugin named '" + name + "' (loaded: " + (known.empty() ? "none" : known) + ")";
  for (const auto& r : rejections_) msg += "; skipped " + r.file.string() + ": " + r.reason;
  throw std::invalid_argument(msg);
}

std::string capabilities_str(const Capabilities& c) {
  std::vector<std::string> parts;
  if (c.mha) parts.push_back("mha");
  if (c.core) parts.push_back("core");
  if (c.causal) parts.push_back("causal");
  if (c.bool_mask) parts.push_back("mask");
  if (c.cross_lengths) parts.push_back("Tq!=Tk");
  if (c.float32) parts.push_back("float32");
  if (c.float64) parts.push_back("float64");
  if (c.dropout) parts.push_back("dropout");
  if (c.grouped_kv) parts.push_back("gqa");
  if (c.rope) parts.push_back("rope");
  for (const auto& e : c.extra) parts.push_back(e);
  std::string s;
  for (const auto& p : parts) s += (s.empty() ? "" : ", ") + p;
  return s;
}

}  // namespace headgrad
