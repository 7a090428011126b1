// Attention settings and building blocks shared by plugins, the runner and
// the reference implementations: the spec, the weights, the mask rule, and
// split/merge of heads done the one right way.
//
// Shape legend: B batch, T sequence, Tq/Tk query/key lengths, D model width,
// H query heads, Hkv key/value heads, G = H / Hkv query heads per kv head,
// d head width (D / H unless given), r rotary width.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "headgrad/ops.hpp"

namespace headgrad {

// Rotary position embeddings on q and k, per head, after the split and
// before the scores; never on v. The two pairings are incompatible: the same
// weights give different attention under each.
enum class RopeStyle {
  interleaved,  // pair k = dims (2k, 2k+1): RoFormer, Meta Llama, GPT-J
  half,         // pair k = dims (k, k + r/2): GPT-NeoX, HF rotate_half
};
std::string_view rope_style_name(RopeStyle style);  // "interleaved" | "half"

struct RopeSpec {
  bool enabled = false;  // read by attention; the rope() op itself always rotates
  double theta = 10000.0;
  RopeStyle style = RopeStyle::interleaved;
  std::int64_t rotary_dim = 0;  // r: even, <= d, 0 means d; w_k = theta^(-2k/r)
  // Token positions p_t: [T] or [B, T], integer values (positions_tensor()),
  // any order or gaps. Undefined: p_t = offset + t. Not both.
  Tensor positions;
  std::int64_t offset = 0;
  // Added to the queries' positions only: queries at q_offset + p_t while
  // keys stay at p_t (decode-like, Tq < Tk at the core level).
  std::int64_t q_offset = 0;
};

// Where the causal diagonal sits when Tq != Tk (the same when Tq = Tk).
enum class CausalAlignment {
  top_left,      // query i attends keys j <= i: PyTorch's is_causal, `causal: true`
  bottom_right,  // j <= i + (Tk - Tq), the last query sees the last key: FlashAttention
                 // 2.1+, PyTorch's causal_lower_right; with Tq > Tk the first
                 // Tq - Tk queries attend nothing (zeros, zero gradients)
};
std::string_view causal_alignment_name(CausalAlignment alignment);  // "top_left" | "bottom_right"

// Where rope_queries/rope_keys report q and k after the rotation, before the
// scores (the runner's `taps: [q_rot, k_rot]`): each call appends a copy of
// its result, one [B, H, T, d] or, from a plugin that rotates one head at a
// time, one [B, T, d] per head in head order. A uniform shift of every
// position shows here and at the rope level only: scores see differences.
struct RopeTaps {
  std::vector<Tensor> q_rot;
  std::vector<Tensor> k_rot;
};

// A sliding window (`window: {left, right}` in a suite). With p_i = i + o,
// o = Tk - Tq under causal bottom_right and 0 otherwise, query i attends key j
// only when p_i - left <= j <= p_i + right (and causal and the mask allow it).
// An absent bound is unbounded. A Mistral-style window of W keys, the query
// included, is {left: W - 1, right: 0} with causal. It counts key indices:
// RoPE positions do not move it.
struct WindowSpec {
  std::optional<std::int64_t> left;
  std::optional<std::int64_t> right;
  bool enabled() const { return left.has_value() || right.has_value(); }
};

// QK-norm (MHA level): RMSNorm of q and k, y = x / sqrt(mean(x^2) + eps) * g,
// after the projections and before RoPE; the gains are MhaWeights::q_norm and
// k_norm.
enum class QkNormAxis {
  head,   // over d, per head; gains [d] shared by every head (Qwen3, Gemma 3)
  model,  // over a token's whole projection, H*d for q and Hkv*d for k, before
          // the head split; gains [H*d] and [Hkv*d] (OLMo 2)
};
enum class QkNormGain {
  w,           // g = w (Qwen3, OLMo 2)
  one_plus_w,  // g = 1 + w (Gemma 3's RMSNorm with a unit offset)
};
std::string_view qk_norm_axis_name(QkNormAxis axis);  // "head" | "model"
std::string_view qk_norm_gain_name(QkNormGain gain);  // "w" | "one_plus_w"
struct QkNormSpec {
  bool enabled = false;
  QkNormAxis axis = QkNormAxis::head;
  double eps = 1e-6;
  QkNormGain gain = QkNormGain::w;
};

struct AttentionSpec {
  std::int64_t d_model = 0;       // D (mha level)
  std::int64_t num_heads = 1;     // H
  std::int64_t num_kv_heads = 0;  // Hkv; 0 means H (plain multi-head)
  std::int64_t head_width = 0;    // d; 0 means D / H (HF's head_dim may differ)
  bool causal = false;            // query i attends keys j <= i + causal_shift(Tq, Tk)
  CausalAlignment causal_alignment = CausalAlignment::top_left;  // read only when causal
  std::optional<double> scale;    // default 1/sqrt(d)
  double dropout_p = 0.0;         // on the attention weights; 0 in every comparison
  std::uint64_t dropout_seed = 0;
  // Optional bool mask broadcastable to [..., Tq, Tk]: True = attend.
  // Combined with `causal` when both are set (a key is attended when both allow it).
  Tensor mask;
  RopeSpec rope;
  // Optional sink for the rotated q and k; shared by the copies a layer makes.
  std::shared_ptr<RopeTaps> rope_taps;
  WindowSpec window;
  // Logit soft-capping: C > 0 replaces each scaled score s by C tanh(s / C),
  // after the scale and before the masks and the sinks (Gemma 2); 0 is off.
  double softcap = 0.0;
  // Attention sinks: one learned logit per query head, [H], in each row's
  // softmax denominator, with no value vector, not scaled, not capped
  // (gpt-oss). A row with every key masked puts all its mass on the sink
  // (out 0). Undefined: none. The gradient dsinks flows through it.
  Variable sinks;
  QkNormSpec qk_norm;  // MHA level
  // Cross-attention (MHA level): k and v are projected from x_kv [B, Tk, D]
  // instead of x [B, Tq, D]; dx_kv flows through it. Undefined: self-attention.
  Variable x_kv;

