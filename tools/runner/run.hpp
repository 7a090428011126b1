// Running one case: its inputs made once, each side on its own copy of them
// (isolated), then the tensor-by-tensor comparison and the case's verdict.
// Nothing here analyzes a failure: tools/analysis runs cases through
// run_case, then localizes and diagnoses those that fail (analysis/analyze.hpp
// has run_suite, the whole job).
//
//   Suite suite = load_suite("configs/default.yaml");
//   PluginRegistry registry;
//   registry.load_directories(plugin_search_path({}));
//   CaseResult r = run_case(suite.cases[0], registry, {});
//   keep_report_data(r, false);   // what reports need; the tensors go
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <headgrad/loader.hpp>

#include "runner/compare.hpp"
#include "runner/error_maps.hpp"
#include "runner/execute.hpp"
#include "runner/findings.hpp"
#include "runner/inputs.hpp"
#include "runner/suite.hpp"

namespace headgrad::runner {

enum class CaseStatus {
  pass,   // every checked tensor within tolerance
  fail,   // a tensor differs, or a side returned NaN/Inf or a wrong shape
  error,  // a plugin could not run: not loaded, threw, crashed, hung
  xfail,  // expect: {fail: true} and it failed: as expected
  xpass,  // expect: {fail: true} but every tensor matched: counts as a failure
};
std::string_view case_status_name(CaseStatus s);  // "pass", "fail", "error", "xfail", "xpass"
bool is_success(CaseStatus s);                     // pass or xfail

struct CaseResult {
  CaseSpec spec;  // as run: a reference case's dims and dtype filled in from its files
  CaseStatus status = CaseStatus::pass;
  std::string cause;                 // why it failed or errored; empty on pass
  std::string lhs_label, rhs_label;  // "per_head" vs "batched" (or the reference dir)
  std::vector<SideResult> sides;     // one per plugin; their tensors moved into lhs/rhs
  std::vector<TensorComparison> tensors;  // one per checked tensor
  // Both sides' tensors, from run_case until keep_report_data (passing cases
  // drop them at once unless keep_tensors).
  TensorSet lhs, rhs;
  std::vector<TensorErrorMaps> error_maps;  // set by keep_report_data for cases that did not pass
  double seconds = 0;
  std::string mutant;  // the compared plugin that is a deliberate mutant, if any
  // Under relative_to_baseline (spec.relative_rule()): where the golden and the
  // baseline came from ("per_head in float64", "per_head in float32"); empty otherwise.
  std::string golden_label, baseline_label;
  // Filled by the analysis (tools/analysis) when the case failed on a comparison.
  std::optional<Localization> localization;
  std::optional<Diagnosis> diagnosis;

  double max_abs() const;                // over every compared tensor (NaN if any is NaN)
  std::size_t differing_tensors() const; // tensors that are not allclose
};

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

struct RunOptions {
  bool isolate = true;
  // Cases run at once, in as many forked workers (each case's sides are
  // forked from its worker); results in suite order (run_cases). 1: in this process.
  std::size_t jobs = 1;
  int threads_per_case = 0;         // HEADGRAD_NUM_THREADS of each worker's sides; 0: unchanged
  ShardSpec shard;                  // which part of the selected cases to run
  std::optional<double> timeout_s;  // overrides every case's `timeout`
  std::string filter;               // glob on case names (see select_cases); empty: all
  bool keep_tensors = false;        // keep lhs/rhs (passing cases too, and past keep_report_data)
  std::function<void(std::size_t index, std::size_t total, const CaseSpec&)> on_case_start;
  std::function<void(const CaseResult&)> on_case_done;
  std::function<void()> on_wait;  // while a plugin runs in its child, about every 200 ms
};

// Mutants caught (their case failed) and named (the diagnosis named the
// expected bug: expect.diagnosis, else the mutant's own bug).
struct MutationScore {
  std::size_t mutants = 0, caught = 0, named = 0;
};

struct SuiteResult {
  std::string name;
  std::filesystem::path file;
  std::vector<CaseResult> cases;
  double seconds = 0;
  std::vector<WeakSuiteWarning> warnings;  // bug classes the selected cases cannot expose (every shard's)
  ShardSpec shard;                         // the part run; 1/1 for a whole run or a merged report
  std::vector<std::size_t> case_indices;   // each case's index in the expanded suite (suite.cases), 0-based
  SuiteIdentity identity;

