// What a shared library exports, read from its file without loading it (internal
// to core): the loader decides from this whether a library is a headgrad
// plugin at all before any of its code runs, even in a probe.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace headgrad::detail {

// What a C plugin exports instead of the C++ symbols (<headgrad/c_plugin.h>).
inline constexpr const char* c_abi_symbol = "headgrad_c_abi_version";
inline constexpr const char* c_plugin_symbol = "headgrad_c_plugin";
// What plugins of the first SDK (ABI 1) exported instead of a build description.
inline constexpr const char* old_abi_symbol = "headgrad_plugin_abi_version";

enum class SymbolKind { function, data, other, unknown };

struct ElfExports {
  std::string problem;  // why the file is not a loadable ELF shared object; empty: it is
  bool linker_script = false;  // libc.so and the like in a system folder: text for the linker
  bool symbols_known = false;  // false: no section table to read them from (the probe will tell)
  std::map<std::string, SymbolKind> headgrad;  // defined, visible symbols named headgrad_*
};

// Reads an ELF64 little-endian file's dynamic symbol table. Every offset and
// size in the file is checked against the file's length: a truncated or
// hostile file gives a `problem`, never a crash.
ElfExports read_elf_exports(const std::filesystem::path& file);

// The symbols that make a library a headgrad plugin, and what kind it is.
enum class PluginKind { cxx, c };
struct Classified {
  std::optional<PluginKind> kind;  // empty: rejected
  std::string reason;              // why it is rejected
  bool not_a_plugin = false;       // no headgrad symbol at all
};
// `lookup(name)` says whether the library defines `name` (nullopt: it does
// not) and, when it can tell, what it is (SymbolKind::unknown: defined, kind
// unknown, as dlsym sees it).
Classified classify_exports(const std::function<std::optional<SymbolKind>(const std::string&)>& lookup);
Classified classify_exports(const ElfExports& exports);

}  // namespace headgrad::detail