  std::int64_t head_dim() const { return head_width > 0 ? head_width : d_model / num_heads; }
  std::int64_t kv_heads() const { return num_kv_heads > 0 ? num_kv_heads : num_heads; }
  // Query i attends keys j <= i + shift under causal: 0 top-left, Tk - Tq bottom-right.
  std::int64_t causal_shift(std::int64_t tq, std::int64_t tk) const {
    return causal_alignment == CausalAlignment::bottom_right ? tk - tq : 0;
  }
  double scale_for(std::int64_t d) const {
    return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(d));
  }
};

// The four projections, PyTorch's layout: W is [out, in] and y = x W^T (+ b).
// Query head h owns rows [h*d, (h+1)*d) of wq and columns [h*d, (h+1)*d) of
// wo; kv head j owns rows [j*d, (j+1)*d) of wk and wv, and query head h
// reads kv head floor(h / G) (PyTorch enable_gqa, HF repeat_kv).
// The biases are optional (undefined: none; all four or none, `bias: true`
// in a suite): head h owns entries [h*d, (h+1)*d) of bq, kv head j of bk, bv.
struct MhaWeights {
  Variable wq;  // [H*d, D]
  Variable wk;  // [Hkv*d, D]
  Variable wv;  // [Hkv*d, D]
  Variable wo;  // [D, H*d]
  // (= {}: MhaWeights{wq, wk, wv, wo} stays a complete initializer, without biases)
  Variable bq = {};  // [H*d] or undefined
  Variable bk = {};  // [Hkv*d] or undefined
  Variable bv = {};  // [Hkv*d] or undefined
  Variable bo = {};  // [D] or undefined
  // QK-norm gains (with spec.qk_norm; undefined otherwise): [d] for axis head
  // (every head shares them), [H*d] (q) and [Hkv*d] (k) for axis model.
  Variable q_norm = {};
  Variable k_norm = {};

