#include "analysis/evaluate.hpp"

#include <cmath>

#include "exec/execute.hpp"

namespace headgrad::analysis {

using namespace runner;

TensorSet hypothesis_tensors(const CaseSpec& c, const CaseInputs& in, const diagnosis::BugSet& bugs) {
  AttentionSpec spec = attention_spec(c, in);
  if (!c.taps.empty()) spec.rope_taps = std::make_shared<RopeTaps>();  // q_rot, k_rot as the hypothesis rotates
  if (spec.sinks.defined()) spec.sinks = Variable(spec.sinks.data(), true);  // a leaf: dsinks
  TensorSet out;
  if (c.level == Level::rope) {
    Variable x(in.x, true);
    Variable y = diagnosis::hypothesis_rope(x, spec.rope, bugs);
    sum(mul(y, Variable(in.r))).backward();
    return {{"out", y.data()}, {"dx", x.grad()}};
  }
  if (c.level == Level::mha) {
    Variable x(in.x, true);
    const MhaWeights w = leaf_weights(in);  // with the biases when the case has them
    make_x_kv_leaf(spec, in);
    Variable y = diagnosis::hypothesis_mha(x, w, spec, bugs);
    sum(mul(y, Variable(in.r))).backward();
    out = {{"out", y.data()},    {"dx", x.grad()},    {"dwq", w.wq.grad()},
           {"dwk", w.wk.grad()}, {"dwv", w.wv.grad()}, {"dwo", w.wo.grad()}};
    if (w.has_bias())
      out.insert(out.end(), {{"dbq", w.bq.grad()}, {"dbk", w.bk.grad()}, {"dbv", w.bv.grad()}, {"dbo", w.bo.grad()}});
    add_qk_norm_cross_grads(c, w, spec, out);
  } else {
    Variable q(in.q, true), k(in.k, true), v(in.v, true);
    Variable y = diagnosis::hypothesis_core(q, k, v, spec, bugs);
    sum(mul(y, Variable(in.r))).backward();
    out = {{"out", y.data()}, {"dq", q.grad()}, {"dk", k.grad()}, {"dv", v.grad()}};
  }
  if (c.sinks) out.push_back({"dsinks", spec.sinks.defined() ? spec.sinks.grad() : Tensor()});
  for (const auto& tap : c.taps)
    out.push_back({tap, assemble_tap(tap == "q_rot" ? spec.rope_taps->q_rot : spec.rope_taps->k_rot)});
  return out;
}

std::pair<double, double> fit_ratio(const TensorSet& side, const TensorSet& predicted, const CaseSpec& c) {
  double worst = 0, max_abs = 0;
  for (const auto& name : c.check) {
    const Tensor* a = find_tensor(side, name);
    const Tensor* b = find_tensor(predicted, name);
    const bool has_a = a && a->defined(), has_b = b && b->defined();
    if (!has_a && !has_b) continue;  // neither gives it: the same structure
    if (!has_a) return {INFINITY, INFINITY};  // the side gives no such tensor: structural
    // A prediction without the gradient (its graph never reaches the input)
    // is a zero gradient, which a side may return as zeros.
    const Tensor bv = has_b ? *b : Tensor::zeros(a->shape(), a->dtype());
    if (a->shape() != bv.shape()) return {INFINITY, INFINITY};
    const Tolerance tol = c.tolerance_for(name);
    const auto va = a->to_vector(), vb = bv.to_vector();
    for (std::size_t i = 0; i < va.size(); ++i) {
      // A NaN or inf the prediction has where the side has it too is reproduced.
      if (!std::isfinite(va[i]) || !std::isfinite(vb[i])) {
        if ((std::isnan(va[i]) && std::isnan(vb[i])) || va[i] == vb[i]) continue;
        return {INFINITY, INFINITY};
      }
      const double e = std::abs(va[i] - vb[i]);
      max_abs = std::max(max_abs, e);
      worst = std::max(worst, e / (tol.atol + tol.rtol * std::abs(vb[i])));
    }
  }
  return {worst, max_abs};
}

}  // namespace headgrad::analysis
