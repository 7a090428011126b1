// batched: all heads at once. Project, split [B, T, D] -> [B, H, T, d], one
// batched core, merge back (transpose first), project.
//
// RoPE (when on) rotates q and k after the split, k per kv head.
// Grouped kv heads: k and v are expanded to H heads (repeat_interleave by G,
// kv head j serving query heads [jG, (j+1)G)), then the MHA core runs.
//
// Shape legend: B batch, T sequence, D model width, H query heads, Hkv
// key/value heads, G = H / Hkv, d head width (D / H unless given).
#include <headgrad/plugin.hpp>

namespace {

using namespace headgrad;

class Batched final : public Attention {
 public:
  PluginInfo info() const override {
    PluginInfo i;
    i.name = "batched";
    i.version = "1.0.0";
    i.description = "split, transpose, batched core, transpose back, merge";
    auto& c = i.capabilities;
    c.mha = c.core = c.causal = c.bool_mask = c.cross_lengths = c.grouped_kv = c.rope = c.rope_level = true;
    c.extra = {"bfloat16", "float16"};  // through the engine's ops: float32 math, 16-bit results
    return i;
  }

  // x [..., T, D] -> [..., T, D]
  Variable mha_forward(const Variable& x, const MhaWeights& w,
                       const AttentionSpec& spec) const override {
    return batched_mha(x, w, spec, [this](const Variable& q, const Variable& k, const Variable& v,
                                          const AttentionSpec& s) { return core_forward(q, k, v, s); });
  }

  // x [..., T, d]: the leading dims folded into one batch [N, T, d] (positions
  // [..., T] folded alike), rotated at once, unfolded.
  Variable rope_forward(const Variable& x, const RopeSpec& spec) const override {
    AttentionSpec s;
    s.rope = spec;
    s.rope.enabled = true;
    const AttentionSpec folded = fold_rope_positions(s, x.shape());
    if (x.dim() < 3) return rope(x, spec);
    return reshape(rope(reshape(x, {-1, x.size(-2), x.size(-1)}), folded.rope), x.shape());
  }

  Variable core_forward(const Variable& q, const Variable& k, const Variable& v,
                        const AttentionSpec& spec) const override {
    // q [..., H, Tq, d], k and v [..., Hkv, Tk, .] -> widened to H heads
    const std::int64_t group = kv_group(q, k, v, "batched");
    return attention_core(rope_queries(q, spec), expand_kv_heads(rope_keys(k, spec), group),
                          expand_kv_heads(v, group), spec);
  }
};

}  // namespace

HEADGRAD_PLUGIN(Batched)
