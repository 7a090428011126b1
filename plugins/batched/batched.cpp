// batched: all heads at once. Project, split [B, T, D] -> [B, H, T, d], one
// batched core, merge back (transpose first), project.
//
// Shape legend: B batch, T sequence, D model width, H heads, Hkv key/value
// heads, d = D / H.
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
    c.mha = c.core = c.causal = c.bool_mask = c.cross_lengths = c.grouped_kv = true;
    return i;
  }

  // x [..., T, D] -> [..., T, D]
  Variable mha_forward(const Variable& x, const MhaWeights& w,
                       const AttentionSpec& spec) const override {
    const std::int64_t t = x.size(-2), dm = x.size(-1);
    const std::int64_t h = spec.num_heads, hkv = spec.kv_heads();
    const Variable x3 = reshape(x, {-1, t, dm});               // [B, T, D]
    const Variable q = split_heads(linear(x3, w.wq), h);       // [B, H, T, d]
    Variable k = split_heads(linear(x3, w.wk), hkv);           // [B, Hkv, T, d]
    Variable v = split_heads(linear(x3, w.wv), hkv);
    if (hkv != h) {  // grouped KV heads: query head i reads key/value head i / (H / Hkv)
      k = repeat_interleave(k, h / hkv, 1);
      v = repeat_interleave(v, h / hkv, 1);
    }
    const Variable o = merge_heads(core_forward(q, k, v, spec));  // [B, T, D]
    return reshape(linear(o, w.wo), x.shape());
  }

  Variable core_forward(const Variable& q, const Variable& k, const Variable& v,
                        const AttentionSpec& spec) const override {
    return attention_core(q, k, v, spec);
  }
};

}  // namespace

HEADGRAD_PLUGIN(Batched)
