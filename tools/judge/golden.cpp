#include "judge/golden.hpp"

namespace headgrad::runner {

std::string oracle_name(const CaseSpec& c, const PluginRegistry& registry) {
  return registry.find("per_head") ? std::string("per_head") : c.compare.at(0);
}

CaseInputs inputs_in_dtype(const CaseInputs& in, DType dtype) {
  auto as = [&](const Tensor& t) { return t.defined() ? t.contiguous().to(dtype) : t; };
  CaseInputs out;
  out.level = in.level;
  out.x = as(in.x);
  out.wq = as(in.wq);
  out.wk = as(in.wk);
  out.wv = as(in.wv);
  out.wo = as(in.wo);
  out.bq = as(in.bq);
  out.bk = as(in.bk);
  out.bv = as(in.bv);
  out.bo = as(in.bo);
  out.q = as(in.q);
  out.k = as(in.k);
  out.v = as(in.v);
  out.r = as(in.r);
  out.mask = in.mask;            // bool
  out.positions = in.positions;  // token positions, not values of the case's dtype
  return out;
}

GoldenRun run_golden(const CaseSpec& c, const CaseInputs& in, const PluginRegistry& registry,
                     const ExecOptions& exec) {
  GoldenRun g;
  g.oracle = oracle_name(c, registry);
  const LoadedPlugin* oracle = registry.find(g.oracle);
  const bool own_golden = c.files && !c.files->golden.empty();
  if (!oracle && !own_golden) {
    g.cause = "the oracle " + g.oracle + " that computes the golden is not loaded";
    g.plugin_error = true;
    return g;
  }
  // The oracle's own math on contiguous inputs: the layout is the tested sides' business.
  CaseSpec at = c;
  at.layout = InputLayout::contiguous;
  at.files.reset();
  auto run = [&](DType dtype, TensorSet& into, const std::string& role) {
    at.dtype = dtype;
    SideResult s = run_side(at, inputs_in_dtype(in, dtype), *oracle, exec);
    if (s.status != SideStatus::ok) {
      g.cause += (g.cause.empty() ? "" : "; ") + role + ": " + s.cause;
      g.plugin_error = g.plugin_error || is_plugin_error(s.status);
    } else {
      into = std::move(s.tensors);
    }
    s.tensors.clear();
    g.runs.push_back(std::move(s));
  };
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
  run(DType::float64, g.golden, "the golden (" + g.golden_label + ")");
  run(c.dtype, g.baseline, "the baseline (" + g.baseline_label + ")");
  return g;
}

void judge_sides(std::vector<TensorComparison>& cmps, const CaseSpec& c, const GoldenRun& g, const TensorSet& lhs,
                 const TensorSet& rhs, const std::string& lhs_label, const std::string& rhs_label) {
  for (auto& cmp : cmps) {
    const Tensor* golden = find_tensor(g.golden, cmp.name);
    const Tensor* baseline = find_tensor(g.baseline, cmp.name);
    judge_by_baseline(cmp, {{lhs_label, find_tensor(lhs, cmp.name)}, {rhs_label, find_tensor(rhs, cmp.name)}},
                      golden ? *golden : Tensor(), baseline ? *baseline : Tensor(), c.baseline_k.k_for(cmp.name),
                      c.dtype, c.level);
  }
}

}  // namespace headgrad::runner
