// What a run reads, and the one rule every output path is checked against:
// no output may be a file the run reads, nor lie inside a folder it reads
// (a reference directory and its golden/), however the path is spelled
// (./, .., symlinks, hard links).
//
//   const auto reads = run_reads(suite, selected);      // the suite, masks, references
//   check_outputs({{"--json", "r.json"}}, reads);       // std::invalid_argument (exit 2) naming both
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "case/suite.hpp"

namespace headgrad::runner {

struct ReadPath {
  std::string role;            // "the suite", "the reference directory of case 'x'"
  std::filesystem::path path;
  bool folder = false;         // everything under it is read
};

// The suite file, each case's mask file, and its reference: a directory (a
// folder: its files and golden/) or an .npz file.
std::vector<ReadPath> run_reads(const Suite& suite, const std::vector<const CaseSpec*>& cases);

// Up front, before any case runs: std::invalid_argument (exit 2) for an
// output whose folder does not exist, that is a folder, that is or lies
// inside something the run reads, or that another output also writes. Each
// output is {option, path}.
void check_outputs(const std::vector<std::pair<std::string, std::filesystem::path>>& outputs,
                   const std::vector<ReadPath>& reads);

// For a folder an option writes into (export --out DIR), which may not exist
// yet: refused when it is, or lies inside, something the run reads.
void check_output_folder(const std::string& option, const std::filesystem::path& folder,
                         const std::vector<ReadPath>& reads);

}  // namespace headgrad::runner
