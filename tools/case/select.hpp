// Which cases a run takes: --filter's glob, --shard's part, and the identity
// of the selection that a report records (so shards of different suites are
// never merged).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "case/suite.hpp"

namespace headgrad::runner {

// A whole decimal number, nothing else ("3", not "3x", "-1" or "").
std::optional<std::size_t> whole_number(std::string_view text);

// One of N parts of a suite (--shard K/N, 1-based): the selected cases at
// positions p with p % N == K - 1, so every case is in exactly one shard.
struct ShardSpec {
  std::size_t index = 1, count = 1;
  std::string str() const { return std::to_string(index) + "/" + std::to_string(count); }
  bool operator==(const ShardSpec&) const = default;
};

// What a report was made from, so that shards of different suites (or of the
// same file under another --filter, or edited in between) are never merged.
struct SuiteIdentity {
  std::string file_hash;   // FNV-1a 64 of the suite file's bytes, 16 hex digits
  std::string cases_hash;  // of the selected cases as expanded (names, shapes, pairs, checks, seeds)
  std::size_t selected = 0;  // cases selected (--filter) before sharding
  std::size_t expanded = 0;  // cases of the suite as expanded (what case indices range over)
  std::vector<std::string> case_hashes;  // case_hash of each selected case, in suite order
  bool operator==(const SuiteIdentity&) const = default;
};
// FNV-1a 64 of what identifies a case (name, shape, pair, reference, checks,
// seed, expect), 16 hex digits: merge checks each shard's cases against the
// identity's list, so a shard of another suite cannot pass under a copied identity.
std::string case_hash(const CaseSpec& c);

// fnmatch-style: *, ?, [...]. A case is selected when the filter equals its
// name, or matches its name or its base name (the name before a sweep's [..]).
bool glob_match(std::string_view pattern, std::string_view text);
std::vector<const CaseSpec*> select_cases(const Suite& suite, const std::string& filter);

// The case named exactly `name` (a sweep point's full name included), or
// nullptr with *problem set to "no case named 'X' in SUITE (did you mean
// 'Y'?)" or "... (cases: a, b)"; `suite_label` names the suite there
// (`headgrad export --case`, `headgrad bench --check --case`).
const CaseSpec* find_case(const Suite& suite, const std::string& name, const std::string& suite_label,
                          std::string* problem);

// "K/N" with 1 <= K <= N (1-based); std::invalid_argument saying what was expected.
ShardSpec parse_shard(std::string_view text);
// GTEST_SHARD_INDEX (0-based, as GoogleTest reads it) and GTEST_TOTAL_SHARDS:
// none when neither is set; std::invalid_argument when one is missing or bad.
std::optional<ShardSpec> shard_from_environment();
// This shard's part of `selected`, in suite order.
std::vector<const CaseSpec*> shard_cases(const std::vector<const CaseSpec*>& selected, ShardSpec shard);
// The identity of `suite` (file read again for its hash) as `selected` expands it.
SuiteIdentity suite_identity(const Suite& suite, const std::vector<const CaseSpec*>& selected);

}  // namespace headgrad::runner
