#include "case/reads.hpp"

#include <stdexcept>
#include <system_error>

namespace fs = std::filesystem;

namespace headgrad::runner {

namespace {

// The path with every symlink, "." and ".." resolved as far as it exists.
fs::path resolved(const fs::path& p) {
  std::error_code ec;
  fs::path abs = fs::absolute(p, ec);
  if (ec) abs = p;
  fs::path r = fs::weakly_canonical(abs, ec);
  return ec ? abs.lexically_normal() : r;
}

// `inner` is `outer` or lies under it, component by component.
bool within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i) {
    if (o->empty() && std::next(o) == outer.end()) break;  // a trailing separator
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

// Why writing `out` would touch `read`; empty when it would not.
std::string clash(const fs::path& out, const ReadPath& read) {
  std::error_code ec;
  if (fs::exists(out, ec) && fs::exists(read.path, ec) && fs::equivalent(out, read.path, ec))
    return "is " + read.role + " " + read.path.string();
  const fs::path o = resolved(out), r = resolved(read.path);
  if (o == r) return "is " + read.role + " " + read.path.string();
  if (read.folder && within(o, r)) return "lies inside " + read.role + " " + read.path.string();
  return "";
}

}  // namespace

std::vector<ReadPath> run_reads(const Suite& suite, const std::vector<const CaseSpec*>& cases) {
  std::vector<ReadPath> out = {{"the suite", suite.file, false}};
  for (const CaseSpec* c : cases) {
    if (!c->mask_file.empty()) out.push_back({"the mask file of case '" + c->name + "'", c->mask_file, false});
    if (!c->is_reference()) continue;
    const bool npz = c->reference.extension() == ".npz";
    out.push_back({std::string(npz ? "the reference file" : "the reference directory") + " of case '" + c->name + "'",
                   c->reference, !npz});
  }
  return out;
}

void check_outputs(const std::vector<std::pair<std::string, fs::path>>& outputs, const std::vector<ReadPath>& reads) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const auto& [option, file] = outputs[i];
    const std::string what = option + " " + file.string();
    const fs::path folder = file.parent_path().empty() ? fs::path(".") : file.parent_path();
    std::error_code ec;
    if (!fs::is_directory(folder, ec))
      throw std::invalid_argument(what + ": the folder " + folder.string() + " does not exist");
    if (fs::is_directory(file, ec)) throw std::invalid_argument(what + ": is a folder, not a file");
    for (const auto& read : reads)
      if (const std::string why = clash(file, read); !why.empty())
        throw std::invalid_argument(what + ": " + why + ", which this run reads; it would be overwritten");
    for (std::size_t j = 0; j < i; ++j)
      if (clash(file, {"", outputs[j].second, false}) != "")
        throw std::invalid_argument(what + ": " + outputs[j].first + " writes the same file");
  }
}

void check_output_folder(const std::string& option, const fs::path& folder, const std::vector<ReadPath>& reads) {
  for (const auto& read : reads)
    if (const std::string why = clash(folder, read); !why.empty())
      throw std::invalid_argument(option + " " + folder.string() + ": " + why +
                                  ", which this run reads; its files would be overwritten");
}

}  // namespace headgrad::runner