  MutationScore mutation_score() const;

  std::size_t count(CaseStatus s) const;
  std::size_t passed() const { return count(CaseStatus::pass) + count(CaseStatus::xfail); }
  std::size_t failed() const { return cases.size() - passed(); }
  // 3 if a plugin could not run, else 1 if a case failed (or passed against
  // expect: {fail: true}), else 0.
  int exit_code() const;
};

// fnmatch-style: *, ?, [...]. A case is selected when the filter equals its
// name, or matches its name or its base name (the name before a sweep's [..]).
bool glob_match(std::string_view pattern, std::string_view text);
std::vector<const CaseSpec*> select_cases(const Suite& suite, const std::string& filter);

// ---- shards and parallel cases ----

// "K/N" with 1 <= K <= N (1-based); std::invalid_argument saying what was expected.
ShardSpec parse_shard(std::string_view text);
// GTEST_SHARD_INDEX (0-based, as GoogleTest reads it) and GTEST_TOTAL_SHARDS:
// none when neither is set; std::invalid_argument when one is missing or bad.
std::optional<ShardSpec> shard_from_environment();
// This shard's part of `selected`, in suite order.
std::vector<const CaseSpec*> shard_cases(const std::vector<const CaseSpec*>& selected, ShardSpec shard);
// The identity of `suite` (file read again for its hash) as `selected` expands it.
SuiteIdentity suite_identity(const Suite& suite, const std::vector<const CaseSpec*>& selected);

// The default for -j: 1 on one core, for fewer than 4 cases, or without
// isolation; else as many cases as the cores hold at `threads` threads each
// (HEADGRAD_NUM_THREADS, else 1: suite cases are small and gain more from
// running side by side than from threads), never more than the cases.
std::size_t default_jobs(std::size_t cases, bool isolate);
// Threads for each case's plugins at `jobs` cases at once: so that jobs x threads <= cores.
int threads_per_case(std::size_t jobs);

// Each case through `check` (in suite order), on_case_start and on_case_done
// called as run_suite calls them (on_case_done always in suite order). With
// options.jobs > 1, options.jobs worker processes are forked once and fed case
// after case; each result comes back as the JSON report holds it
// (case_report_json, exact, as CBOR), so what a report shows is the same
// either way; tensors do not come back (keep_tensors runs serially). A worker
// that dies gives its case an error and is replaced; what a check throws is
// rethrown once the cases before it are reported.
// check gets `options`, in a worker without its callbacks (the parent's).
using CaseCheck = std::function<CaseResult(const CaseSpec&, const RunOptions&)>;
std::vector<CaseResult> run_cases(const std::vector<const CaseSpec*>& cases, const CaseCheck& check,
                                  const RunOptions& options);

// "plugin X is not loaded (did you mean 'Y'?); loaded: ...; rejected FILE: reason"
std::string not_loaded_cause(const std::string& name, const PluginRegistry& registry);

// One case: its inputs (make_inputs, from the files load_case_files read, or
// from the seed), both sides, the comparison, the verdict (expect: {fail:
// true} gives xfail or xpass; an expected diagnosis is the analysis's to
// check). `inputs`, when given, receives the inputs both sides were copied from.
CaseResult run_case(const CaseSpec& spec, const PluginRegistry& registry, const RunOptions& options,
                    CaseInputs* inputs = nullptr);

// What the reports need of a case that did not pass: its error maps (the HTML
// heatmaps), made from lhs and rhs; then lhs and rhs are dropped unless
// keep_tensors, and so is r.spec's hold on the case's files. The worst
// indices and per-tensor figures are in r.tensors already.
void keep_report_data(CaseResult& r, bool keep_tensors);

}  // namespace headgrad::runner
