// The plugin registry: the search path, the file check (what a library
// exports), the forked probe of each library, and loading into this process
// the plugins that are needed.
#include "headgrad/loader.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>

#include "headgrad/c_plugin.h"
#include "headgrad/log.hpp"
#include "plugin/c_adapter.hpp"
#include "plugin/elf_exports.hpp"
#include "plugin/probe.hpp"

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

bool is_shared_library(const fs::path& p) {
  const std::string name = p.filename().string();
  return p.extension() == ".so" || name.find(".so.") != std::string::npos;
}

// A library that is not a plugin headgrad can use, and why.
struct Rejected : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Opened {
  std::shared_ptr<PluginKeeper> keeper;
  PluginInfo info;
  int abi_version = 0;
  bool c_abi = false;
  std::vector<std::string> notes;  // allowed build differences, for the log
};

// Opens a library, checks it and calls its factory and info(): the probe does
// it first in a child, then this process for the plugins it needs.
// on_stage(name) is told before each step ("load", "build" or "c_abi",
// "factory", "info"). Throws Rejected with the reason.
Opened open_plugin(const fs::path& file, const std::function<void(const char*)>& on_stage) {
  Opened o;
  o.keeper = std::make_shared<PluginKeeper>();
  auto library = std::make_shared<boost::dll::shared_library>();
  on_stage("load");
  boost::dll::fs::error_code ec;
  // rtld_local: two plugins may define the same internal names without clashing.
  library->load(boost::dll::fs::path(file.string()), ec,
                boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  if (ec) throw Rejected("cannot load the library: " + ec.message());
  o.keeper->library = library;

  const detail::Classified kind = detail::classify_exports(
      [&](const std::string& name) -> std::optional<detail::SymbolKind> {
        if (!library->has(name)) return std::nullopt;
        return detail::SymbolKind::unknown;
      });
  if (!kind.kind) throw Rejected(kind.reason);
  o.c_abi = *kind.kind == detail::PluginKind::c;

  // The ABI check comes first and is a plain C call: nothing of C++ crosses the
  // boundary until both sides agree on how their builds lay out the SDK's types.
  // A C plugin has its own symbols and version, which do not move with the C++ types.
  if (o.c_abi) {
    on_stage("c_abi");
    o.abi_version = library->get<int()>(detail::c_abi_symbol)();
    // Older C ABI versions still load: each version only added to the one before.
    if (o.abi_version < HEADGRAD_C_ABI_MIN_VERSION || o.abi_version > HEADGRAD_C_ABI_VERSION)
      throw Rejected("C ABI version " + std::to_string(o.abi_version) + ", expected " +
                     std::to_string(HEADGRAD_C_ABI_MIN_VERSION) + " to " + std::to_string(HEADGRAD_C_ABI_VERSION) +
                     "; rebuild the plugin against this headgrad's <headgrad/c_plugin.h>");
  } else {
    on_stage("build");
    const headgrad_build_info* build = library->get<const headgrad_build_info*()>(plugin_build_symbol)();
    if (build == nullptr) throw Rejected(std::string(plugin_build_symbol) + "() returned NULL");
    const BuildComparison cmp = compare_builds(*build, host_build_info());
    if (!cmp.compatible())
      throw Rejected(cmp.reason() + "; rebuild the plugin with headgrad's toolchain (docs/plugin-guide.md)");
    o.notes = cmp.notes;
    o.abi_version = static_cast<int>(build->abi_version);
  }

  try {
    on_stage("factory");
    if (o.c_abi)
      o.keeper->object =
          detail::make_c_attention(library->get<const hg_c_plugin*()>(detail::c_plugin_symbol)(), library,
                                   o.abi_version);
    else
      o.keeper->object = library->get_alias<PluginFactory>(plugin_factory_symbol)();
    if (!o.keeper->object) throw Rejected("the factory returned no object");
    on_stage("info");
    o.info = o.keeper->object->info();
  } catch (const Rejected&) {
    throw;
  } catch (const std::exception& e) {
    throw Rejected(std::string(o.c_abi ? "bad C plugin descriptor: " : "the plugin threw while starting: ") +
                   e.what());
  } catch (...) {
    throw Rejected("the plugin threw while starting (not a std::exception)");
  }
  if (o.info.name.empty()) throw Rejected("the plugin declares an empty name");
  return o;
}

// ---- what a probe sends back: the fields of FoundPlugin ----

// The Capabilities flags, in the order of their "caps" record.
// The probe sends the flags as one '0'/'1' per entry of the vocabulary.
constexpr auto& kCapabilityFlags = kCapabilityNames;
constexpr std::size_t kCapabilityCount = std::size(kCapabilityFlags);

// Runs in the probe's child: opens the library and writes what it found.
void probe_body(const fs::path& file, detail::ProbeChannel& ch) {
  try {
    const Opened o = open_plugin(file, [&](const char* stage) { ch.stage(stage); });
    ch.stage("answer");
    ch.put("name", o.info.name);
    ch.put("version", o.info.version);
    ch.put("description", o.info.description);
    ch.put("mutant", o.info.mutant ? "1" : "0");
    ch.put("abi", std::to_string(o.abi_version));
    ch.put("c_abi", o.c_abi ? "1" : "0");
    std::string caps;
    for (const auto& c : kCapabilityFlags) caps += o.info.capabilities.*c.flag ? '1' : '0';
    ch.put("caps", caps);
    for (const auto& e : o.info.capabilities.extra) ch.put("extra", e);
    for (const auto& n : o.notes) ch.put("note", n);
  } catch (const std::exception& e) {
    ch.put("reject", e.what());
  } catch (...) {
    ch.put("reject", "the probe failed (not a std::exception)");
  }
}

// The one value of `key` in a probe's answer; throws Rejected when absent or repeated.
const std::string& one(const std::map<std::string, std::vector<std::string>>& f, const char* key) {
  const auto it = f.find(key);
  if (it == f.end() || it->second.size() != 1)
    throw Rejected(std::string("its probe's answer lacks a single '") + key + "'");
  return it->second.front();
}

FoundPlugin decode(const fs::path& file, const std::map<std::string, std::vector<std::string>>& f) {
  FoundPlugin p;
  p.file = file;
  p.info.name = one(f, "name");
  p.info.version = one(f, "version");
  p.info.description = one(f, "description");
  p.info.mutant = one(f, "mutant") == "1";
  p.c_abi = one(f, "c_abi") == "1";
  const std::string& abi = one(f, "abi");
  if (abi.empty() || abi.size() > 9 || abi.find_first_not_of("0123456789") != std::string::npos)
    throw Rejected("its probe's answer has a malformed ABI version");
  p.abi_version = std::stoi(abi);
  const std::string& caps = one(f, "caps");
  if (caps.size() != kCapabilityCount || caps.find_first_not_of("01") != std::string::npos)
    throw Rejected("its probe's answer has malformed capabilities");
  for (std::size_t i = 0; i < kCapabilityCount; ++i) p.info.capabilities.*kCapabilityFlags[i].flag = caps[i] == '1';
  if (const auto it = f.find("extra"); it != f.end()) p.info.capabilities.extra = it->second;
  return p;
}

PluginRejection rejection(const fs::path& file, std::string reason) {
  PluginRejection r;
  r.file = file;
  r.reason = std::move(reason);
  return r;
}

// While alive, this process's stdout goes to /dev/null: a plugin loaded here
// (its static constructors, factory, info()) must not write into headgrad's
// own output. The loader runs before headgrad starts its threads.
class StdoutSilenced {
 public:
  StdoutSilenced() {
    std::fflush(stdout);
    saved_ = ::dup(STDOUT_FILENO);
    const int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (saved_ >= 0 && devnull >= 0) ::dup2(devnull, STDOUT_FILENO);
    if (devnull >= 0) ::close(devnull);
  }
  ~StdoutSilenced() {
    std::fflush(stdout);
    if (saved_ >= 0) {
      ::dup2(saved_, STDOUT_FILENO);
      ::close(saved_);
    }
  }
  StdoutSilenced(const StdoutSilenced&) = delete;
  StdoutSilenced& operator=(const StdoutSilenced&) = delete;

 private:
  int saved_ = -1;
};

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

void PluginRegistry::reject(PluginRejection r) {
  // A library without headgrad symbols is no news in a system folder: debug only.
  logging::plugins()->log(r.not_a_plugin ? spdlog::level::debug : spdlog::level::warn, "skipped plugin {}: {}",
                          r.file.string(), r.reason);
  rejections_.push_back(std::move(r));
}

void PluginRegistry::probe_directories(const std::vector<fs::path>& dirs) {
  // The candidates, in search order: folders in the order given, files sorted
  // within each (the same order on every run); each file once.
  std::vector<fs::path> files;
  auto add = [&](const fs::path& f) {
    std::error_code ec;
    const fs::path canonical = fs::weakly_canonical(f, ec);
    const fs::path& key = ec ? f : canonical;
    if (std::find(seen_.begin(), seen_.end(), key) != seen_.end()) return;
    seen_.push_back(key);
    files.push_back(f);
  };
  for (const auto& dir : dirs) {
    std::error_code ec;
    if (fs::is_regular_file(dir, ec)) {
      if (fs::exists(dir, ec)) add(dir);
      continue;
    }
    if (!fs::is_directory(dir, ec)) {
      if (dir.has_extension() && is_shared_library(dir)) {
        reject(rejection(dir, "no such file"));
        continue;
      }
      logging::plugins()->warn("plugin folder {} does not exist; skipped", dir.string());
      continue;
    }
    std::vector<fs::path> in_dir;
    for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
         !ec && it != fs::end(it); it.increment(ec)) {
      std::error_code fec;
      if (it->is_regular_file(fec) && is_shared_library(it->path())) in_dir.push_back(it->path());
    }
    std::sort(in_dir.begin(), in_dir.end());
    for (const auto& f : in_dir) add(f);
  }

  // A file that exports no headgrad symbol is rejected unopened; the others
  // are probed. Verdicts are then recorded in search order.
  std::vector<std::optional<PluginRejection>> unopened(files.size());
  std::vector<fs::path> to_probe;
  for (std::size_t i = 0; i < files.size(); ++i) {
    const detail::ElfExports exports = detail::read_elf_exports(files[i]);
    if (!exports.problem.empty()) {
      unopened[i] = rejection(files[i], exports.problem);
      unopened[i]->not_a_plugin = exports.linker_script;
      continue;
    }
    if (exports.symbols_known) {
      const detail::Classified c = detail::classify_exports(exports);
      if (!c.kind) {
        unopened[i] = rejection(files[i], c.reason);
        unopened[i]->not_a_plugin = c.not_a_plugin;
        continue;
      }
    }
    to_probe.push_back(files[i]);
  }

  detail::ProbeSettings settings;
  settings.timeout_s = options_.timeout_s;
  settings.parallel = options_.parallel;
  const std::vector<detail::ProbeOutcome> outcomes = detail::run_probes(to_probe, probe_body, settings);
  std::size_t probed = 0;
  for (std::size_t i = 0; i < files.size(); ++i) {
    const fs::path& file = files[i];
    if (unopened[i]) {
      reject(*unopened[i]);
      continue;
    }
    const detail::ProbeOutcome& o = outcomes[probed++];
    if (!o.failure.empty()) {
      reject(rejection(file, o.failure));
      continue;
    }
    if (const auto it = o.fields.find("reject"); it != o.fields.end() && !it->second.empty()) {
      reject(rejection(file, it->second.front()));
      continue;
    }
    FoundPlugin p;
    try {
      p = decode(file, o.fields);
    } catch (const Rejected& e) {
      reject(rejection(file, e.what()));
      continue;
    }
    if (const FoundPlugin* other = find_found(p.info.name)) {
      PluginRejection r = rejection(file, "a plugin named '" + p.info.name + "' is already provided by " +
                                              other->file.string() + "; names must be unique");
      r.name = p.info.name;
      r.shadowed_by = other->file;
      reject(std::move(r));
      continue;
    }
    if (const auto it = o.fields.find("note"); it != o.fields.end())
      for (const auto& n : it->second) logging::plugins()->info("plugin {}: {}", file.string(), n);
    logging::plugins()->debug("probed plugin '{}' {} in {}", p.info.name, p.info.version, file.string());
    found_.push_back(std::move(p));
  }
}

