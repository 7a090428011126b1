#include "analysis/hypotheses.hpp"

#include <cmath>
#include <stdexcept>

namespace headgrad::diagnosis {

namespace {

bool is(std::optional<Bug> bug, Bug b) { return bug && *bug == b; }

// The causal/explicit mask as the hypothesis applies it: [Tq, Tk] or [.., Tq, Tk].
Tensor hypothesis_mask(const AttentionSpec& spec, std::int64_t tq, std::int64_t tk,
                       std::optional<Bug> bug) {
  AttentionSpec s = spec;
  if (is(bug, Bug::missing_causal_mask)) s.causal = false;
  if (is(bug, Bug::causal_alignment)) s.causal_alignment = CausalAlignment::bottom_right;
  const bool wrong = is(bug, Bug::causal_mask_excludes_diagonal) || is(bug, Bug::causal_mask_inverted);
  if (!s.causal || !wrong) return attention_mask(s, tq, tk);
  s.causal = false;
  Tensor m = Tensor::empty({tq, tk}, DType::boolean);
  for (std::int64_t i = 0; i < tq; ++i)
    for (std::int64_t j = 0; j < tk; ++j)
      m.set({i, j}, is(bug, Bug::causal_mask_excludes_diagonal) ? j < i : j >= i);
  const Tensor extra = attention_mask(s, tq, tk);
  return extra.defined() ? logical_and(extra, m) : m;
}

double hypothesis_scale(const AttentionSpec& spec, std::int64_t d, std::optional<Bug> bug) {
  if (is(bug, Bug::scale_one_over_d)) return 1.0 / static_cast<double>(d);
  if (is(bug, Bug::scale_model_dim))
    return 1.0 / std::sqrt(static_cast<double>(spec.d_model > 0 ? spec.d_model : d));
  if (is(bug, Bug::no_scale)) return 1.0;
  return spec.scale_for(d);
}

// Rolls dim 0 by one: item b takes item b+1's values.
Variable roll_batch(const Variable& p) {
  const std::int64_t n = p.size(0);
  if (n < 2) return p;
  return cat({narrow(p, 0, 1, n - 1), narrow(p, 0, 0, 1)}, 0);
}

// a [..., M, K] @ b [..., K, N] one term of K at a time, the running sum stored
// in the operands' dtype after each add: a 16-bit accumulator in 16 bits (in
// float32 and float64 the same sum as a matmul, to their rounding).
Variable matmul_narrow_accumulator(const Variable& a, const Variable& b) {
  Variable acc = mul(narrow(a, -1, 0, 1), narrow(b, -2, 0, 1));
  for (std::int64_t i = 1; i < a.size(-1); ++i) acc = add(acc, mul(narrow(a, -1, i, 1), narrow(b, -2, i, 1)));
  return acc;
}

// One head: q [N, Tq, d], k [N, Tk, d], v [N, Tk, dv]; mask broadcast to [N, Tq, Tk].
Variable attend(const Variable& q, const Variable& k_in, const Variable& v_in, const Tensor& mask,
                double factor, std::optional<Bug> bug) {
  const bool swapped = is(bug, Bug::kv_swapped);
  const Variable& k = swapped ? v_in : k_in;
  const Variable& v = swapped ? k_in : v_in;
  const bool narrow_acc = is(bug, Bug::fp16_accumulator);
  const Variable kt = transpose(k, -2, -1);
  Variable s = scale(narrow_acc ? matmul_narrow_accumulator(q, kt) : matmul(q, kt), factor);
  const double fill = is(bug, Bug::mask_fill_finite) ? -1e4 : -INFINITY;
  if (mask.defined()) s = masked_fill(s, logical_not(mask), fill);
  Variable p;
  if (is(bug, Bug::softmax_no_max_subtraction)) {  // exp(s) / sum(exp(s)) over the keys
    const Variable e = exp(s);
    p = div(e, sum(e, -1, true));
  } else {
    p = softmax(s, is(bug, Bug::softmax_over_queries) ? -2 : -1);
  }
  if (is(bug, Bug::batch_mixing)) p = roll_batch(p);
  return narrow_acc ? matmul_narrow_accumulator(p, v) : matmul(p, v);
}

Variable project(const Variable& x, const Variable& w, std::optional<Bug> bug) {
  return is(bug, Bug::weights_not_transposed) ? matmul(x, w) : linear(x, w);
}

// Head h's slice of a projection P [B, T, D], as the hypothesis lays heads out.
Variable head_slice(const Variable& p, std::int64_t h, std::int64_t heads, std::optional<Bug> bug) {
  const std::int64_t b = p.size(0), t = p.size(1), dm = p.size(2), d = dm / heads;
  if (is(bug, Bug::split_without_transpose))  // the flat buffer cut as [B, H, T, d]
    return reshape(narrow(reshape(p, {b, heads, t, d}), 1, h, 1), {b, t, d});
  if (is(bug, Bug::interleaved_head_slices))  // features h, h+H, ...
    return reshape(narrow(reshape(p, {b, t, d, heads}), 3, h, 1), {b, t, d});
  return narrow(p, 2, h * d, d);
}

// Heads' outputs o_h [B, T, d] back to [B, T, D], as the hypothesis merges them.
Variable merge(const std::vector<Variable>& heads, std::optional<Bug> bug) {
  const std::int64_t b = heads[0].size(0), t = heads[0].size(1), d = heads[0].size(2);
  const std::int64_t dm = d * static_cast<std::int64_t>(heads.size());
  if (is(bug, Bug::merge_without_transpose)) return reshape(stack(heads, 1), {b, t, dm});
  if (is(bug, Bug::interleaved_head_slices)) return reshape(stack(heads, 3), {b, t, dm});
  return cat(heads, 2);
}

// The kv head query head h reads, as the hypothesis maps them (G = H / Hkv).
std::int64_t kv_head_of(std::int64_t h, std::int64_t heads, std::int64_t kv_heads, std::optional<Bug> bug) {
  const std::int64_t group = heads / kv_heads;
  // G = 1: no grouping, so no mapping to get wrong (a kernel takes its grouped
  // path only when G > 1, as the catalog's needs_group says).
  if (group == 1) return h;
  if (is(bug, Bug::kv_map_tile)) return h % kv_heads;
  if (is(bug, Bug::kv_group_wrong_divisor)) return h / kv_heads;  // may run past the kv heads
  return h / group;
}

// The kv head j's slice of K or V as query head h (member g of its group) sees
// it: same values, but the gradient bugs change what reaches kv head j.
Variable kv_for_query_head(const Variable& kv, std::int64_t g, std::int64_t group, std::optional<Bug> bug) {
  if (group == 1) return kv;
  const Variable constant(kv.data());  // the values without a path back to Wk, Wv
  if (is(bug, Bug::kv_grad_not_accumulated)) return g == 0 ? kv : constant;  // only member 0 counts
  if (is(bug, Bug::kv_grad_averaged))  // the value kv, the gradient kv / G from each of G members
    return add(scale(kv, 1.0 / static_cast<double>(group)),
               scale(constant, 1.0 - 1.0 / static_cast<double>(group)));
  return kv;
}

}  // namespace

Variable hypothesis_mha(const Variable& x, const MhaWeights& w, const AttentionSpec& spec,
                        std::optional<Bug> bug) {
  const std::int64_t t = x.size(-2), dm = x.size(-1), heads = spec.num_heads;
  const std::int64_t kv_heads = spec.kv_heads(), group = heads / kv_heads;
  const std::int64_t d = spec.head_dim();
  // kv heads laid out like the query heads, unless the bug interleaves only them
  const std::optional<Bug> kv_layout = is(bug, Bug::kv_interleaved_head_slices) ? Bug::interleaved_head_slices : bug;
  const Variable x3 = reshape(x, {-1, t, dm});
  const Variable q = project(x3, w.wq, bug), k = project(x3, w.wk, bug), v = project(x3, w.wv, bug);
  const Tensor mask = hypothesis_mask(spec, t, t, bug);
  const double factor = hypothesis_scale(spec, d, bug);
  std::vector<Variable> outs;
  for (std::int64_t h = 0; h < heads; ++h) {
    Tensor m = mask;
    if (m.defined() && m.dim() >= 4)  // a [B, H, T, T] mask: this head's slice
      m = m.narrow(-3, m.size(-3) == 1 ? 0 : h, 1).squeeze(m.dim() - 3);
    const std::int64_t j = kv_head_of(h, heads, kv_heads, bug);
    if (j >= kv_heads)
      throw std::invalid_argument("hypothesis " + std::string(bug_info(*bug).name) + ": query head " +
                                  std::to_string(h) + " would read kv head " + std::to_string(j) + " of " +
                                  std::to_string(kv_heads));
    const Variable kh = kv_for_query_head(head_slice(k, j, kv_heads, kv_layout), h % group, group, bug);
    const Variable vh = kv_for_query_head(head_slice(v, j, kv_heads, kv_layout), h % group, group, bug);
    outs.push_back(attend(head_slice(q, h, heads, bug), kh, vh, m, factor, bug));
  }
  const Variable merged = merge(outs, bug);
  if (is(bug, Bug::missing_output_projection)) return reshape(merged, x.shape());
  return reshape(project(merged, w.wo, bug), x.shape());
}

Variable hypothesis_core(const Variable& q, const Variable& k, const Variable& v,
                         const AttentionSpec& spec, std::optional<Bug> bug) {
  if (bug && bug_info(*bug).visibility.mha_only)
    throw std::invalid_argument(std::string("bug '") + std::string(bug_info(*bug).name) +
                                "' has no core-level form");
  const std::int64_t tq = q.size(-2), tk = k.size(-2);
  const Tensor mask = hypothesis_mask(spec, tq, tk, bug);
  // k, v with Hkv heads where q has H: query head h reads kv head h / G
  const std::int64_t group = kv_group(q, k, v, "hypothesis");
  return attend(q, expand_kv_heads(k, group), expand_kv_heads(v, group), mask,
                hypothesis_scale(spec, q.size(-1), bug), bug);
}

}  // namespace headgrad::diagnosis
