#include "case/select.hpp"

#include <fnmatch.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace headgrad::runner {

// A whole decimal number, nothing else ("3", not "3x", "-1" or "").
std::optional<std::size_t> whole_number(std::string_view text) {
  std::size_t n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return n;
}

bool glob_match(std::string_view pattern, std::string_view text) {
  return ::fnmatch(std::string(pattern).c_str(), std::string(text).c_str(), 0) == 0;
}

std::vector<const CaseSpec*> select_cases(const Suite& suite, const std::string& filter) {
  std::vector<const CaseSpec*> out;
  for (const auto& c : suite.cases)
    if (filter.empty() || filter == c.name || glob_match(filter, c.name) || glob_match(filter, c.base_name))
      out.push_back(&c);
  return out;
}

// ---- shards ----

namespace {

std::uint64_t fnv1a(std::string_view bytes, std::uint64_t h = 14695981039346656037ull) {
  for (const char ch : bytes) {
    h ^= static_cast<unsigned char>(ch);
    h *= 1099511628211ull;
  }
  return h;
}

std::string hex16(std::uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace

ShardSpec parse_shard(std::string_view text) {
  const auto slash = text.find('/');
  const auto k = slash == std::string_view::npos ? std::nullopt : whole_number(text.substr(0, slash));
  const auto n = slash == std::string_view::npos ? std::nullopt : whole_number(text.substr(slash + 1));
  if (!k || !n || *n == 0 || *k == 0 || *k > *n)
    throw std::invalid_argument("--shard: expected K/N with 1 <= K <= N (shards are numbered from 1), got '" +
                                std::string(text) + "'");
  return {*k, *n};
}

std::optional<ShardSpec> shard_from_environment() {
  const char* index = std::getenv("GTEST_SHARD_INDEX");
  const char* total = std::getenv("GTEST_TOTAL_SHARDS");
  if (!index && !total) return std::nullopt;
  if (!index || !total)
    throw std::invalid_argument(std::string(index ? "GTEST_SHARD_INDEX is set but GTEST_TOTAL_SHARDS is not"
                                                  : "GTEST_TOTAL_SHARDS is set but GTEST_SHARD_INDEX is not"));
  const auto k = whole_number(index), n = whole_number(total);
  if (!k || !n || *n == 0 || *k >= *n)
    throw std::invalid_argument("GTEST_SHARD_INDEX=" + std::string(index) + " GTEST_TOTAL_SHARDS=" + total +
                                ": expected 0 <= GTEST_SHARD_INDEX < GTEST_TOTAL_SHARDS (0-based, as GoogleTest)");
  return ShardSpec{*k + 1, *n};
}

std::vector<const CaseSpec*> shard_cases(const std::vector<const CaseSpec*>& selected, ShardSpec shard) {
  std::vector<const CaseSpec*> out;
  for (std::size_t p = shard.index - 1; p < selected.size(); p += shard.count) out.push_back(selected[p]);
  return out;
}

namespace {

std::string case_key(const CaseSpec& c) {
  return c.name + '\0' + describe_case(c) + '\0' + join(c.compare) + '\0' + c.reference_text + '\0' +
         join(c.check) + '\0' + std::to_string(c.seed) + '\0' + (c.expect_fail ? "x" : "") + c.expect_diagnosis +
         '\0';
}

}  // namespace

std::string case_hash(const CaseSpec& c) { return hex16(fnv1a(case_key(c))); }

SuiteIdentity suite_identity(const Suite& suite, const std::vector<const CaseSpec*>& selected) {
  SuiteIdentity id;
  std::ifstream in(suite.file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  id.file_hash = hex16(fnv1a(bytes));
  std::uint64_t h = fnv1a("");
  for (const CaseSpec* c : selected) {
    const std::string key = case_key(*c);
    h = fnv1a(key, h);
    id.case_hashes.push_back(hex16(fnv1a(key)));
  }
  id.cases_hash = hex16(h);
  id.selected = selected.size();
  id.expanded = suite.cases.size();
  return id;
}

const CaseSpec* find_case(const Suite& suite, const std::string& name, const std::string& suite_label,
                          std::string* problem) {
  std::vector<std::string> names;
  for (const auto& c : suite.cases) {
    if (c.name == name) return &c;
    names.push_back(c.name);
  }
  const std::string near = closest_match(name, names);
  if (problem)
    *problem = "no case named '" + name + "' in " + suite_label +
               (near.empty() ? " (cases: " + join(names) + ")" : " (did you mean '" + near + "'?)");
  return nullptr;
}

}  // namespace headgrad::runner
