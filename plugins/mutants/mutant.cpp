// !! DELIBERATELY WRONG !! A batched attention with exactly one known bug,
// chosen at compile time (HEADGRAD_MUTANT=<BUG>). Each bug is written the way
// people really write it; the line that differs from plugins/batched is marked
// BUG. These plugins exist so that configs/mutants.yaml can prove each bug
// class is caught and named. Never use them as a reference.
//
// Shape legend: B batch, T sequence, D model width, H heads, d = D / H.
#include <headgrad/plugin.hpp>

#include <cmath>

namespace {

using namespace headgrad;

enum class Bug {
  SPLIT_WITHOUT_TRANSPOSE,
  MERGE_WITHOUT_TRANSPOSE,
  SCALE_ONE_OVER_D,
  SCALE_MODEL_DIM,
  NO_SCALE,
  SOFTMAX_OVER_QUERIES,
  MISSING_CAUSAL_MASK,
  CAUSAL_MASK_EXCLUDES_DIAGONAL,
  CAUSAL_MASK_INVERTED,
  MISSING_OUTPUT_PROJECTION,
  WEIGHTS_NOT_TRANSPOSED,
  INTERLEAVED_HEAD_SLICES,
  KV_SWAPPED,
  BATCH_MIXING,
  CAUSAL_ALIGNMENT,
};
constexpr Bug kBug = Bug::HEADGRAD_MUTANT;

#define HEADGRAD_STR2(x) #x
#define HEADGRAD_STR(x) HEADGRAD_STR2(x)

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The mask this mutant applies: [Tq, Tk] bool, True = attend, or undefined.
Tensor mutant_mask(const AttentionSpec& spec, std::int64_t tq, std::int64_t tk) {
  AttentionSpec s = spec;
  if (kBug == Bug::MISSING_CAUSAL_MASK) s.causal = false;  // BUG: the causal flag is ignored
  if (kBug == Bug::CAUSAL_ALIGNMENT)  // BUG: FlashAttention's convention whatever is asked
    s.causal_alignment = CausalAlignment::bottom_right;
  const bool wrong_causal =
      kBug == Bug::CAUSAL_MASK_EXCLUDES_DIAGONAL || kBug == Bug::CAUSAL_MASK_INVERTED;
  if (!s.causal || !wrong_causal) return attention_mask(s, tq, tk);
  Tensor m = Tensor::empty({tq, tk}, DType::boolean);
  for (std::int64_t i = 0; i < tq; ++i)
    for (std::int64_t j = 0; j < tk; ++j)
      m.set({i, j}, kBug == Bug::CAUSAL_MASK_EXCLUDES_DIAGONAL ? j < i    // BUG: j < i
                                                                : j >= i);  // BUG: inverted
  return m;
}

Variable project(const Variable& x, const Variable& w) {
  if (kBug == Bug::WEIGHTS_NOT_TRANSPOSED) return matmul(x, w);  // BUG: x W, not x W^T
  return linear(x, w);
}

// [B, T, D] -> [B, H, T, d]
Variable split(const Variable& x, std::int64_t h) {
  const std::int64_t b = x.size(0), t = x.size(1), d = x.size(2) / h;
  if (kBug == Bug::SPLIT_WITHOUT_TRANSPOSE) return reshape(x, {b, h, t, d});  // BUG
  if (kBug == Bug::INTERLEAVED_HEAD_SLICES)  // BUG: head i takes features i, i+H, i+2H, ...
    return permute(reshape(x, {b, t, d, h}), {0, 3, 1, 2});
  return split_heads(x, h);
}

// [B, H, T, d] -> [B, T, D]
Variable merge(const Variable& o) {
  const std::int64_t b = o.size(0), h = o.size(1), t = o.size(2), d = o.size(3);
  if (kBug == Bug::MERGE_WITHOUT_TRANSPOSE) return reshape(o, {b, t, h * d});  // BUG
  if (kBug == Bug::INTERLEAVED_HEAD_SLICES)  // BUG (the same layout on the way back)
    return reshape(permute(o, {0, 2, 3, 1}), {b, t, d * h});
  return merge_heads(o);
}

Variable core(const Variable& q, const Variable& k_in, const Variable& v_in,
              const AttentionSpec& spec, std::int64_t d_model) {
  const Variable& k = kBug == Bug::KV_SWAPPED ? v_in : k_in;  // BUG: keys and values swapped
  const Variable& v = kBug == Bug::KV_SWAPPED ? k_in : v_in;
  const std::int64_t d = q.size(-1);
  double factor = spec.scale_for(d);
  if (kBug == Bug::SCALE_ONE_OVER_D) factor = 1.0 / static_cast<double>(d);  // BUG
  if (kBug == Bug::SCALE_MODEL_DIM)
    factor = 1.0 / std::sqrt(static_cast<double>(d_model > 0 ? d_model : d));  // BUG
  if (kBug == Bug::NO_SCALE) factor = 1.0;                                   // BUG
  Variable s = scale(matmul(q, transpose(k, -2, -1)), factor);
  const Tensor attend = mutant_mask(spec, q.size(-2), k.size(-2));
  if (attend.defined()) s = masked_fill(s, logical_not(attend), -INFINITY);
  const std::int64_t dim = kBug == Bug::SOFTMAX_OVER_QUERIES ? -2 : -1;  // BUG: over queries
  Variable p = softmax(s, dim);
  if (kBug == Bug::BATCH_MIXING && p.dim() >= 4 && p.size(0) > 1) {
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
    i.name = "mutant_" + lower(HEADGRAD_STR(HEADGRAD_MUTANT));
    i.version = "1.0.0";
    i.description = "DELIBERATELY WRONG: batched attention with the bug " +
                    lower(HEADGRAD_STR(HEADGRAD_MUTANT));
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
    if (kBug == Bug::MISSING_OUTPUT_PROJECTION) return reshape(o, x.shape());  // BUG: no wo
    return reshape(project(o, w.wo), x.shape());
  }

  Variable core_forward(const Variable& q, const Variable& k, const Variable& v,
                        const AttentionSpec& spec) const override {
    return core(q, k, v, spec, spec.d_model);
  }
};

}  // namespace

HEADGRAD_PLUGIN(Mutant)