  bool has_bias() const { return bq.defined() || bk.defined() || bv.defined() || bo.defined(); }
};

// x W^T + b (nn.Linear, F.linear); b undefined: x W^T.
Variable linear_bias(const Variable& x, const Variable& w, const Variable& b);

// The head layout of one MHA call, read from x and the spec.
struct MhaDims {
  std::int64_t d_model = 0;   // D = x.size(-1)
  std::int64_t heads = 0;     // H
  std::int64_t kv_heads = 0;  // Hkv
  std::int64_t head_dim = 0;  // d
  std::int64_t group = 0;     // G = H / Hkv
};
// Throws std::invalid_argument naming `who` and the shapes when Hkv does not
// divide H, D is not a multiple of H and no head width is given, a weight
// is not wq [H*d, D], wk and wv [Hkv*d, D], wo [D, H*d], or the biases are
// not all four of bq [H*d], bk and bv [Hkv*d], bo [D] (or none).
MhaDims mha_dims(const Variable& x, const MhaWeights& w, const AttentionSpec& spec,
                 std::string_view who);

// QK-norm and cross-attention around the projections (spec.qk_norm, spec.x_kv).
// mha_dims also checks them: with qk_norm on, q_norm and k_norm are [d] (axis
// head) or [H*d] and [Hkv*d] (axis model); x_kv is [..., Tk, D] with x's
// leading dims; RoPE with x_kv is refused (the two streams' positions are
// unrelated). The pipeline: q = x Wq^T, k = x_kv Wk^T, v = x_kv Wv^T (x_kv = x
// unless cross) -> QK-norm axis model -> split heads -> QK-norm axis head -> RoPE.
//
// The input k and v are projected from: spec.x_kv folded like x ([N, Tk, D]), else x3.
Variable kv_source(const Variable& x3, const AttentionSpec& spec);
// Axis model: q [B, T, H*d] or k [B, T, Hkv*d] normalized over its last dim
// with gain [H*d] / [Hkv*d]; returned unchanged unless spec.qk_norm is on with axis model.
Variable qk_norm_projection(const Variable& p, const Variable& gain, const AttentionSpec& spec);
// Axis head: q [B, H, T, d], k [B, Hkv, T, d] (or one head's [B, T, d])
// normalized over d with the shared gain [d]; unchanged unless axis head is on.
Variable qk_norm_heads(const Variable& h, const Variable& gain, const AttentionSpec& spec);

// Grouped kv heads at the core level: q [..., H, Tq, d], k [..., Hkv, Tk, d],
// v [..., Hkv, Tk, dv] with Hkv dividing H; returns G = H / Hkv (1 when k and v
// have q's heads, or q has no head dim). Dims before the head dim are not
// checked (a core may broadcast them). Throws naming `who` and the shapes.
std::int64_t kv_group(const Variable& q, const Variable& k, const Variable& v,
                      std::string_view who);
// kv [..., Hkv, T, d] -> [..., Hkv*G, T, d]: kv head j repeated for query heads
// [jG, (j+1)G) (repeat_interleave, not tile); the backward sums over the group.
Variable expand_kv_heads(const Variable& kv, std::int64_t group);

// The bool mask [..., Tq, Tk] (True = attend) that a spec asks for: causal
// (in spec.causal_alignment), spec.window, spec.mask, combined, or an undefined
// Tensor when every key is attended.
Tensor attention_mask(const AttentionSpec& spec, std::int64_t tq, std::int64_t tk);

