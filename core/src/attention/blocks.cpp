#include <stdexcept>

#include "headgrad/attention.hpp"
#include "headgrad/kernels.hpp"

namespace headgrad {

Tensor attention_mask(const AttentionSpec& spec, std::int64_t tq, std::int64_t tk) {
  const bool has_mask = spec.mask.defined();
  if (has_mask && spec.mask.dtype() != DType::boolean)
    throw std::invalid_argument("attention mask must be bool (True = attend), got " +
                                std::string(dtype_name(spec.mask.dtype())));
  if (!spec.causal) return has_mask ? spec.mask : Tensor();
  Tensor causal = causal_mask(tq, tk);
  return has_mask ? logical_and(spec.mask, causal) : causal;
}

Variable split_heads(const Variable& x, std::int64_t heads) {
  if (x.dim() != 3 || heads < 1 || x.size(2) % heads != 0)
    throw std::invalid_argument("split_heads: input " + shape_str(x.shape()) +
                                " is not [B, T, D] with D divisible by " + std::to_string(heads) +
                                " heads");
  const std::int64_t b = x.size(0), t = x.size(1), d = x.size(2) / heads;
  return transpose(reshape(x, {b, t, heads, d}), 1, 2);  // [B, H, T, d]
}

Variable merge_heads(const Variable& x) {
  if (x.dim() != 4)
    throw std::invalid_argument("merge_heads: input " + shape_str(x.shape()) +
                                " is not [B, H, T, d]");
  const std::int64_t b = x.size(0), h = x.size(1), t = x.size(2), d = x.size(3);
  return reshape(transpose(x, 1, 2), {b, t, h * d});  // [B, T, H, d] first, then [B, T, D]
}

Variable batched_mha(const Variable& x, const MhaWeights& w, const AttentionSpec& spec,
                     const AttentionCore& core) {
  const std::int64_t t = x.size(-2), dm = x.size(-1);
  const std::int64_t h = spec.num_heads, hkv = spec.kv_heads();
  const Variable x3 = reshape(x, {-1, t, dm});          // [B, T, D]
  const Variable q = split_heads(linear(x3, w.wq), h);  // [B, H, T, d]
  Variable k = split_heads(linear(x3, w.wk), hkv);      // [B, Hkv, T, d]
  Variable v = split_heads(linear(x3, w.wv), hkv);
  if (hkv != h) {  // grouped KV heads: query head i reads key/value head i / (H / Hkv)
    k = repeat_interleave(k, h / hkv, 1);
    v = repeat_interleave(v, h / hkv, 1);
  }
  const Variable o = merge_heads(core(q, k, v, spec));  // [B, T, D]
  return reshape(linear(o, w.wo), x.shape());
}

Variable attention_core(const Variable& q, const Variable& k, const Variable& v,
                        const AttentionSpec& spec) {
  if (q.dim() < 2 || k.dim() != q.dim() || v.dim() != q.dim() || q.size(-1) != k.size(-1) ||
      k.size(-2) != v.size(-2))
    throw std::invalid_argument("attention_core: q " + shape_str(q.shape()) + ", k " +
                                shape_str(k.shape()) + ", v " + shape_str(v.shape()) +
                                " are not [..., Tq, d], [..., Tk, d], [..., Tk, dv]");
  const std::int64_t tq = q.size(-2), tk = k.size(-2);
  // softmax(masked_fill(scale(q k^T), !attend, -inf)) as one fused op: the same
  // values in one pass over [..., Tq, Tk]; causal is taken from the indices.
  AttentionSpec mask_only = spec;
  mask_only.causal = false;
  const Tensor attend = attention_mask(mask_only, tq, tk);
  const Variable p = masked_softmax(matmul(q, transpose(k, -2, -1)),
                                    spec.scale_for(q.size(-1)), attend, spec.causal);
  return matmul(p, v);  // [..., Tq, dv]
}

}  // namespace headgrad
