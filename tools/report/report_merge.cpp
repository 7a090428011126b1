// headgrad merge: the shard reports of one suite read (bounded, every field
// checked by the schema in report_json.cpp), checked against each other and
// against their identity, and joined into one result in suite order.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "report/report.hpp"

namespace headgrad::runner {

namespace {

using nlohmann::json;

std::string size_text(std::uintmax_t bytes) {
  char buf[32];
  if (bytes >= (std::uintmax_t{1} << 30)) std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / 1073741824.0);
  else std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576.0);
  return buf;
}

std::string file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a fifo";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

// Closes the descriptor on every path out.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Up to 10 shard names, then how many more: a count claimed by a report never sizes a list.
std::string some_shards(const std::vector<std::string>& names, std::size_t total) {
  std::string s = join(names);
  if (total > names.size()) s += " and " + std::to_string(total - names.size()) + " more";
  return s;
}

struct Shard {
  std::filesystem::path file;
  SuiteResult result;
};

// What one shard's report can say about itself: its case indices strictly
// increasing (suite order), each within the expanded suite, and as many as
// shard K/N of the selected cases holds.
void check_own_indices(const Shard& s) {
  const std::string& file = s.file.string();
  const SuiteResult& r = s.result;
  const std::size_t k = r.shard.index, n = r.shard.count, selected = r.identity.selected;
  for (std::size_t i = 0; i < r.case_indices.size(); ++i) {
    const std::size_t index = r.case_indices[i];
    const std::string at = file + ": $.shard.cases[" + std::to_string(i) + "]: ";
    if (index >= r.identity.expanded)
      throw MergeError(at + "case " + std::to_string(index) + " is out of range: suite '" + r.name + "' expands to " +
                       std::to_string(r.identity.expanded) + " cases");
    if (i > 0 && index <= r.case_indices[i - 1])
      throw MergeError(at + "case " + std::to_string(index) + " after case " + std::to_string(r.case_indices[i - 1]) +
                       ": a shard lists its cases in suite order, each once");
  }
  const std::size_t want = selected >= k ? (selected - k) / n + 1 : 0;
  if (r.case_indices.size() != want)
    throw MergeError(file + ": $.shard.cases: shard " + r.shard.str() + " of " + std::to_string(selected) +
                     " selected cases holds " + std::to_string(want) + ", this file lists " +
                     std::to_string(r.case_indices.size()));
}

// Where each case is held, by its index in the suite.
struct Held {
  Shard* shard;
  std::size_t at;  // in shard->result.cases
};

// The selected cases in suite order are the union of the shards' indices:
// the p-th belongs to shard p % N + 1 (shard_cases) and is the case whose
// hash the identity lists p-th, so indices swapped between shards, one shard
// holding another's, cases swapped within a shard or a foreign suite's shard
// under a copied identity are each refused, naming the file.
void check_positions(const std::map<std::size_t, Held>& cases, const SuiteResult& one) {
  std::size_t p = 0;
  for (const auto& [index, held] : cases) {
    const SuiteResult& r = held.shard->result;
    const std::string file = held.shard->file.string();
    const std::size_t owner = p % one.shard.count + 1;
    if (r.shard.index != owner)
      throw MergeError(file + ": $.shard.cases[" + std::to_string(held.at) + "]: case " + std::to_string(index) +
                       " is the suite's selected case " + std::to_string(p) + ", which shard " +
                       std::to_string(owner) + "/" + std::to_string(one.shard.count) + " holds, not shard " +
                       r.shard.str());
    const CaseSpec& c = r.cases[held.at].spec;
    const std::string hash = case_hash(c);
    if (hash != one.identity.case_hashes[p])
      throw MergeError(file + ": $.cases[" + std::to_string(held.at) + "]: case '" + c.name + "' is not case " +
                       std::to_string(index) + " of suite '" + one.name + "' (its hash " + hash +
                       " differs from the identity's " + one.identity.case_hashes[p] + ")");
    ++p;
  }
}

}  // namespace

