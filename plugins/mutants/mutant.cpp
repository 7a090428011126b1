// !! DELIBERATELY WRONG !! A batched attention with exactly one known bug,
// chosen at compile time (HEADGRAD_MUTANT="<bug name>"). Each bug is written the way
// people really write it; the line that differs from plugins/batched is marked
// BUG. These plugins exist so that configs/mutants.yaml can prove each bug
// class is caught and named. Never use them as a reference.
//
// Shape legend: B batch, T sequence, D model width, H heads, d = D / H.
#include <headgrad/plugin.hpp>

#include <cmath>
#include <string_view>

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

// [B, H, T, d] -> [B, T, D]
Variable merge(const Variable& o) {
  const std::int64_t b = o.size(0), h = o.size(1), t = o.size(2), d = o.size(3);
  if (kBug == "merge_without_transpose") return reshape(o, {b, t, h * d});  // BUG
  if (kBug == "interleaved_head_slices")  // BUG (the same layout on the way back)
    return reshape(permute(o, {0, 2, 3, 1}), {b, t, d * h});
  return merge_heads(o);
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
  Variable s = scale(matmul(q, transpose(k, -2, -1)), factor);
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
  return matmul(p, v);
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
    return i;
  }

  Variable mha_forward(const Variable& x, const MhaWeights& w,
                       const AttentionSpec& spec) const override {
    const std::int64_t t = x.size(-2), dm = x.size(-1), h = spec.num_heads;
    const Variable x3 = reshape(x, {-1, t, dm});
    const Variable q = split(project(x3, w.wq), h);
    const Variable k = split(project(x3, w.wk), h);
    const Variable v = split(project(x3, w.wv), h);
    const Variable o = merge(core(q, k, v, spec, dm));
    if (kBug == "missing_output_projection") return reshape(o, x.shape());  // BUG: no wo
    return reshape(project(o, w.wo), x.shape());
  }

  Variable core_forward(const Variable& q, const Variable& k, const Variable& v,
                        const AttentionSpec& spec) const override {
    return core(q, k, v, spec, spec.d_model);
  }
};

}  // namespace

HEADGRAD_PLUGIN(Mutant)
