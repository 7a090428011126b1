// batched: all heads at once. Project, split [B, T, D] -> [B, H, T, d], one
// batched core, merge back (transpose first), project.
//
// RoPE (when on) rotates q and k after the split, k per kv head.
// Grouped kv heads: k and v are expanded to H heads (repeat_interleave by G,
// kv head j serving query heads [jG, (j+1)G)), then the MHA core runs.
//
// Causal without a bool mask (and T >= 2 blocks): the same composed core,
// matmul, masked_softmax, matmul, run on blocks of kBlockRows query rows, each
// against only the keys it can see (block [i0, i1) sees keys [0, i1 + shift)),
// and the blocks' outputs concatenated. The tiles above the diagonal are never
// multiplied: about (n + 1) / 2n of the dense products for n blocks, and the
// [T, T] score and weight buffers shrink alike. Each query row still sees all
// of its keys in one softmax, so the values are those of the dense core (the
// masked tail of a row adds exact zeros); the engine still derives the
// gradients (narrow and cat have their own backward).
//
// Shape legend: B batch, T sequence, D model width, H query heads, Hkv
// key/value heads, G = H / Hkv, d head width (D / H unless given).
#include <algorithm>
#include <vector>

#include <headgrad/plugin.hpp>

namespace {

using namespace headgrad;

// Query rows per block of the block-causal core: a block's products are
// [kBlockRows, d] x [d, keys], large enough for the BLAS to run near its peak.
constexpr std::int64_t kBlockRows = 128;

// The causal core by row blocks: q [..., H, Tq, d], k and v [..., H, Tk, .]
// (already widened) -> [..., H, Tq, dv]. Needs spec.causal, no bool mask and
// shift >= 0, so that every row sees at least key 0.
Variable block_causal_core(const Variable& q, const Variable& k, const Variable& v,
                           const AttentionSpec& spec) {
  const std::int64_t tq = q.size(-2), tk = k.size(-2);
  const std::int64_t shift = spec.causal_shift(tq, tk);
  const double scale_factor = spec.scale_for(q.size(-1));
  const Variable kt = transpose(k, -2, -1);  // [..., d, Tk]
  std::vector<Variable> blocks;
  for (std::int64_t i0 = 0; i0 < tq; i0 += kBlockRows) {
    const std::int64_t rows = std::min(kBlockRows, tq - i0);
    const std::int64_t keys = std::min(tk, i0 + rows + shift);  // row i0 + rows - 1 sees keys <= it + shift
    const Variable s = matmul(narrow(q, -2, i0, rows), narrow(kt, -1, 0, keys));  // [..., rows, keys]
    // row r of the block is query i0 + r: it attends keys j <= r + (i0 + shift)
    const Variable p = masked_softmax(s, scale_factor, Tensor(), true, i0 + shift);
    blocks.push_back(matmul(p, narrow(v, -2, 0, keys)));  // [..., rows, dv]
  }
  return blocks.size() == 1 ? blocks[0] : cat(blocks, -2);
}

// Whether block_causal_core applies and pays: causal alone, rows to split.
bool block_causal_applies(const Variable& q, const Variable& k, const AttentionSpec& spec) {
  if (!spec.causal || spec.mask.defined() || q.dim() < 2) return false;
  // windows, caps and sinks: the composed attention_core has them
  if (spec.window.enabled() || spec.softcap > 0.0 || spec.sinks.defined()) return false;
  const std::int64_t tq = q.size(-2), tk = k.size(-2);
  return spec.causal_shift(tq, tk) >= 0 && tq >= 2 * kBlockRows;
}

class Batched final : public Attention {
 public:
  PluginInfo info() const override {
    PluginInfo i;
    i.name = "batched";
    i.version = "1.0.0";
    i.description = "split, transpose, batched core, transpose back, merge";
    auto& c = i.capabilities;
    c.mha = c.core = c.causal = c.bool_mask = c.cross_lengths = c.grouped_kv = c.rope = c.rope_level = true;
    c.bias = true;  // batched_mha adds MhaWeights' biases to the projections
    c.qk_norm = c.cross_attention = true;  // batched_mha: the gains and x_kv around the core
    c.window = c.softcap = c.sinks = true;  // attention_core: window mask, softcap op, sink column
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
    const Variable qr = rope_queries(q, spec);
    const Variable kw = expand_kv_heads(rope_keys(k, spec), group), vw = expand_kv_heads(v, group);
    if (block_causal_applies(qr, kw, spec)) return block_causal_core(qr, kw, vw, spec);
    return attention_core(qr, kw, vw, spec);
  }
};

}  // namespace

HEADGRAD_PLUGIN(Batched)
