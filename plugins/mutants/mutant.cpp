// !! DELIBERATELY WRONG !! A batched attention with exactly one known bug,
// chosen at compile time (HEADGRAD_MUTANT="<bug name>"). Each bug is written the way
// people really write it; the line that differs from plugins/batched is marked
// BUG. These plugins exist so that configs/mutants.yaml can prove each bug
// class is caught and named. Never use them as a reference.
//
// Shape legend: B batch, T sequence, D model width, H (query) heads, Hkv kv
// heads, G = H / Hkv, d head width.
#include <headgrad/plugin.hpp>

#include <cmath>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace headgrad;

// The bug's catalog name (tools/analysis/bug_names.def), e.g. "kv_swapped".
constexpr std::string_view kBug = HEADGRAD_MUTANT;

// The mask this mutant applies: [Tq, Tk] bool, True = attend, or undefined.
Tensor mutant_mask(const AttentionSpec& spec, std::int64_t tq, std::int64_t tk) {
  AttentionSpec s = spec;
  if (kBug == "missing_causal_mask") s.causal = false;  // BUG: the causal flag is ignored
  if (kBug == "causal_alignment")  // BUG: FlashAttention's convention whatever is asked
    s.causal_alignment = CausalAlignment::bottom_right;
  const bool wrong_causal =
      kBug == "causal_mask_excludes_diagonal" || kBug == "causal_mask_inverted";
  if (!s.causal || !wrong_causal) return attention_mask(s, tq, tk);
  Tensor m = Tensor::empty({tq, tk}, DType::boolean);
  for (std::int64_t i = 0; i < tq; ++i)
    for (std::int64_t j = 0; j < tk; ++j)
      m.set({i, j}, kBug == "causal_mask_excludes_diagonal" ? j < i    // BUG: j < i
                                                                : j >= i);  // BUG: inverted
  return m;
}

Variable project(const Variable& x, const Variable& w) {
  if (kBug == "weights_not_transposed") return matmul(x, w);  // BUG: x W, not x W^T
  return linear(x, w);
}

// [B, T, D] -> [B, H, T, d]
Variable split(const Variable& x, std::int64_t h) {
  const std::int64_t b = x.size(0), t = x.size(1), d = x.size(2) / h;
  if (kBug == "split_without_transpose") return reshape(x, {b, h, t, d});  // BUG
  if (kBug == "interleaved_head_slices")  // BUG: head i takes features i, i+H, i+2H, ...
    return permute(reshape(x, {b, t, d, h}), {0, 3, 1, 2});
  return split_heads(x, h);
}

// k or v [B, T, Hkv*d] -> [B, Hkv, T, d]
Variable split_kv(const Variable& x, std::int64_t hkv) {
  if (kBug == "kv_interleaved_head_slices") {  // BUG: kv head j takes features j, j+Hkv, ...
    const std::int64_t b = x.size(0), t = x.size(1), d = x.size(2) / hkv;
    return permute(reshape(x, {b, t, d, hkv}), {0, 3, 1, 2});
  }
  return split(x, hkv);
}

// k or v [B, Hkv, T, d] -> [B, H, T, d]: query head h reads kv head h / G.
Variable widen_kv(const Variable& kv, std::int64_t h) {
  const std::int64_t hkv = kv.size(1), g = h / hkv;
  if (g == 1) return kv;
  if (kBug == "kv_map_tile" || kBug == "kv_group_wrong_divisor") {
    std::vector<Variable> heads;
    for (std::int64_t i = 0; i < h; ++i) {
      const std::int64_t j = kBug == "kv_map_tile" ? i % hkv  // BUG: tiled, as repeat() lays them out
                                                   : i / hkv;  // BUG: divides by Hkv, not by G
      if (j >= hkv)
        throw std::invalid_argument("mutant_kv_group_wrong_divisor: query head " + std::to_string(i) +
                                    " reads kv head " + std::to_string(j) + " of " + std::to_string(hkv));
      heads.push_back(narrow(kv, 1, j, 1));
    }
    return cat(heads, 1);
  }
  const Variable wide = repeat_interleave(kv, g, 1);
  const Variable constant(wide.data());  // the same values, no path back to kv
  if (kBug == "kv_grad_not_accumulated") {
    // BUG: a hand-written backward keeps the gradient of the group's first member only
    std::vector<Variable> heads;
    for (std::int64_t i = 0; i < h; ++i) heads.push_back(narrow(i % g == 0 ? wide : constant, 1, i, 1));
    return cat(heads, 1);
  }
  if (kBug == "kv_grad_averaged")  // BUG: a hand-written backward means over the group instead of summing
    return add(scale(wide, 1.0 / static_cast<double>(g)), scale(constant, 1.0 - 1.0 / static_cast<double>(g)));
  return wide;
}

