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

#include "judge/compare.hpp"
#include "judge/error_maps.hpp"
#include "exec/execute.hpp"
#include "case/findings.hpp"
#include "case/inputs.hpp"
#include "case/select.hpp"
#include "case/suite.hpp"

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

// Where one case's time went, pass by pass (`headgrad bench --check`): filled
// by run_case when RunOptions::passes points here. Seconds are wall time.
struct CasePasses {
  double inputs_s = 0;             // the case's files read and its inputs made (make_inputs)
  std::vector<SideResult> sides;   // each compared side as run_side returned it (tensors dropped)
  std::vector<SideResult> oracle;  // relative_to_baseline: the golden's, then the baseline's run
  double oracle_s = 0;             // run_golden as a whole: those runs and the inputs converted for them
  double comparison_s = 0;         // compare_sets and judge_sides
  double run_case_s = 0;           // run_case from start to verdict
};

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
  CasePasses* passes = nullptr;   // when set, run_case records its passes' times there (one case at a time)
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