nlohmann::json read_report_file(const std::filesystem::path& file) {
  auto refuse = [&](const std::string& why) { return ReportError(file.string() + ": " + why); };
  // O_NONBLOCK: opening a fifo must not wait for a writer; it is refused below.
  const Fd in{::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  if (in.fd < 0) throw refuse(std::string("cannot be read: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(in.fd, &st) != 0) throw refuse(std::string("cannot be read: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw refuse("is " + file_kind(st.st_mode) + ", not a regular file: a report is a file");
  const auto size = static_cast<std::uintmax_t>(st.st_size);
  if (size > kMaxReportBytes)
    throw refuse("is " + size_text(size) + "; a report of headgrad run is at most " + size_text(kMaxReportBytes));
  std::string bytes(static_cast<std::size_t>(size), '\0');
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(in.fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw refuse(std::string("cannot be read: ") + std::strerror(errno));
    if (n == 0) break;  // shrank while read: what is there is parsed
    done += static_cast<std::size_t>(n);
  }
  bytes.resize(done);
  try {
    return json::parse(bytes);
  } catch (const json::exception& e) {
    throw refuse(std::string("is not a JSON report of headgrad run (") + e.what() + ")");
  }
}

SuiteResult merge_shard_reports(const std::vector<std::filesystem::path>& files) {
  if (files.empty()) throw MergeError("no report to merge");
  std::vector<Shard> shards;
  for (const auto& f : files) {
    const json report = read_report_file(f);
    if (!report.is_object() || !report.contains("headgrad_version") || !report.contains("cases"))
      throw ReportError(f.string() + ": is not a JSON report of headgrad run (no 'headgrad_version' or 'cases')");
    if (!report.contains("shard") || !report.contains("suite_identity"))
      throw ReportError(f.string() +
                        ": is a report without 'shard' and 'suite_identity' (written by an older headgrad): run it again");
    Shard s{f, suite_result_from_json(report, f.string())};
    if (s.result.shard.index > s.result.shard.count)
      throw MergeError(f.string() + ": $.shard.index: holds shard " + s.result.shard.str() +
                       ", which is no shard K/N with 1 <= K <= N");
    check_own_indices(s);
    shards.push_back(std::move(s));
  }
  const Shard& first = shards.front();
  const SuiteResult& one = first.result;
  std::map<std::size_t, const Shard*> by_index;  // shard K -> its report
  for (const Shard& s : shards) {
    const SuiteResult& r = s.result;
    if (r.identity != one.identity || r.name != one.name || r.shard.count != one.shard.count)
      throw MergeError(s.file.string() + ": is shard " + r.shard.str() + " of suite '" + r.name + "' (" +
                       r.file.string() + ", hash " + r.identity.file_hash + "/" + r.identity.cases_hash + ", " +
                       std::to_string(r.identity.selected) + " cases), not of the suite of " + first.file.string() +
                       ": '" + one.name + "' (" + one.file.string() + ", hash " + one.identity.file_hash + "/" +
                       one.identity.cases_hash + ", " + std::to_string(one.identity.selected) + " cases), shard " +
                       one.shard.str());
    const auto [it, inserted] = by_index.emplace(r.shard.index, &s);
    if (!inserted)
      throw MergeError(s.file.string() + ": is shard " + r.shard.str() + " again (so is " + it->second->file.string() +
                       ")");
  }
  // Up to 10 missing shards named, the rest counted: the loop meets each given
  // shard once and stops at the 10th missing one, whatever count a file claims.
  std::vector<std::string> missing;
  for (std::size_t k = 1; k <= one.shard.count && missing.size() < 10; ++k)
    if (!by_index.count(k)) missing.push_back(std::to_string(k) + "/" + std::to_string(one.shard.count));
  const std::size_t missing_count = one.shard.count - by_index.size();  // every index is <= count
  if (missing_count) {
    std::vector<std::string> given;
    for (const Shard& s : shards) given.push_back(s.file.string());
    throw MergeError(join(given) + ": shard" + std::string(missing_count > 1 ? "s " : " ") +
                     some_shards(missing, missing_count) + " of suite '" + one.name + "' missing (given: " +
                     std::to_string(shards.size()) + " of " + std::to_string(one.shard.count) + ")");
  }

  // Cases by their index in the suite: that is suite order.
  std::map<std::size_t, Held> cases;
  SuiteResult result;
  for (Shard& s : shards) {
    for (std::size_t i = 0; i < s.result.cases.size(); ++i) {
      const auto [it, inserted] = cases.emplace(s.result.case_indices[i], Held{&s, i});
      if (!inserted)  // which of the two is wrong cannot be told: both are named
        throw MergeError(it->second.shard->file.string() + ": $.shard.cases[" + std::to_string(it->second.at) +
                         "]: case " + std::to_string(it->first) + " is held twice: here and in " + s.file.string() +
                         " ($.shard.cases[" + std::to_string(i) + "])");
    }
    result.seconds += s.result.seconds;
  }
  check_positions(cases, one);  // every shard holds its count: cases.size() == selected
  result.name = one.name;
  result.file = one.file;
  result.identity = one.identity;
  result.warnings = one.warnings;
  for (const auto& [index, held] : cases) {
    result.cases.push_back(std::move(held.shard->result.cases[held.at]));
    result.case_indices.push_back(index);
  }
  return result;
}

}  // namespace headgrad::runner