// [B, H, T, d] -> [B, T, D]
Variable merge(const Variable& o) {
  const std::int64_t b = o.size(0), h = o.size(1), t = o.size(2), d = o.size(3);
  if (kBug == "merge_without_transpose") return reshape(o, {b, t, h * d});  // BUG
  if (kBug == "interleaved_head_slices")  // BUG (the same layout on the way back)
    return reshape(permute(o, {0, 2, 3, 1}), {b, t, d * h});
  return merge_heads(o);
}

// a [..., M, K] @ b [..., K, N] as a loop over K whose running sum is stored in
// the operands' dtype after every term: exact enough in float64 and float32,
// a 16-bit accumulator in bfloat16 / float16.
Variable matmul_accumulating(const Variable& a, const Variable& b) {
  if (kBug != "fp16_accumulator") return matmul(a, b);
  Variable acc = mul(narrow(a, -1, 0, 1), narrow(b, -2, 0, 1));
  for (std::int64_t i = 1; i < a.size(-1); ++i)
    acc = add(acc, mul(narrow(a, -1, i, 1), narrow(b, -2, i, 1)));  // BUG: rounded to 16 bits each step
  return acc;
}

Variable core(const Variable& q, const Variable& k_in, const Variable& v_in,
              const AttentionSpec& spec, std::int64_t d_model) {
  const Variable& k = kBug == "kv_swapped" ? v_in : k_in;  // BUG: keys and values swapped
  const Variable& v = kBug == "kv_swapped" ? k_in : v_in;
  const std::int64_t d = q.size(-1);
  double factor = spec.scale_for(d);
  if (kBug == "scale_one_over_d") factor = 1.0 / static_cast<double>(d);  // BUG
  if (kBug == "scale_model_dim")
    factor = 1.0 / std::sqrt(static_cast<double>(d_model > 0 ? d_model : d));  // BUG
  if (kBug == "no_scale") factor = 1.0;                                   // BUG
  Variable s = scale(matmul_accumulating(q, transpose(k, -2, -1)), factor);
  const Tensor attend = mutant_mask(spec, q.size(-2), k.size(-2));
  if (attend.defined())  // BUG when mask_fill_finite: a "large negative" instead of -inf
    s = masked_fill(s, logical_not(attend), kBug == "mask_fill_finite" ? -1e4 : -INFINITY);
  const std::int64_t dim = kBug == "softmax_over_queries" ? -2 : -1;  // BUG: over queries
  Variable p = softmax(s, dim);
  if (kBug == "softmax_no_max_subtraction") {  // BUG: exp without the row max subtracted first
    const Variable e = exp(s);
    p = div(e, sum(e, dim, true));
  }
  if (kBug == "batch_mixing" && p.dim() >= 4 && p.size(0) > 1) {
    // BUG: the batch rolled by one on the way out, as a wrong gather would do
    const std::int64_t n = p.size(0);
    p = cat({narrow(p, 0, 1, n - 1), narrow(p, 0, 0, 1)}, 0);
  }
  return matmul_accumulating(p, v);
}

class Mutant final : public Attention {
 public:
  PluginInfo info() const override {
    PluginInfo i;
    i.name = "mutant_" + std::string(kBug);
    i.version = "1.0.0";
    i.description = "DELIBERATELY WRONG: batched attention with the bug " + std::string(kBug);
    i.mutant = true;
    auto& c = i.capabilities;
    c.mha = c.core = c.causal = c.bool_mask = c.cross_lengths = true;
    c.grouped_kv = true;
    c.extra = {"bfloat16", "float16"};  // the engine's ops: float32 math, 16-bit results
    return i;
  }

  Variable mha_forward(const Variable& x, const MhaWeights& w,
                       const AttentionSpec& spec) const override {
    const std::int64_t t = x.size(-2), dm = x.size(-1), h = spec.num_heads, hkv = spec.kv_heads();
    const Variable x3 = reshape(x, {-1, t, dm});
    const Variable q = split(project(x3, w.wq), h);
    const Variable k = widen_kv(split_kv(project(x3, w.wk), hkv), h);
    const Variable v = widen_kv(split_kv(project(x3, w.wv), hkv), h);
    const Variable o = merge(core(q, k, v, spec, dm));
    if (kBug == "missing_output_projection") return reshape(o, x.shape());  // BUG: no wo
    return reshape(project(o, w.wo), x.shape());
  }

  Variable core_forward(const Variable& q, const Variable& k, const Variable& v,
                        const AttentionSpec& spec) const override {
    if (q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.size(1) < q.size(1))  // k, v with Hkv heads
      return core(q, widen_kv(k, q.size(1)), widen_kv(v, q.size(1)), spec, spec.d_model);
    return core(q, k, v, spec, spec.d_model);
  }
};

}  // namespace

HEADGRAD_PLUGIN(Mutant)