bool PluginRegistry::load_found(const FoundPlugin& found) {
  Opened o;
  try {
    const StdoutSilenced quiet;
    o = open_plugin(found.file, [](const char*) {});
  } catch (const Rejected& e) {
    PluginRejection r = rejection(found.file, std::string("passed its probe, then: ") + e.what());
    r.name = found.info.name;
    reject(std::move(r));
    return false;
  }
  if (o.info.name != found.info.name) {
    PluginRejection r = rejection(found.file, "declared the name '" + found.info.name + "' in its probe and '" +
                                                  o.info.name + "' here");
    r.name = found.info.name;
    reject(std::move(r));
    return false;
  }
  LoadedPlugin loaded;
  static_cast<FoundPlugin&>(loaded) = found;
  loaded.info = std::move(o.info);
  loaded.attention = std::shared_ptr<const Attention>(o.keeper, o.keeper->object.get());
  logging::plugins()->info("loaded plugin '{}' {} from {}{}", loaded.info.name, loaded.info.version,
                           loaded.file.string(), loaded.c_abi ? " (C ABI)" : "");
  plugins_.push_back(std::move(loaded));
  return true;
}

void PluginRegistry::add(LoadedPlugin plugin) {
  if (find(plugin.info.name) || find_found(plugin.info.name))
    throw std::invalid_argument("plugin '" + plugin.info.name + "' is defined twice: " + plugin.file.string() +
                                " and " + (find(plugin.info.name) ? find(plugin.info.name)->file
                                                                  : find_found(plugin.info.name)->file).string());
  logging::plugins()->info("added plugin '{}' from {}", plugin.info.name, plugin.file.string());
  found_.push_back(plugin);
  plugins_.push_back(std::move(plugin));
}

