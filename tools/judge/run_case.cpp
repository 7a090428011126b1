#include "judge/run_case.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include <headgrad/log.hpp>

#include "judge/golden.hpp"

namespace headgrad::runner {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

std::string_view case_status_name(CaseStatus s) {
  switch (s) {
    case CaseStatus::pass: return "pass";
    case CaseStatus::fail: return "fail";
    case CaseStatus::error: return "error";
    case CaseStatus::xfail: return "xfail";
    case CaseStatus::xpass: return "xpass";
  }
  return "?";
}

bool is_success(CaseStatus s) { return s == CaseStatus::pass || s == CaseStatus::xfail; }

double CaseResult::max_abs() const {
  double m = 0;
  for (const auto& t : tensors) {
    if (!t.problem.empty()) continue;
    if (std::isnan(t.max_abs)) return t.max_abs;
    m = std::max(m, t.max_abs);
  }
  return m;
}

std::size_t CaseResult::differing_tensors() const {
  std::size_t n = 0;
  for (const auto& t : tensors) n += t.allclose ? 0 : 1;
  return n;
}

std::size_t SuiteResult::count(CaseStatus s) const {
  std::size_t n = 0;
  for (const auto& c : cases) n += c.status == s ? 1 : 0;
  return n;
}

int SuiteResult::exit_code() const {
  if (count(CaseStatus::error) > 0) return 3;
  if (count(CaseStatus::fail) + count(CaseStatus::xpass) > 0) return 1;
  return 0;
}

MutationScore SuiteResult::mutation_score() const {
  MutationScore score;
  for (const auto& c : cases) {
    if (c.mutant.empty()) continue;
    ++score.mutants;
    const bool caught = c.status == CaseStatus::xfail || (c.status == CaseStatus::fail && c.differing_tensors() > 0);
    if (!caught) continue;
    ++score.caught;
    const std::string own = c.mutant.rfind("mutant_", 0) == 0 ? c.mutant.substr(7) : c.mutant;
    const std::string expected = c.spec.expect_diagnosis.empty() ? own : c.spec.expect_diagnosis;
    if (c.diagnosis && c.diagnosis->best() == expected) ++score.named;
  }
  return score;
}

std::string not_loaded_cause(const std::string& name, const PluginRegistry& registry) {
  std::vector<std::string> names;
  std::string loaded;
  std::size_t mutants = 0;
  for (const auto& p : registry.plugins()) {
    names.push_back(p.info.name);
    if (p.info.mutant) ++mutants;
    else loaded += (loaded.empty() ? "" : ", ") + p.info.name;
  }
  if (mutants) loaded += (loaded.empty() ? "" : ", ") + std::to_string(mutants) + " mutants";
  const std::string near = closest_match(name, names);
  std::string cause = "plugin " + name + " is not loaded" + (near.empty() ? "" : " (did you mean '" + near + "'?)") +
                      "; loaded: " + (loaded.empty() ? "none" : loaded);
  for (const auto& r : registry.rejections()) cause += "; rejected " + r.file.string() + ": " + r.reason;
  return cause;
}

namespace {

void join_cause(std::string& cause, const std::string& more) {
  cause += (cause.empty() ? "" : "; ") + more;
}

}  // namespace

CaseResult run_case(const CaseSpec& spec, const PluginRegistry& registry, const RunOptions& options,
                    CaseInputs* inputs_out) {
  const auto t0 = Clock::now();
  CaseResult res;
  res.spec = spec;
  res.lhs_label = spec.compare.at(0);
  res.rhs_label = spec.is_reference() ? spec.reference_text : spec.compare.at(1);
  auto finish = [&](CaseStatus status) {
    res.status = status;
    if (spec.expect_fail && status == CaseStatus::fail) res.status = CaseStatus::xfail;
    if (spec.expect_fail && status == CaseStatus::pass) {
      res.status = CaseStatus::xpass;
      res.cause = "expected to fail (expect: {fail: true}), but every checked tensor matched";
    }
    if (res.status == CaseStatus::pass && !options.keep_tensors) {
      res.lhs.clear();
      res.rhs.clear();
    }
    res.seconds = seconds_since(t0);
    if (options.passes) options.passes->run_case_s = res.seconds;
    logging::runner()->debug("case '{}': {} in {:.3f} s", res.spec.name, case_status_name(res.status), res.seconds);
    return std::move(res);  // each caller returns right away
  };

  // A plugin the suite names but that is not loaded fails the case, not the suite.
  for (const auto& name : spec.compare) {
    if (registry.find(name)) continue;
    SideResult side;
    side.plugin = name;
    side.status = SideStatus::not_loaded;
    side.cause = not_loaded_cause(name, registry);
    join_cause(res.cause, side.cause);
    res.sides.push_back(side);
  }
  if (!res.sides.empty()) return finish(CaseStatus::error);
  for (const auto& name : spec.compare)
    if (registry.get(name).info.mutant) res.mutant = name;

  CaseInputs inputs;
  const auto t_inputs = Clock::now();
  try {
    load_case_files(res.spec);  // a no-op when load_suite read them (dims filled in)
    inputs = make_inputs(res.spec);
  } catch (const std::exception& e) {
    res.cause = e.what();
    return finish(CaseStatus::error);
  }
  if (options.passes) options.passes->inputs_s = seconds_since(t_inputs);

  ExecOptions exec;
  exec.isolate = options.isolate;
  exec.timeout_s = options.timeout_s.value_or(spec.timeout_s);
  exec.on_wait = options.on_wait;
  for (const auto& name : spec.compare) res.sides.push_back(run_side(res.spec, inputs, registry.get(name), exec));
  std::optional<GoldenRun> golden;
  const auto t_oracle = Clock::now();
  if (res.spec.relative_rule()) golden = run_golden(res.spec, inputs, registry, exec);
  if (options.passes) {
    for (const auto& s : res.sides) {
      options.passes->sides.push_back(s);
      options.passes->sides.back().tensors.clear();
    }
    if (golden) {
      options.passes->oracle = golden->runs;
      options.passes->oracle_s = seconds_since(t_oracle);
    }
  }
  const auto t_compare = Clock::now();

  bool plugin_error = false, wrong_output = false;
  for (const auto& s : res.sides) {
    if (s.status == SideStatus::ok) continue;
    join_cause(res.cause, s.cause);
    (is_plugin_error(s.status) ? plugin_error : wrong_output) = true;
  }
  // Tensors to compare exist unless a side failed to produce any.
  bool comparable = true;
  for (const auto& s : res.sides)
    comparable = comparable && (s.status == SideStatus::ok || s.status == SideStatus::non_finite);
  if (comparable) {
    res.lhs = std::move(res.sides[0].tensors);
    res.rhs = spec.is_reference() ? inputs.expected : std::move(res.sides[1].tensors);
    res.tensors = compare_sets(res.lhs, res.rhs, res.spec, res.lhs_label, res.rhs_label);
    if (golden && golden->cause.empty()) {
      judge_sides(res.tensors, res.spec, *golden, res.lhs, res.rhs, res.lhs_label, res.rhs_label);
      res.golden_label = golden->golden_label;
      res.baseline_label = golden->baseline_label;
    }
  }
  if (golden && !golden->cause.empty()) {
    join_cause(res.cause, golden->cause);
    if (golden->plugin_error) plugin_error = true;
    else wrong_output = true;
  }
  if (options.passes) options.passes->comparison_s = seconds_since(t_compare);
  for (auto& s : res.sides) s.tensors.clear();
  if (inputs_out) *inputs_out = std::move(inputs);
  if (plugin_error) return finish(CaseStatus::error);
  if (wrong_output) return finish(CaseStatus::fail);

  std::string differing;
  for (const auto& t : res.tensors)
    if (!t.allclose) differing += (differing.empty() ? "" : ", ") + t.name;
  if (differing.empty()) return finish(CaseStatus::pass);
  res.cause = std::to_string(res.differing_tensors()) + " of " + std::to_string(res.tensors.size()) +
              " tensors differ: " + differing;
  return finish(CaseStatus::fail);
}

void keep_report_data(CaseResult& r, bool keep_tensors) {
  if (r.status != CaseStatus::pass) r.error_maps = error_maps(r.spec, r.tensors, r.lhs, r.rhs);
  r.spec.files.reset();  // the suite's to keep, not each result's
  if (keep_tensors) return;
  r.lhs = TensorSet();
  r.rhs = TensorSet();
}

}  // namespace headgrad::runner
