// The catalog of known multi-head attention bugs: each has a stable name, a
// one-line explanation, the fix, and the shapes at which it cannot be seen
// (its signature, used by localization and the weak-suite warnings).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace headgrad::runner {
struct Suite;
}

namespace headgrad::diagnosis {

enum class Bug {
#define HEADGRAD_BUG(name) name,
#include "analysis/bug_names.def"
#undef HEADGRAD_BUG
  count_,  // keep last
};

// What a bug needs in a case before it can show.
struct Visibility {
  bool needs_heads = false;    // invisible at H = 1
  bool needs_seq = false;      // invisible at T = 1 (or Tk = 1)
  bool needs_batch = false;    // invisible at B = 1
  bool needs_causal = false;   // invisible without a causal mask
  bool needs_d_lt_D = false;   // invisible when the head dim equals the model dim
  bool mha_only = false;       // lives in the projections or the head layout
  bool needs_tq_ne_tk = false; // invisible when Tq = Tk (so at the mha level): core cases only
  bool needs_empty_row = false;    // invisible unless a query row has every key masked
  bool needs_large_logits = false; // invisible unless a score passes exp's range (~11 float16, ~88 float32 and bfloat16, ~709 float64)
  // Grouped kv heads (G = H / Hkv query heads per kv head):
  bool needs_group = false;     // invisible at Hkv = H (G = 1)
  bool needs_kv_heads = false;  // invisible at Hkv = 1 (MQA)
  bool needs_non_square = false;  // invisible at H = Hkv^2 (G = Hkv)
  bool needs_mask = false;  // invisible unless the case has a boolean mask (a mask file or a reference's mask.npy)
  // Rotary position embeddings (a case's rope: block):
  bool needs_rope = false;            // a RoPE bug: invisible without a rope block
  bool needs_rope_pairs = false;      // invisible at rotary_dim 2 (one pair, w_0 = 1 for every base)
  bool needs_gapped_positions = false;  // invisible when every row of positions is arange + c
  bool needs_far_positions = false;   // hides below position ~1000 (float32 angles err ~1e-6 relative there)
  bool needs_partial_rotary = false;  // invisible at rotary_dim = d
  bool needs_custom_theta = false;    // invisible at theta 10000 (the base it hard-codes)
  bool needs_rope_taps = false;       // invisible in out and every gradient: only taps or the rope level see it
  bool needs_qkv = false;             // lives between q, k and v (or in the projection): no rope-level form
  bool needs_16bit = false;  // invisible in float64 and float32: only bfloat16 / float16 show it
  // invisible unless rows of positions [B, T] differ and B is apart from H and Hkv
  // (rows read by the head axis fit by chance where B = H; rows only shifted need Hkv < H)
  bool needs_position_rows = false;
  // QK-norm and cross-attention (mha level):
  bool needs_qk_norm = false;         // a QK-norm bug: invisible without a case's qk_norm
  bool needs_per_dim_gains = false;   // out and every dW exact when the gains are equal within each rotated pair
  bool needs_small_activations = false;  // moves out by ~4.5e-6 / mean(q^2): lost below float64 at mean(q^2) ~ 1
  bool needs_cross = false;           // a cross-attention bug: invisible without cross: true
  bool needs_non_causal = false;      // invisible in a case that is causal anyway (or at Tk = 1)
  // Sliding windows, soft-capping, sinks (a case's window:, softcap:, sinks:):
  bool needs_window = false;      // invisible without a window hiding keys (T > W + 1)
  bool needs_softcap = false;     // invisible without a cap the scores reach (|s| ~ C)
  bool needs_masked_key = false;  // invisible unless some key is masked (causal, a window or a mask)
  bool needs_sinks = false;       // invisible without sinks
  bool needs_long_keys = false;   // invisible unless Tk exceeds a kernel's key tile (kKeyTile keys)
};

// The key tile of the fused kernels the catalog assumes (sink_per_tile): the
// usual Bc of FlashAttention and fused_sdpa's default; a per-tile bug shows only
// where Tk exceeds it.
inline constexpr std::int64_t kKeyTile = 128;

struct BugInfo {
  Bug bug;
  std::string_view name;         // stable: what suites write in expect.diagnosis (from bug_names.def)
  std::string_view explanation;  // one line
  std::string_view fix;          // one line
  Visibility visibility;
};

std::span<const BugInfo> bug_catalog();
const BugInfo& bug_info(Bug bug);
std::optional<Bug> bug_from_name(std::string_view name);
// A bug of the rotation itself, which the rope level (x alone) can show.
bool has_rope_level_form(const BugInfo& info);

// Every case's `expect: {diagnosis: NAME}` names a catalog bug or none; else a
// ConfigError at the name, suggesting the closest one. run_suite calls it first.
void check_expected_diagnoses(const runner::Suite& suite);

}  // namespace headgrad::diagnosis
