// Running cases: shared inputs once per case, each side isolated, then the
// tensor-by-tensor comparison and the case's verdict.
//
//   Suite suite = load_suite("configs/default.yaml");
//   PluginRegistry registry;
//   registry.load_directories(plugin_search_path({}));
//   SuiteResult result = run_suite(suite, registry, {});
//   return result.exit_code();   // 0 all as expected, 1 a comparison failed, 3 a plugin failed
//
// run_case() runs one CaseSpec on its own: the localization stage re-runs a
// failing case at changed shapes through it (copy the spec, change its dims).
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <headgrad/loader.hpp>

#include "runner/compare.hpp"
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
  TensorSet lhs, rhs;  // both sides' tensors, kept for cases that did not pass (or keep_tensors)
  double seconds = 0;
  std::string mutant;  // the compared plugin that is a deliberate mutant, if any
  // Filled when the case failed on a comparison and analysis is on.
  std::optional<Localization> localization;
  std::optional<Diagnosis> diagnosis;

  double max_abs() const;                // over every compared tensor (NaN if any is NaN)
  std::size_t differing_tensors() const; // tensors that are not allclose
};

struct RunOptions {
  bool isolate = true;
  std::optional<double> timeout_s;  // overrides every case's `timeout`
  std::string filter;               // glob on case names (see select_cases); empty: all
  bool keep_tensors = false;        // keep lhs/rhs for passing cases too
  std::function<void(std::size_t index, std::size_t total, const CaseSpec&)> on_case_start;
  std::function<void(const CaseResult&)> on_case_done;
  std::function<void()> on_wait;  // while a plugin runs in its child, about every 200 ms
  // A case that did not pass, before it is returned, with the inputs both
  // sides got: where localization and diagnosis hook in.
  std::function<void(CaseResult&, const CaseInputs&)> on_failure;
  // Localize and diagnose each case that fails a comparison (analyze.hpp);
  // an `expect: {diagnosis: NAME}` is checked against the diagnosis.
  bool analyze = true;
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
  std::vector<WeakSuiteWarning> warnings;  // bug classes the selected cases cannot expose

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

// "plugin X is not loaded (did you mean 'Y'?); loaded: ...; rejected FILE: reason"
std::string not_loaded_cause(const std::string& name, const PluginRegistry& registry);

CaseResult run_case(const CaseSpec& spec, const PluginRegistry& registry, const RunOptions& options);
SuiteResult run_suite(const Suite& suite, const PluginRegistry& registry, const RunOptions& options);

}  // namespace headgrad::runner