void PluginRegistry::load(const std::vector<std::string>& names) {
  for (const auto& name : names) {
    if (find(name)) continue;
    if (const FoundPlugin* p = find_found(name)) load_found(*p);
  }
}

void PluginRegistry::load_all() {
  for (const auto& p : found_)
    if (!find(p.info.name)) load_found(p);
}

void PluginRegistry::load_directories(const std::vector<fs::path>& dirs) {
  probe_directories(dirs);
  load_all();
}

bool PluginRegistry::load_file(const fs::path& file) {
  std::error_code ec;
  if (!fs::exists(file, ec)) {
    reject(rejection(file, "no such file"));
    return false;
  }
  const std::size_t before = found_.size();
  probe_directories({file});
  if (found_.size() == before) return false;
  return load_found(found_.back());
}

const FoundPlugin* PluginRegistry::find_found(const std::string& name) const {
  for (const auto& p : found_)
    if (p.info.name == name) return &p;
  return nullptr;
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
  for (const auto& r : rejections_)
    if (!r.not_a_plugin) msg += "; skipped " + r.file.string() + ": " + r.reason;
  throw std::invalid_argument(msg);
}

std::vector<const PluginRejection*> PluginRegistry::rejections_for(const std::string& name) const {
  std::vector<const PluginRejection*> out;
  for (const auto& r : rejections_)
    if (r.name == name || r.file.stem() == name) out.push_back(&r);
  return out;
}

std::vector<std::string> capability_names(const Capabilities& caps) {
  std::vector<std::string> names;
  for (const auto& c : kCapabilityNames)
    if (caps.*c.flag) names.emplace_back(c.name);
  names.insert(names.end(), caps.extra.begin(), caps.extra.end());
  return names;
}

std::string capabilities_str(const Capabilities& c) {
  std::string s;
  for (const auto& name : capability_names(c)) s += (s.empty() ? "" : ", ") + name;
  return s;
}

}  // namespace headgrad
