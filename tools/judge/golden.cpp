#include "judge/golden.hpp"

#include <headgrad/parallel.hpp>

namespace headgrad::runner {

std::string oracle_name(const CaseSpec&, const PluginRegistry&) { return "per_head"; }

std::string missing_golden(const CaseSpec& c, const PluginRegistry& registry) {
  if (!c.relative_rule() || (c.files && !c.files->golden.empty()) || registry.find("per_head")) return "";
  return "case '" + c.name + "' (" + std::string(dtype_name(c.dtype)) +
         ", judged relative_to_baseline) has no golden: the oracle per_head is not loaded" +
         (c.is_reference() ? " and the reference " + c.reference_text + " has no golden/ folder" : "") +
         "; a compared plugin's own float64 run would make the side under test its own judge. Put per_head on "
         "the plugin path (--plugin-path), " +
         (c.is_reference() ? "give the reference a golden/ folder, " : "") + "or say tolerance: {rule: allclose}";
}

void check_goldens(const std::vector<const CaseSpec*>& cases, const PluginRegistry& registry) {
  for (const CaseSpec* c : cases)
    if (const std::string problem = missing_golden(*c, registry); !problem.empty())
      throw ConfigError(c->source, problem);
}

CaseInputs inputs_in_dtype(const CaseInputs& in, DType dtype) {
  return map_inputs(in, [dtype](const InputField& field, const Tensor& t) {
    // a mask is bool and positions are token numbers, not values of the case's dtype
    if (field.role == InputRole::mask || field.role == InputRole::positions) return t;
    return t.contiguous().to(dtype);
  });
}

GoldenRun run_golden(const CaseSpec& c, const CaseInputs& in, const PluginRegistry& registry,
                     const ExecOptions& exec) {
  GoldenRun g;
  g.oracle = oracle_name(c, registry);
  const LoadedPlugin* oracle = registry.find(g.oracle);
  const bool own_golden = c.files && !c.files->golden.empty();
  if (!oracle && !own_golden) {
    g.cause = missing_golden(c, registry);
    g.plugin_error = true;
    return g;
  }
  // The oracle's own math on contiguous inputs: the layout is the tested sides' business.
  CaseSpec at = c;
  at.layout = InputLayout::contiguous;
  at.files.reset();
  const std::string dtype(dtype_name(c.dtype));
  if (own_golden) {
    // The reference's own math in both precisions: its float64 golden/ and its
    // tensors in the dtype (an oracle baseline would measure the oracle against
    // the reference, and pass anything when the reference is wrong).
    g.golden = c.files->golden;
    g.baseline = c.files->expected;
    g.golden_label = c.reference_text + "/golden";
    g.baseline_label = c.reference_text + " (its " + dtype + " tensors)";
    return g;
  }
  g.golden_label = g.oracle + " in float64";
  g.baseline_label = g.oracle + " in " + dtype;
  // Both runs in one child: the baseline reuses the memory the golden freed.
  CaseSpec in_f64 = at;
  in_f64.dtype = DType::float64;
  at.dtype = c.dtype;
  const CaseInputs golden_inputs = inputs_in_dtype(in, DType::float64), baseline_inputs = inputs_in_dtype(in, c.dtype);
  std::vector<SideResult> runs = run_sides({{&in_f64, &golden_inputs}, {&at, &baseline_inputs}}, *oracle, exec);
  const std::pair<TensorSet*, std::string> into[] = {{&g.golden, "the golden (" + g.golden_label + ")"},
                                                     {&g.baseline, "the baseline (" + g.baseline_label + ")"}};
  for (std::size_t k = 0; k < runs.size(); ++k) {
    SideResult& s = runs[k];
    if (s.status != SideStatus::ok) {
      g.cause += (g.cause.empty() ? "" : "; ") + into[k].second + ": " + s.cause;
      g.plugin_error = g.plugin_error || is_plugin_error(s.status);
    } else {
      *into[k].first = std::move(s.tensors);
    }
    s.tensors.clear();
    g.runs.push_back(std::move(s));
  }
  return g;
}

void judge_sides(std::vector<TensorComparison>& cmps, const CaseSpec& c, const GoldenRun& g, const TensorSet& lhs,
                 const TensorSet& rhs, const std::string& lhs_label, const std::string& rhs_label) {
  parallel_items(static_cast<std::int64_t>(cmps.size()), [&](std::int64_t i, int) {  // one tensor per worker
    TensorComparison& cmp = cmps[static_cast<std::size_t>(i)];
    const Tensor* golden = find_tensor(g.golden, cmp.name);
    const Tensor* baseline = find_tensor(g.baseline, cmp.name);
    judge_by_baseline(cmp, {{lhs_label, find_tensor(lhs, cmp.name)}, {rhs_label, find_tensor(rhs, cmp.name)}},
                      golden ? *golden : Tensor(), baseline ? *baseline : Tensor(), c.baseline_k.k_for(cmp.name),
                      c.dtype, c.level);
  });
}

}  // namespace headgrad::runner
