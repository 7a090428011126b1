// fused_sdpa: the attention core as one custom op with a hand-written forward
// and backward (FlashAttention-2 style, kernel.cpp), run with the kernel's
// default 128 x 128 tiles (256 x 256 from 2048 queries and keys up; 64 x 64
// with wide tiles for a narrow window: tiles_for), inside the batched split
// and merge of heads. Grouped KV heads reach the kernel unexpanded: its K/V
// memory is Hkv/H of the expanded one.
//
// Shape legend: B, T, D, H, Hkv as in plugin.hpp; [...] leading dims.
#include <algorithm>

#include <headgrad/plugin.hpp>

#include "kernel.hpp"

namespace {

using namespace headgrad;

// The kernel's default 128 x 128 tiles, or 256 x 256 once both lengths reach
// 2048: there the larger products pay more than the extra masked work of the
// larger diagonal tiles costs (process CPU time at (1,2048,512,8) f+b, float32:
// 279 against 298 ms; at T = 512, 128 x 128 stays ahead, 151-159 against
// 154-169 ms; docs/performance.md).
fused_sdpa::Tiles tiles_for(std::int64_t tq, std::int64_t tk, const AttentionSpec& spec) {
  fused_sdpa::Tiles t;
  if (tq >= 2048 && tk >= 2048) t.rows = t.keys = 256;
  // A window narrow against Tk (span W keys): 64 x 64 blocks with wide tiles.
  // A block of 64 query rows sees W + 63 keys, and a block of 64 keys is seen
  // by W + 63 rows; each is taken as ONE tile starting at the window's edge, so
  // a pass computes about (W + 63) / W of the window's scores in few, larger
  // products (Bc-aligned 128 x 128 tiles compute (W + 127 + alignment) / W of
  // them in three products per block). 1,4096,256,4 --level core --no-causal
  // --window 255, f+b process CPU time in one run: 87-93 ms against 101-111 ms
  // at 128 x 128 and 142-157 ms at 64 x 64 without wide tiles
  // (docs/performance.md). Capped at 1024 so that a tile stays in cache.
  const std::int64_t span = spec.window.left.value_or(tk) + (spec.causal ? 0 : spec.window.right.value_or(tk)) + 1;
  if (spec.window.enabled() && span * 8 <= tk) {
    t.rows = t.keys = 64;
    t.wide = std::min<std::int64_t>(span + 63, 1024);
  }
  return t;
}

class FusedSdpa final : public Attention {
 public:
  PluginInfo info() const override {
    PluginInfo i;
    i.name = "fused_sdpa";
    i.version = "1.0.0";
    i.description =
        "FlashAttention-2 style fused core: key tiles, online softmax, one log-sum-exp per row, "
        "memory O(T); fully masked rows give zeros";
    auto& c = i.capabilities;
    c.mha = c.core = c.causal = c.bool_mask = c.cross_lengths = true;
    c.float32 = c.float64 = c.dropout = c.grouped_kv = c.rope = c.rope_level = true;
    c.bias = true;  // batched_mha adds MhaWeights' biases to the projections
    c.qk_norm = c.cross_attention = true;  // batched_mha: the gains and x_kv around the core
    c.window = c.softcap = c.sinks = true;  // inside the kernel (kernel.cpp)
    c.extra = {"bfloat16", "float16"};  // 16-bit q, k, v with float32 accumulation
    return i;
  }

  // x [..., T, D] -> [..., T, D]: the batched split and merge around the fused
  // core, which reads grouped KV heads [B, Hkv, T, d] as they are.
  Variable mha_forward(const Variable& x, const MhaWeights& w,
                       const AttentionSpec& spec) const override {
    return batched_mha(
        x, w, spec,
        [this](const Variable& q, const Variable& k, const Variable& v, const AttentionSpec& s) {
          return core_forward(q, k, v, s);
        },
        KvHeads::grouped);
  }

  // x [..., T, d]: the engine's rotation, the one fused_sdpa applies before its kernel.
  Variable rope_forward(const Variable& x, const RopeSpec& spec) const override { return rope(x, spec); }

  // q [..., Tq, d], k [..., Tk, d], v [..., Tk, dv] -> [..., Tq, dv]; k, v
  // may have Hkv heads (dim -3) where q has H. RoPE, when asked for, rotates q
  // and k before the kernel (the rotation's backward is the engine's).
  Variable core_forward(const Variable& q, const Variable& k, const Variable& v,
                        const AttentionSpec& spec) const override {
    const Variable qr = rope_queries(q, spec), kr = rope_keys(k, spec);
    const fused_sdpa::Tiles tiles = tiles_for(q.size(-2), k.size(-2), spec);
    if (!is_16bit(q.dtype())) return fused_sdpa::sdpa(qr, kr, v, without_rope(spec), tiles);
    // 16-bit q, k, v (as the usual kernels take them): the float32 kernel on
    // their exact upcasts, so the scores, the softmax statistics, P V and every
    // product of the backward accumulate in float32; the output and dq, dk, dv
    // are rounded once to the storage type (cast's backward rounds them).
    const DType f32 = DType::float32;
    AttentionSpec s32 = without_rope(spec);
    if (s32.sinks.defined()) s32.sinks = cast(s32.sinks, f32);  // dsinks rounded back by cast's backward
    return cast(fused_sdpa::sdpa(cast(qr, f32), cast(kr, f32), cast(v, f32), s32, tiles), q.dtype());
  }
};

}  // namespace

HEADGRAD_PLUGIN(FusedSdpa)
