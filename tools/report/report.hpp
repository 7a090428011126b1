// Reports of a suite's results: the terminal table, JSON, JUnit XML, HTML.
//
//   TerminalStyle style = terminal_style(cases, /*color=*/isatty(1), quiet, verbose);
//   print_case(std::cout, result, style);     // as each case finishes
//   print_summary(std::cout, suite_result, style);
//   write_report("out.json", json_report(suite_result).dump(2));
//
// Terminal, one line per case, failures expanded below their line:
//   OK     closed-book  MHA(B=2,T=3,D=8,H=2,causal)  per_head vs batched  max|Δ| 2.2e-16  (6 tensors, 3 ms)
// and a summary whose first line is exactly "N passed, M failed".
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <filesystem>
#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "judge/run_case.hpp"

namespace headgrad::runner {

struct TerminalStyle {
  bool color = false;    // ANSI colors (a terminal, and NO_COLOR unset)
  bool quiet = false;    // only cases that did not succeed, and the summary
  bool verbose = false;  // every tensor of every case
  std::size_t name_width = 0, shape_width = 0, pair_width = 0;  // column widths
};
// Column widths fitted to the cases about to run.
TerminalStyle terminal_style(const std::vector<const CaseSpec*>& cases, bool color, bool quiet, bool verbose);

// ---- shared formatting ----
std::string format_figure(double x);    // "2.2e-16"; "nan", "inf"
std::string format_ratio(double x);     // "1.07" from 0.01 to 1e4, else as format_figure
std::string format_value(double x);     // "0.123456789" (%.9g)
std::string format_duration(double s);  // "3 ms", "1.20 s"
std::string status_label(CaseStatus s); // "OK", "FAIL", "ERROR", "XFAIL", "XPASS"
std::string pair_label(const CaseResult& r);  // "per_head vs batched"
// The lines that expand one tensor's figures (no color), indented by `indent`.
std::string tensor_details(const TensorComparison& t, const CaseResult& r, std::size_t indent);
// "as accurate as the oracle in this dtype" | "1.2e+05x the oracle's own error in this dtype"
std::string baseline_verdict(const BaselineCheck& b);
// tensor_details of a tensor judged by relative_to_baseline.
std::string baseline_details(const TensorComparison& t, const CaseResult& r, std::size_t indent);
// Every differing tensor's details (all tensors with `all`), for failure texts.
std::string case_details(const CaseResult& r, bool all, std::size_t indent);
// The diagnosis, where the error lives and the localization table, as lines
// (empty when the case was not analyzed).
std::string analysis_details(const CaseResult& r, std::size_t indent);

// ---- terminal ----
void print_header(std::ostream& os, const Suite& suite, std::size_t selected, const PluginRegistry& registry,
                  const TerminalStyle& style);
void print_case(std::ostream& os, const CaseResult& r, const TerminalStyle& style);
void print_summary(std::ostream& os, const SuiteResult& result, const TerminalStyle& style);

// ---- files ----
// The JSON report's schema (report_json.cpp): each struct's fields are listed
// once, for writing and reading alike. Every case, every tensor's figures and
// verdicts, timings, causes. Numbers that are not finite (NaN, Inf) are
// written as null (read back as NaN) unless `exact`, which keeps them as
// numbers, for a binary encoding such as CBOR (what a -j worker sends).
nlohmann::json json_report(const SuiteResult& result, bool exact = false);
nlohmann::json case_report_json(const CaseResult& r, bool exact = false);

// A report (or a -j worker's result) that is not what headgrad writes, as
// "SOURCE: $.cases[1].error_maps[0].cells: expected 12 numbers (cell_rows x
// cell_cols), got 4": the source, the JSON path and what was expected (exit 2).
class ReportError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};
// The reverse of case_report_json, every value's type and range checked
// (ReportError naming `source` and the path): the case as the reports need it
// (no tensors, no files). `spec` given: the case's spec is that one (a -j
// worker's case; the JSON's is still checked), else the one read.
CaseResult case_result_from_json(const nlohmann::json& j, const CaseSpec* spec = nullptr,
                                 const std::string& source = "the case's result");
// The reverse of json_report, checked the same way; shard, case_indices and
// identity as the report holds them (not checked against each other: merge does).
SuiteResult suite_result_from_json(const nlohmann::json& j, const std::string& source);

// ---- merging shard reports (headgrad merge) ----
// Shards that cannot be merged (inconsistent with each other or with their
// identity): names the file and why (exit 2).
class MergeError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};
// The largest report merge reads: far above a real suite's report, far below
// what a hostile one could make it allocate.
inline constexpr std::uintmax_t kMaxReportBytes = std::uintmax_t{256} << 20;
// One report file parsed, read only if it is a regular file (a fifo or a
// folder is refused with the reason) of at most kMaxReportBytes; ReportError
// naming the file otherwise, or when it is no JSON.
nlohmann::json read_report_file(const std::filesystem::path& file);
// The JSON reports of shards 1/N .. N/N of one suite, as one result in suite
// order (shard 1/1, every case; seconds: the shards' sum), whose json_report
// equals the unsharded run's apart from timings. Every file is read and
// checked before anything is returned: ReportError for a file that is no
// report or holds a wrong value; MergeError for shards of different suites
// (identity) or counts, a missing or duplicated shard, case indices that are
// not the shard's, a case that is not the one its index names in the
// identity (case_hashes).
SuiteResult merge_shard_reports(const std::vector<std::filesystem::path>& files);

// A <testcase> per case; <failure> (a mismatch, NaN, an unexpected pass) or
// <error> (a plugin that could not run) with the figures.
std::string junit_report(const SuiteResult& result);
// One self-contained page (no network): the summary and a table per case.
std::string html_report(const SuiteResult& result);

// Invalid input text (a plugin's name or message, a case name) cannot break
// a report: every file is valid UTF-8, and the terminal shows controls escaped.
std::string xml_escape(std::string_view text);  // also fit for HTML; see utf8_replacements
// `text` with each invalid UTF-8 byte replaced by U+FFFD; `replaced` counts them.
std::string valid_utf8(std::string_view text, std::size_t* replaced = nullptr);
// For one terminal line: control characters (C0, DEL, C1, line separators,
// bidi overrides) escaped as \n, \x1b, \u202e, invalid bytes as \xff; a name
// holding "\n  OK" cannot forge a line. keep_newlines: for multi-line text we built.
std::string terminal_safe(std::string_view text, bool keep_newlines = false);
// Characters xml_escape has replaced by U+FFFD on this thread so far: a
// report renders, then says how many it replaced (the difference).
std::size_t utf8_replacements();
// The reports' note: "3 input bytes or characters (in names or messages) were replaced by U+FFFD: ...".
std::string text_replaced_note(std::size_t count);
// Writes through a temporary file in the same folder, renamed into place: a
// reader never sees a half-written file, and two runs never interleave.
// Throws std::runtime_error naming the file when it cannot be written.
void write_report(const std::filesystem::path& file, const std::string& text);
// Several reports of one run: each text staged in its temporary file first,
// then all renamed into place, so that a failure to write one leaves every
// file as it was (the renames, in one folder each, are what can still fail).
void write_reports_all_or_none(const std::vector<std::pair<std::filesystem::path, std::string>>& files);
// The same for any writer: `write` fills the temporary path it is given.
void write_file_atomically(const std::filesystem::path& file,
                           const std::function<void(const std::filesystem::path&)>& write);

}  // namespace headgrad::runner
