// Attention settings and building blocks shared by plugins, the runner and
// the reference implementations: the spec, the weights, the mask rule, and
// split/merge of heads done the one right way.
//
// Shape legend: B batch, T sequence, Tq/Tk query/key lengths, D model width,
// H heads, d = D / H head width.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>

#include "headgrad/ops.hpp"

namespace headgrad {

struct RopeSpec {
  bool enabled = false;
  double theta = 10000.0;
};

struct AttentionSpec {
  std::int64_t d_model = 0;       // D (mha level)
  std::int64_t num_heads = 1;     // H
  std::int64_t num_kv_heads = 0;  // Hkv; 0 means H (plain multi-head)
  bool causal = false;            // query i attends keys j <= i, aligned top-left
  std::optional<double> scale;    // default 1/sqrt(d)
  double dropout_p = 0.0;         // on the attention weights; 0 in every comparison
  std::uint64_t dropout_seed = 0;
  // Optional bool mask broadcastable to [..., Tq, Tk]: True = attend.
  // Combined with `causal` when both are set (a key is attended when both allow it).
  Tensor mask;
  RopeSpec rope;

  std::int64_t head_dim() const { return d_model / num_heads; }
  std::int64_t kv_heads() const { return num_kv_heads > 0 ? num_kv_heads : num_heads; }
  double scale_for(std::int64_t d) const {
    return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(d));
  }
};

// The four projections, PyTorch's layout: W is [out, in] and y = x W^T.
// Head h owns rows [h*d, (h+1)*d) of wq, wk, wv and columns [h*d, (h+1)*d) of wo.
struct MhaWeights {
  Variable wq;  // [D, D]
  Variable wk;  // [Hkv*d, D]
  Variable wv;  // [Hkv*d, D]
  Variable wo;  // [D, D]
};

// The bool mask [..., Tq, Tk] (True = attend) that a spec asks for: causal,
// spec.mask, both combined, or an undefined Tensor when every key is attended.
Tensor attention_mask(const AttentionSpec& spec, std::int64_t tq, std::int64_t tk);

// [B, T, D] -> view [B, T, H, d] -> transpose -> [B, H, T, d] (a strided view).
Variable split_heads(const Variable& x, std::int64_t heads);
// [B, H, T, d] -> transpose -> [B, T, H, d] -> reshape (copies) -> [B, T, D].
// !! The transpose comes first: reshaping [B, H, T, d] straight to [B, T, D]
// keeps every size and silently mixes tokens with heads. !!
Variable merge_heads(const Variable& x);

// An attention core: q [B, H, Tq, d], k [B, H, Tk, d], v [B, H, Tk, dv] -> [B, H, Tq, dv].
using AttentionCore = std::function<Variable(const Variable& q, const Variable& k, const Variable& v,
                                             const AttentionSpec& spec)>;

// The batched multi-head layer around any core: x [..., T, D] -> project ->
// split_heads -> (grouped KV heads widened to H) -> core -> merge_heads ->
// project -> [..., T, D]. Leading dims are folded into one batch.
Variable batched_mha(const Variable& x, const MhaWeights& w, const AttentionSpec& spec,
                     const AttentionCore& core);

// Scaled dot-product attention composed from ops (its backward comes from
// autodiff): softmax(q k^T * scale, masked) v over the last two dims.
// q [..., Tq, d], k [..., Tk, d], v [..., Tk, dv] -> [..., Tq, dv].
// A query row whose keys are all masked gives zeros (softmax's rule), not NaN.
Variable attention_core(const Variable& q, const Variable& k, const Variable& v,
                        const AttentionSpec& spec);

}  // namespace headgrad
