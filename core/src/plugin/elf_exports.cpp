// Reading a shared library's exports from its file (ELF64, little-endian),
// and deciding from them whether it is a headgrad plugin.
#include "plugin/elf_exports.hpp"

#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string_view>

#include "headgrad/plugin.hpp"

namespace headgrad::detail {

namespace {

// A read-only mapping of a whole file, unmapped on scope exit.
class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& file) {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat st {};
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
      void* p = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
      if (p != MAP_FAILED) {
        data_ = static_cast<const unsigned char*>(p);
        size_ = static_cast<std::size_t>(st.st_size);
      }
    }
    ::close(fd);
  }
  ~MappedFile() {
    if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  bool ok() const { return data_ != nullptr; }
  std::size_t size() const { return size_; }
  // Copies a T at `offset` (the file's fields need not be aligned); false when
  // it does not fit in the file.
  template <class T>
  bool read(std::uint64_t offset, T& out) const {
    if (offset > size_ || sizeof(T) > size_ - offset) return false;
    std::memcpy(&out, data_ + offset, sizeof(T));
    return true;
  }
  bool fits(std::uint64_t offset, std::uint64_t length) const { return offset <= size_ && length <= size_ - offset; }
  const char* chars(std::uint64_t offset) const { return reinterpret_cast<const char*>(data_ + offset); }

 private:
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

constexpr std::string_view kPrefix = "headgrad_";

}  // namespace

ElfExports read_elf_exports(const std::filesystem::path& file) {
  ElfExports out;
  const MappedFile f(file);
  if (!f.ok()) {
    out.problem = "cannot load the library: cannot read the file";
    return out;
  }
  Elf64_Ehdr eh{};
  if (!f.read(0, eh) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) {
    const std::string_view head(f.chars(0), std::min<std::size_t>(f.size(), 256));
    // Text naming the linker's commands: what system folders keep as libc.so.
    const bool text = head.find('\0') == std::string_view::npos;
    out.linker_script = text && (head.find("INPUT") != std::string_view::npos ||
                                 head.find("GROUP") != std::string_view::npos ||
                                 head.find("ld script") != std::string_view::npos);
    out.problem = out.linker_script ? "not a library: a linker script" : "cannot load the library: not an ELF file";
    return out;
  }
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != ELFDATA2LSB) {
    out.problem = "cannot load the library: not a 64-bit little-endian ELF file";
    return out;
  }
  if (eh.e_type != ET_DYN) {
    out.problem = "cannot load the library: an ELF file of type " + std::to_string(eh.e_type) +
                  ", not a shared object";
    return out;
  }
  if (eh.e_shoff == 0 || eh.e_shnum == 0) return out;  // no section table: the probe will tell
  if (eh.e_shentsize != sizeof(Elf64_Shdr) ||
      !f.fits(eh.e_shoff, std::uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr))) {
    out.problem = "cannot load the library: its section table lies outside the file (truncated?)";
    return out;
  }
  auto section = [&](std::uint64_t i, Elf64_Shdr& sh) { return f.read(eh.e_shoff + i * sizeof(Elf64_Shdr), sh); };
  for (std::uint64_t i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr sym{};
    section(i, sym);
    if (sym.sh_type != SHT_DYNSYM) continue;
    Elf64_Shdr str{};
    if (sym.sh_entsize != sizeof(Elf64_Sym) || !f.fits(sym.sh_offset, sym.sh_size) || sym.sh_link >= eh.e_shnum ||
        !section(sym.sh_link, str) || str.sh_type != SHT_STRTAB || !f.fits(str.sh_offset, str.sh_size)) {
      out.problem = "cannot load the library: its dynamic symbol table is malformed";
      return out;
    }
    out.symbols_known = true;
    for (std::uint64_t off = 0; off + sizeof(Elf64_Sym) <= sym.sh_size; off += sizeof(Elf64_Sym)) {
      Elf64_Sym s{};
      f.read(sym.sh_offset + off, s);
      const unsigned bind = ELF64_ST_BIND(s.st_info), type = ELF64_ST_TYPE(s.st_info);
      if (s.st_shndx == SHN_UNDEF || s.st_name >= str.sh_size) continue;
      if (bind != STB_GLOBAL && bind != STB_WEAK && bind != STB_GNU_UNIQUE) continue;
      if (ELF64_ST_VISIBILITY(s.st_other) != STV_DEFAULT && ELF64_ST_VISIBILITY(s.st_other) != STV_PROTECTED) continue;
      const char* name = f.chars(str.sh_offset + s.st_name);
      const std::string_view sv(name, ::strnlen(name, str.sh_size - s.st_name));
      if (sv.substr(0, kPrefix.size()) != kPrefix) continue;
      out.headgrad[std::string(sv)] = type == STT_FUNC || type == STT_GNU_IFUNC ? SymbolKind::function
                                      : type == STT_OBJECT || type == STT_TLS   ? SymbolKind::data
                                                                                : SymbolKind::other;
    }
    return out;
  }
  return out;  // a shared object without .dynsym exports nothing
}

Classified classify_exports(const std::function<std::optional<SymbolKind>(const std::string&)>& lookup) {
  Classified c;
  auto reject = [&](std::string reason) {
    c.reason = std::move(reason);
    return c;
  };
  // A function symbol must be one: calling data as code is a crash.
  auto not_a_function = [&](const char* name) -> std::optional<std::string> {
    const auto k = lookup(name);
    if (k && *k != SymbolKind::function && *k != SymbolKind::unknown)
      return std::string("'") + name + "' is a " + (*k == SymbolKind::data ? "data symbol" : "symbol") +
             ", not a function; export it with " +
             (std::string_view(name) == c_abi_symbol ? "HG_C_EXPORT (<headgrad/c_plugin.h>)" : "HEADGRAD_PLUGIN(YourClass)");
    return std::nullopt;
  };
  if (lookup(c_abi_symbol) && lookup(c_plugin_symbol)) {
    for (const char* name : {c_abi_symbol, c_plugin_symbol})
      if (auto why = not_a_function(name)) return reject(*why);
    c.kind = PluginKind::c;
    return c;
  }
  if (lookup(plugin_build_symbol)) {
    if (auto why = not_a_function(plugin_build_symbol)) return reject(*why);
    if (!lookup(plugin_factory_symbol))
      return reject(std::string("no factory: the symbol '") + plugin_factory_symbol +
                    "' is missing (export it with HEADGRAD_PLUGIN(YourClass))");
    c.kind = PluginKind::cxx;
    return c;
  }
  if (lookup(old_abi_symbol))
    return reject(std::string("built for an older headgrad: it exports '") + old_abi_symbol + "', not '" +
                  plugin_build_symbol + "'; rebuild the plugin against this headgrad");
  c.not_a_plugin = true;
  return reject(std::string("not a headgrad plugin: no symbol '") + plugin_build_symbol + "' (C++) or '" +
                c_abi_symbol + "' (C)");
}

Classified classify_exports(const ElfExports& exports) {
  return classify_exports([&](const std::string& name) -> std::optional<SymbolKind> {
    const auto it = exports.headgrad.find(name);
    if (it == exports.headgrad.end()) return std::nullopt;
    return it->second;
  });
}

}  // namespace headgrad::detail
