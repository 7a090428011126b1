#include "analysis/catalog.hpp"

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
// needs_non_square, needs_16bit (false when left out)
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
    // Grouped kv heads: query head h must read kv head h / G (G = H / Hkv), and
    // the gradient of a kv head is the sum over its G query heads.
    {Bug::kv_map_tile, {},
     "query head h reads kv head h mod Hkv (tiled) instead of h / G: heads of a group are spread over all kv heads",
     "kv head = h // (H // Hkv), as repeat_interleave(G, dim=1) lays them out (not repeat)",
     {true, false, false, false, false, true, false, false, false, true, true, false}},
    {Bug::kv_group_wrong_divisor, {},
     "query head h reads kv head h / Hkv (or h mod G) instead of h / G: the group size and the kv head count are swapped",
     "divide by the group size G = H / Hkv, not by Hkv",
     {true, false, false, false, false, true, false, false, false, true, true, true}},
    {Bug::kv_grad_not_accumulated, {},
     "the gradient of a shared kv head comes from one query head of its group, not all G: dWk and dWv are wrong, out is right",
     "sum dK and dV over the G query heads of each group (repeat_interleave's backward does)",
     {true, false, false, false, false, true, false, false, false, true, false, false}},
    {Bug::kv_grad_averaged, {},
     "the gradient of a shared kv head is the mean over its group instead of the sum: dWk and dWv are 1/G of the truth",
     "sum dK and dV over the group, do not divide by G",
     {true, false, false, false, false, true, false, false, false, true, false, false}},
    {Bug::kv_interleaved_head_slices, {},
     "kv head j takes rows j, j+Hkv, j+2Hkv, ... of Wk and Wv instead of the block [j*d, (j+1)*d)",
     "view k and v as [B, T, Hkv, d] (heads outermost), like q",
     {true, false, false, false, false, true, false, false, false, false, true, false}},
    // Precision: right in float64 and float32, wrong in 16 bits.
    {Bug::fp16_accumulator, {},
     "the products q k^T and P V accumulate in the 16-bit storage type (each partial sum rounded) instead of "
     "float32: the error grows with the head width and the key count, far above one rounding of the result",
     "accumulate matmuls in float32 and round the result once (as every float32-accumulating kernel does)",
     {false, false, false, false, false, false, false, false, false, false, false, false, true}},
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

std::optional<Bug> bug_from_name(std::string_view name) {
  for (const auto& b : kCatalog)
    if (b.name == name) return b.bug;
  return std::nullopt;
}

}  // namespace headgrad::diagnosis
