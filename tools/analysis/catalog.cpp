#include "analysis/catalog.hpp"

#include <string>
#include <vector>

#include "case/suite.hpp"

#include <array>

namespace headgrad::diagnosis {

namespace {
constexpr std::string_view kNames[] = {
#define HEADGRAD_BUG(name) #name,
#include "analysis/bug_names.def"
#undef HEADGRAD_BUG
};

// Field order: needs_heads, needs_seq, needs_batch, needs_causal, needs_d_lt_D, mha_only,
// needs_tq_ne_tk, needs_empty_row, needs_large_logits, needs_group, needs_kv_heads,
// needs_non_square, needs_mask (false when left out); the RoPE and 16-bit entries name their fields.
// Each entry's name is filled in from bug_names.def below.
constexpr std::array<BugInfo, static_cast<std::size_t>(Bug::count_)> kEntries{{
    {Bug::split_without_transpose, {},
     "[B, T, D] was reshaped straight to [B, H, T, d]: each head reads a block of tokens, not its own features",
     "view as [B, T, H, d] first, then transpose(1, 2)",
     {true, true, false, false, false, true}},
    {Bug::merge_without_transpose, {},
     "[B, H, T, d] was reshaped straight to [B, T, D]: tokens and heads are mixed in the output",
     "transpose(1, 2) to [B, T, H, d] first, then reshape to [B, T, D]",
     {true, true, false, false, false, true}},
    {Bug::scale_one_over_d, {},
     "scores are scaled by 1/d instead of 1/sqrt(d)",
     "multiply q k^T by 1/sqrt(d), d the head width",
     {false, true, false, false, false, false}},
    {Bug::scale_model_dim, {},
     "scores are scaled by 1/sqrt(D), the model width, instead of 1/sqrt(d), the head width",
     "use d = D / H in the scale",
     {false, true, false, false, true, true}},
    {Bug::no_scale, {},
     "scores q k^T are not scaled at all",
     "multiply q k^T by 1/sqrt(d) before the softmax",
     {false, true, false, false, false, false}},
    {Bug::softmax_over_queries, {},
     "the softmax runs over the query dim (-2) instead of the key dim (-1)",
     "softmax(scores, dim=-1)",
     {false, true, false, false, false, false}},
    {Bug::missing_causal_mask, {},
     "the causal mask is not applied: queries see future keys",
     "mask scores where key j > query i with -inf before the softmax",
     {false, true, false, true, false, false}},
    {Bug::causal_mask_excludes_diagonal, {},
     "the causal mask also hides the diagonal (j < i instead of j <= i): a token cannot see itself",
     "keep j <= i (torch.tril(ones), diagonal included)",
     {false, false, false, true, false, false}},
    {Bug::causal_mask_inverted, {},
     "the causal mask is inverted: queries see the future and not the past",
     "attend where j <= i, mask where j > i (True = attend)",
     {false, true, false, true, false, false}},
    {Bug::missing_output_projection, {},
     "the output projection Wo is never applied",
     "return merge(heads) @ Wo^T",
     {false, false, false, false, false, true}},
    {Bug::weights_not_transposed, {},
     "projections compute x W instead of x W^T (W is [out, in])",
     "use x @ W.T (linear), not x @ W",
     {false, false, false, false, false, true}},
    {Bug::interleaved_head_slices, {},
     "head h takes features h, h+H, h+2H, ... instead of the block [h*d, (h+1)*d)",
     "view as [B, T, H, d] (heads outermost), not [B, T, d, H]",
     {true, false, false, false, false, true}},
    {Bug::kv_swapped, {},
     "keys and values are swapped: scores use V and the output weights K",
     "scores = q k^T, output = softmax(scores) v",
     {false, false, false, false, false, false}},
    {Bug::batch_mixing, {},
     "attention weights of one batch item are applied to another (a gather or reshape across the batch)",
     "keep the batch dim outermost and untouched in every reshape",
     {false, false, true, false, false, false}},
    {Bug::causal_alignment, {},
     "aligns the causal mask bottom-right; set causal: bottom_right if that is your convention",
     "mask key j > query i (top-left, as is_causal), or declare the convention: causal: bottom_right "
     "(query i attends j <= i + Tk - Tq)",
     {false, false, false, true, false, false, true}},
    {Bug::mask_fill_finite, {},
     "masked scores are filled with a finite value (-1e4) instead of -inf: a query row whose keys are all "
     "masked attends every key uniformly instead of giving zeros",
     "masked_fill with -inf (and give a fully masked row zeros), not a large negative number",
     {false, false, false, false, false, false, false, true, false}},
    {Bug::softmax_no_max_subtraction, {},
     "the softmax computes exp(s) / sum(exp(s)) without subtracting the row max: large logits overflow to inf "
     "and give NaN",
     "softmax(s) = exp(s - max(s)) / sum(exp(s - max(s))) (or use the library's softmax)",
     {false, false, false, false, false, false, false, false, true}},
    {Bug::mask_ignored, {},
     "the boolean mask (spec.mask) is ignored: queries attend the keys the mask hides (the causal mask, if any, "
     "is still applied)",
     "combine spec.mask with the causal mask (attention_mask(spec, Tq, Tk) does) before the softmax, True = attend",
     {false, false, false, false, false, false, false, false, false, false, false, false, true}},
    // Grouped kv heads: query head h must read kv head h / G (G = H / Hkv), and
    // the gradient of a kv head is the sum over its G query heads. The first
    // four show at the core level too (k, v given with Hkv heads).
    {Bug::kv_map_tile, {},
     "query head h reads kv head h mod Hkv (tiled) instead of h / G: heads of a group are spread over all kv heads",
     "kv head = h // (H // Hkv), as repeat_interleave(G, dim=1) lays them out (not repeat)",
     {true, false, false, false, false, false, false, false, false, true, true, false}},
    {Bug::kv_group_wrong_divisor, {},
     "query head h reads kv head h / Hkv (or h mod G) instead of h / G: the group size and the kv head count are "
     "swapped (when G > Hkv the index runs past the last kv head: a checked gather fails, a clamping one reads the last)",
     "divide by the group size G = H / Hkv, not by Hkv",
     {true, false, false, false, false, false, false, false, false, true, true, true}},
    {Bug::kv_grad_not_accumulated, {},
     "the gradient of a shared kv head comes from one query head of its group, not all G: dk and dv (dWk and dWv) are wrong, out is right",
     "sum dK and dV over the G query heads of each group (repeat_interleave's backward does)",
     {true, false, false, false, false, false, false, false, false, true, false, false}},
    {Bug::kv_grad_averaged, {},
     "the gradient of a shared kv head is the mean over its group instead of the sum: dk and dv (dWk and dWv) are 1/G of the truth",
     "sum dK and dV over the group, do not divide by G",
     {true, false, false, false, false, false, false, false, false, true, false, false}},
    {Bug::kv_interleaved_head_slices, {},
     "kv head j takes rows j, j+Hkv, j+2Hkv, ... of Wk and Wv instead of the block [j*d, (j+1)*d)",
     "view k and v as [B, T, Hkv, d] (heads outermost), like q",
     {true, false, false, false, false, true, false, false, false, false, true, false}},
    // Rotary position embeddings: q and k per head, after the split, before the
    // scores, never v; pair k rotates by p_t * theta^(-2k/r) (docs/design.md).
    {Bug::rope_style_swapped, {},
     "RoPE uses the other pairing (half (k, k + r/2) where interleaved (2k, 2k+1) is asked, or the reverse): "
     "it matches once the rows of Wq and Wk are permuted between the pairings",
     "pair dims as the checkpoint was trained (interleaved: Meta, GPT-J; half: GPT-NeoX, HF rotate_half), or "
     "permute Wq and Wk rows per head as HF's conversion does",
     {.needs_seq = true, .needs_rope = true, .needs_rope_pairs = true}},
    {Bug::rope_on_v, {},
     "v is rotated too: RoPE belongs on q and k only",
     "rotate q and k after the head split; leave v as projected",
     {.needs_rope = true, .needs_qkv = true}},
    {Bug::rope_missing_on_k, {},
     "k is never rotated (only q is): scores see absolute query positions, not differences",
     "apply the same rotation to k (per kv head) as to q",
     {.needs_seq = true, .needs_rope = true, .needs_qkv = true}},
    {Bug::rope_before_head_split, {},
     "q and k are rotated as one [B, T, H*d] vector before the head split: pairs and frequencies span all heads",
     "split into [B, H, T, d] first, then rotate each head's first r dims with w_k = theta^(-2k/r)",
     {.needs_heads = true, .needs_seq = true, .mha_only = true, .needs_rope = true, .needs_qkv = true}},
    {Bug::rope_wrong_theta, {},
     "the RoPE base is hard-coded at 10000 instead of the configured theta: the error grows with the position gaps",
     "read theta from the config (Llama 3 uses 500000) when building w_k = theta^(-2k/r)",
     {.needs_seq = true, .needs_rope = true, .needs_rope_pairs = true, .needs_custom_theta = true}},
    {Bug::rope_freq_exponent, {},
     "the RoPE frequencies are theta^(-k/r) (arange(r/2) / r, the factor 2 lost) instead of theta^(-2k/r)",
     "w_k = theta^(-2k/r) for k = 0 .. r/2-1, i.e. 1 / theta^(arange(0, r, 2) / r)",
     {.needs_seq = true, .needs_rope = true, .needs_rope_pairs = true}},
    {Bug::rope_position_shift, {},
     "every position of q and k is shifted by one (positions start at 1): out and every gradient are unchanged, "
     "only q and k after the rotation (taps, or the rope level) show it",
     "rotate token t at its own position p_t (0-based), as the positions tensor gives it",
     {.needs_rope = true, .needs_rope_taps = true}},
    {Bug::rope_qk_offset_mismatch, {},
     "q and k are rotated from different position bases (keys one position ahead, as a cache written at "
     "start_pos + 1): scores see p_q - p_k - 1",
     "rotate q and k from the same positions (queries at q_offset + p_t, keys at p_t)",
     {.needs_seq = true, .needs_rope = true, .needs_qkv = true}},
    {Bug::rope_positions_ignored, {},
     "the token positions are ignored and 0 .. T-1 used: gapped, reversed or per-row positions rotate wrongly",
     "rotate token t at positions[b, t] (position_ids), not at arange(T)",
     {.needs_seq = true, .needs_rope = true, .needs_gapped_positions = true}},
    {Bug::rope_sign_flipped, {},
     "the forward rotates by -phi (a' = a cos + b sin, b' = -a sin + b cos): scores see p_k - p_q",
     "a' = a cos(phi) - b sin(phi), b' = a sin(phi) + b cos(phi)",
     {.needs_seq = true, .needs_rope = true}},
    {Bug::rope_backward_not_transposed, {},
     "a hand-written RoPE backward applies R (rotation by +phi) instead of R^T: out, dWv and dWo are exact, "
     "dx, dWq and dWk are wrong (= X X X = =)",
     "the backward of x' = R x is dx = R^T dy: rotate dy by -phi",
     {.needs_seq = true, .needs_rope = true}},
    {Bug::rope_tables_float32, {},
     "the RoPE angles and cos/sin tables are float32 in a float64 unit: about 1e-6 relative error at position "
     "1000, growing with the position",
     "build w_k, phi = p * w_k, cos and sin in float64 (the compute dtype), then rotate",
     {.needs_rope = true, .needs_far_positions = true}},
    {Bug::rope_partial_wrong_span, {},
     "partial rotary rotates the last r dims of each head instead of the first r (the rest must pass through)",
     "rotate dims [0, r) of each head and pass [r, d) through unchanged",
     {.needs_seq = true, .needs_rope = true, .needs_partial_rotary = true}},
    // Precision: right in float64 and float32, wrong in 16 bits.
    {Bug::fp16_accumulator, {},
     "the products q k^T and P V accumulate in the 16-bit storage type (each partial sum rounded) instead of "
     "float32: the error grows with the head width and the key count, far above one rounding of the result",
     "accumulate matmuls in float32 and round the result once (as every float32-accumulating kernel does)",
     {.needs_16bit = true}},
    {Bug::rope_positions_wrong_axis, {},
     "the positions [B, T] are broadcast onto the head axis instead of the batch axis ([1, H, T], not [B, 1, T]): "
     "head h of every batch row rotates at positions row h mod B",
     "index positions by the batch: positions[:, None, :] against q [B, H, T, d] (and k [B, Hkv, T, d])",
     {.needs_seq = true, .needs_batch = true, .needs_rope = true, .needs_position_rows = true}},
    // A packed qkv projection ([(H + 2 Hkv) d, D]) split in the other layout
    // than it was packed: blocked q | k | v (nn.MultiheadAttention's
    // in_proj_weight, GPT-2's c_attn) read per kv group as [G q heads; k; v]
    // (GPT-NeoX, Megatron). Invisible where both layouts agree: Hkv = 1 (H = 1 included).
    {Bug::qkv_packing_mismatch, {},
     "the packed qkv weight was packed blocked (q | k | v, [3D, D]) but split per head ([q_h; k_h; v_h], "
     "GPT-NeoX / Megatron order): each head's q, k and v come from the wrong rows",
     "split the packed weight in the layout it was packed in (blocked: q, k, v = W.split(D); per head: "
     "view as [Hkv, G + 2, d, D]), or repack it",
     {.needs_heads = true, .mha_only = true, .needs_kv_heads = true}},
    // The other direction: packed per kv group ([G q heads; k; v]: GPT-NeoX,
    // Megatron) and split blocked (q | k | v: a GPT-2 style W.split(D)), e.g. a
    // NeoX checkpoint loaded into a c_attn module. Invisible where they agree.
    {Bug::qkv_packing_mismatch_reverse, {},
     "the packed qkv weight was packed per head ([q_h; k_h; v_h], GPT-NeoX / Megatron order) but split blocked "
     "(q | k | v = W.split(D)): each head's q, k and v come from the wrong rows",
     "split the packed weight in the layout it was packed in (per head: view as [Hkv, G + 2, d, D]; blocked: "
     "q, k, v = W.split(D)), or repack it",
     {.needs_heads = true, .mha_only = true, .needs_kv_heads = true}},
    // QK-norm (OLMo 2, Qwen3, Gemma 3): RMSNorm of q and k after the projections,
    // before RoPE; axis head (over d, a [d] gain) or model (over H*d / Hkv*d).
    {Bug::qk_norm_ignored, {},
     "QK-norm is skipped: q and k reach the scores unnormalized and the gains q_norm, k_norm get no gradient",
     "normalize q and k (x / sqrt(mean(x^2) + eps) * g) after the projections, before RoPE",
     {.mha_only = true, .needs_qk_norm = true}},
    {Bug::qk_norm_missing_on_k, {},
     "only q is normalized: k reaches the scores unnormalized and k_norm gets no gradient (dk_norm 0)",
     "apply k_norm to k as q_norm is applied to q",
     {.mha_only = true, .needs_qk_norm = true}},
    {Bug::qk_norm_axis_swapped, {},
     "QK-norm takes its statistics over the other axis: a whole token's projection (H*d) where the norm is per "
     "head (d), or per head where it is over the whole projection",
     "axis head: mean(x^2) over each head's d; axis model: over the token's H*d for q (Hkv*d for k), before the "
     "head split",
     {.needs_heads = true, .mha_only = true, .needs_kv_heads = true, .needs_qk_norm = true}},
    {Bug::qk_norm_after_rope, {},
     "QK-norm is applied after RoPE instead of before: with gains that differ within a rotated pair every tensor "
     "moves; with pairwise-equal gains only dq_norm and dk_norm do",
     "normalize q and k first, then rotate them",
     {.needs_seq = true, .mha_only = true, .needs_rope = true, .needs_qkv = true, .needs_qk_norm = true,
      .needs_per_dim_gains = true}},
    {Bug::qk_norm_gain_convention, {},
     "the gain convention is swapped: g = 1 + w where the norm multiplies by w (Qwen3, OLMo 2), or w where it "
     "multiplies by 1 + w (Gemma's unit offset)",
     "g = w for qk_norm gain: w, g = 1 + w for gain: one_plus_w (the gradient dw is the same either way)",
     {.mha_only = true, .needs_qk_norm = true}},
    {Bug::qk_norm_eps, {},
     "QK-norm uses eps 1e-5 (a library default) instead of the configured one: out moves by about "
     "4.5e-6 / mean(q^2) relative",
     "use the model's eps under the root: sqrt(mean(x^2) + eps)",
     {.mha_only = true, .needs_qk_norm = true, .needs_small_activations = true}},
    // Cross-attention (encoder-decoder): q from x [B, Tq, D], k and v from x_kv [B, Tk, D].
    {Bug::cross_causal, {},
     "cross-attention is masked causally (the decoder's mask kept): query i sees keys j <= i of the other stream "
     "only",
     "no causal mask in cross-attention: every query attends every key (key padding is a mask of its own)",
     {.needs_seq = true, .mha_only = true, .needs_cross = true, .needs_non_causal = true}},
    {Bug::cross_kv_from_queries, {},
     "k and v are projected from the queries' input x instead of x_kv: x_kv gets no gradient and the keys are "
     "the queries' tokens",
     "k = x_kv Wk^T, v = x_kv Wv^T; only q comes from x",
     {.mha_only = true, .needs_cross = true}},
    // Sliding windows (`window: {left, right}`): key j is in query i's window
    // when p_i - left <= j <= p_i + right, p_i = i + (Tk - Tq) under causal
    // bottom_right, else i (docs/design.md). Conventions differ on what W counts.
    {Bug::window_off_by_one, {},
     "the window counts W + 1 keys: its left bound is read as left + 1 (kv_idx >= q_idx - W where q_idx - W + 1 "
     "was meant); if that is your convention, set 'left: L + 1' in the case to match",
     "a window of W keys, the query included, is q_idx - W < kv_idx <= q_idx: {left: W - 1, right: 0} with causal "
     "(FlashAttention's window_size=(W - 1, 0))",
     {.needs_seq = true, .needs_window = true}},
    {Bug::window_both_sides, {},
     "the window's right bound is set to the left one (window_size=(W, W)): without causal, queries see W keys "
     "ahead too (2W + 1 keys); without a left bound that is no window, named window_ignored",
     "pass the right bound on its own (window_size=(W - 1, 0) for a causal window), or keep causal on",
     {.needs_seq = true, .needs_window = true}},
    {Bug::window_anchor_top_left, {},
     "the window is anchored at p_i = i while causal is bottom_right: at a decode step (Tq < Tk) query i reads keys "
     "i - L .. i instead of i + Tk - Tq - L .. i + Tk - Tq; if that is your convention, set causal: top_left",
     "put the window on the causal diagonal: p_i = i + Tk - Tq under causal bottom_right",
     {.needs_seq = true, .needs_tq_ne_tk = true, .needs_window = true}},
    {Bug::window_ignored, {},
     "the sliding window is ignored: every query sees every key causal and the mask allow",
     "mask keys j < p_i - left and j > p_i + right (-inf) before the softmax",
     {.needs_seq = true, .needs_window = true}},
    {Bug::window_ignored_in_backward, {},
     "the backward recomputes P = exp(S - L) without the window: out is right, dq, dk and dv are wrong "
     "(MHA: out and dWo exact, dx, dWq, dWk, dWv wrong)",
     "apply the same window mask where the backward recomputes P (and skip the same tiles)",
     {.needs_seq = true, .needs_window = true}},
    // Logit soft-capping (`softcap: C`): s <- C tanh(s / C), after the scale, before the masks.
    {Bug::softcap_ignored, {},
     "the soft-cap is ignored: scores are not capped to C tanh(s / C)",
     "apply s = C * tanh(s / C) to the scaled scores, before the masks",
     {.needs_softcap = true}},
    {Bug::softcap_missing_in_backward, {},
     "the backward through the cap drops its 1 - tanh^2(s / C) factor: out and dv are right, dq and dk wrong "
     "(MHA: out, dWv, dWo exact; dx, dWq, dWk wrong)",
     "ds = dc * (1 - tanh^2(s / C)), from the capped score: 1 - (c / C)^2",
     {.needs_seq = true, .needs_softcap = true}},
    {Bug::softcap_after_mask, {},
     "the cap is applied after the mask: a masked -inf becomes -C, a finite logit, so masked keys leak (and a fully "
     "masked row becomes the mean of its values)",
     "cap the scaled scores first, then mask them with -inf",
     {.needs_seq = true, .needs_softcap = true, .needs_masked_key = true}},
    {Bug::softcap_before_scale, {},
     "the cap is applied before the scale: C tanh(q.k / C) * scale instead of C tanh(scale q.k / C)",
     "scale first, then cap (a kernel that folds the scale keeps it inside tanh: tanh(S * scale / C))",
     {.needs_softcap = true}},
    {Bug::softcap_wrong_formula, {},
     "the cap computes u tanh(u) with u = s / C instead of C tanh(u)",
     "c = C * tanh(s / C)",
     {.needs_softcap = true}},
    // Attention sinks (`sinks: true`): one learned logit per query head, one more
    // softmax column with no value, not scaled, not capped (gpt-oss).
    {Bug::sink_ignored, {},
     "the sinks are accepted but never used: no sink column in the softmax, dsinks 0",
     "append sigma_h as one more softmax column of every row of head h, and drop its weight before P V",
     {.needs_sinks = true}},
    {Bug::sink_grad_missing, {},
     "the gradient of the sinks is missing (0): out and every other gradient are right",
     "dsigma_h = -sum over b, i of P_sink D (D = dO . O), reduced per query head",
     {.needs_sinks = true}},
    {Bug::sink_with_value, {},
     "the sink column is given a value (v of key 0, a sink token's): o_i gets P_sink v_0 on top",
     "the sink has no value: o_i = sum over the real keys of p_ij v_j (a fully masked row gives 0)",
     {.needs_sinks = true}},
    {Bug::sink_per_kv_head, {},
     "the sink of query head h is read at its kv head h / G, as k and v are: heads of a group share one sink",
     "index the sinks by the query head: sinks [H], sigma_h for query head h",
     {.needs_heads = true, .needs_group = true, .needs_sinks = true}},
    {Bug::sink_scaled, {},
     "the sink logit is multiplied by the softmax scale, like q.k",
     "append sigma_h as it is: the scale multiplies q.k only",
     {.needs_sinks = true}},
    {Bug::window_by_position, {},
     "the window is applied to the RoPE positions, not to the key indices (llama.cpp's is_masked_swa: masked when "
     "p_q - p_k > left): where positions are gapped or not consecutive the window holds other keys",
     "count the window in token indices: p_i - left <= j <= p_i + right, whatever the positions the rotation reads",
     {.needs_seq = true, .needs_rope = true, .needs_gapped_positions = true, .needs_qkv = true, .needs_window = true}},
    {Bug::sink_not_in_max, {},
     "the online softmax's running max starts at -inf, not at the sink sigma_h, and the sink is added with the keys' "
     "max: a row with every key masked gets lse = -inf + inf = NaN, so dsinks is NaN (out, dq, dk, dv exact)",
     "start each row's running max at m = sigma_h with l = 1 (or take max(sigma_h, max_j s_ij) before the sink's "
     "exp)",
     {.needs_empty_row = true, .needs_sinks = true}},
    {Bug::sink_per_tile, {},
     "the sink is added once per key tile (of 128 keys) instead of once per row: as if sigma_h were "
     "sigma_h + ln(tiles), every tensor off where Tk exceeds one tile",
     "fold the sink into the row once: at the start (m = sigma_h, l = 1) or after the last key tile, never per tile "
     "or split",
     {.needs_seq = true, .needs_sinks = true, .needs_long_keys = true}},
}};

constexpr auto kCatalog = [] {
  auto named = kEntries;
  for (auto& b : named) b.name = kNames[static_cast<std::size_t>(b.bug)];
  return named;
}();

static_assert(std::size(kNames) == kCatalog.size(), "one catalog entry per line of bug_names.def");
static_assert([] {
  for (std::size_t i = 0; i < kCatalog.size(); ++i)
    if (static_cast<std::size_t>(kCatalog[i].bug) != i) return false;
  return true;
}(), "the catalog must list the bugs in enum order");
}  // namespace

std::span<const BugInfo> bug_catalog() { return kCatalog; }

const BugInfo& bug_info(Bug bug) { return kCatalog[static_cast<std::size_t>(bug)]; }

bool has_rope_level_form(const BugInfo& info) { return info.visibility.needs_rope && !info.visibility.needs_qkv; }

std::optional<Bug> bug_from_name(std::string_view name) {
  for (const auto& b : kCatalog)
    if (b.name == name) return b.bug;
  return std::nullopt;
}

void check_expected_diagnoses(const runner::Suite& suite) {
  std::vector<std::string> names;
  for (const BugInfo& b : bug_catalog()) names.emplace_back(b.name);
  for (const runner::CaseSpec& c : suite.cases) {
    const std::string& name = c.expect_diagnosis;
    if (name.empty() || name == "none" || bug_from_name(name)) continue;
    const std::string near = runner::closest_match(name, names);
    throw runner::ConfigError(c.expect_diagnosis_at,
                              "case '" + (c.base_name.empty() ? c.name : c.base_name) +
                                  "': 'diagnosis' must be a known bug's name or none, got '" + name + "'" +
                                  (near.empty() ? "; the names: " + runner::join(names)
                                                : "; did you mean '" + near + "'?"));
  }
}

}  // namespace headgrad::diagnosis