// ---- sliding windows and sinks (softcap is the op softcap() of ops.hpp)
// o of the window rule p_i = i + o: Tk - Tq under causal bottom_right, else 0.
std::int64_t window_offset(const AttentionSpec& spec, std::int64_t tq, std::int64_t tk);
// Throws invalid_argument naming `who` for a negative bound.
void check_window(const WindowSpec& window, std::string_view who);
// [Tq, Tk] bool, True where p_i - left <= j <= p_i + right; undefined without a window.
Tensor window_mask(const AttentionSpec& spec, std::int64_t tq, std::int64_t tk);
// scores [..., H, Tq, Tk] and sinks [H] -> [..., H, Tq, Tk + 1]: sigma_h appended
// to every row of head h (one more softmax column, which has no value).
Variable with_sink_column(const Variable& scores, const Variable& sinks);

// RoPE inside attention, the one right way for every plugin: per head, after
// the head split, before the scores, never on v; under GQA k is rotated per kv
// head (before any widening: the same thing, done once). q [B, H, Tq, d] or one
// head's [B, Tq, d]; k [B, Hkv, Tk, d] or [B, Tk, d]. Keys sit at
// spec.rope's positions (or offset + t), queries there plus rope.q_offset.
// Both return their input unchanged when spec.rope.enabled is false.
Variable rope_queries(const Variable& q, const AttentionSpec& spec);
Variable rope_keys(const Variable& k, const AttentionSpec& spec);
// The spec for a layer that folds the leading dims of x [..., T, D] into one
// batch: rope positions [..., T] become [N, T] ([T] and [B, T] stay).
AttentionSpec fold_rope_positions(const AttentionSpec& spec, const Shape& x_shape);
// The spec handed on once q and k are rotated, so that a core does not rotate again.
AttentionSpec without_rope(const AttentionSpec& spec);

// [B, T, H*d] -> view [B, T, H, d] -> transpose -> [B, H, T, d] (a strided view).
Variable split_heads(const Variable& x, std::int64_t heads);
// [B, H, T, d] -> transpose -> [B, T, H, d] -> reshape (copies) -> [B, T, H*d].
// !! The transpose comes first: reshaping [B, H, T, d] straight to [B, T, D]
// keeps every size and silently mixes tokens with heads. !!
Variable merge_heads(const Variable& x);

// An attention core: q [B, H, Tq, d], k [B, H, Tk, d], v [B, H, Tk, dv] -> [B, H, Tq, dv]
// (k, v [B, Hkv, Tk, .] for a core that batched_mha calls with KvHeads::grouped).
using AttentionCore = std::function<Variable(const Variable& q, const Variable& k, const Variable& v,
                                             const AttentionSpec& spec)>;

// How batched_mha hands grouped KV heads (Hkv < H) to its core.
enum class KvHeads {
  repeat,   // widened to H with repeat_interleave: any core works
  grouped,  // as projected, [B, Hkv, T, d]: the core maps query head h to kv head h / (H / Hkv)
};

// The batched multi-head layer around any core: x [..., T, D] -> project (+ bias) ->
// split_heads -> (grouped KV heads widened to H, unless KvHeads::grouped) ->
// core -> merge_heads -> project -> [..., T, D]. Leading dims are folded into
// one batch. Shapes are checked first (mha_dims). With spec.rope on, q and k
// are rotated after the split (k per kv head) and the core gets without_rope(spec).
Variable batched_mha(const Variable& x, const MhaWeights& w, const AttentionSpec& spec,
                     const AttentionCore& core, KvHeads kv_heads = KvHeads::repeat);

// Scaled dot-product attention composed from ops (its backward comes from
// autodiff): softmax(q k^T * scale, masked) v over the last two dims.
// spec.rope is not read here: callers rotate q and k first (rope_queries/keys).
// q [..., Tq, d], k [..., Tk, d], v [..., Tk, dv] -> [..., Tq, dv].
// A query row whose keys are all masked gives zeros (softmax's rule), not NaN.
Variable attention_core(const Variable& q, const Variable& k, const Variable& v,
                        const AttentionSpec& spec);

}  // namespace headgrad
