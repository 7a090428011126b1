// shadow: declares the name of a real plugin, per_head. Searched first (its
// folder comes before headgrad's own), it wins the name, and the real
// per_head is the one rejected, naming this file; headgrad run says which
// file shadows which. It is a correct implementation (the engine's batched
// layer around the composed core) so that a suite run with it still passes.
//
// Shape legend: T sequence, D model width, Tq/Tk query/key lengths, d head
// width, [...] leading dims.
#include <headgrad/plugin.hpp>

namespace {

using namespace headgrad;

class Shadow final : public Attention {
 public:
  PluginInfo info() const override {
    PluginInfo i;
    i.name = "per_head";
    i.version = "0.0.1-shadow";
    i.description = "test plugin: takes per_head's name";
    Capabilities& c = i.capabilities;
    c.mha = c.core = c.causal = c.bool_mask = c.cross_lengths = c.grouped_kv = c.rope = c.rope_level = c.bias = true;  // batched_mha takes the biases
    c.qk_norm = c.cross_attention = true;  // batched_mha takes the gains and x_kv
    c.window = c.softcap = c.sinks = true;  // attention_core has them
    c.extra = {"bfloat16", "float16"};  // as the real per_head declares
    return i;
  }

  // x [..., T, D] -> [..., T, D]
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    return batched_mha(x, w, spec, attention_core);
  }
  // x [..., T, d]: the engine's rotation
  Variable rope_forward(const Variable& x, const RopeSpec& spec) const override { return rope(x, spec); }
  // q [..., H, Tq, d], k [..., Hkv, Tk, d], v [..., Hkv, Tk, dv] -> [..., H, Tq, dv]
  Variable core_forward(const Variable& q, const Variable& k, const Variable& v,
                        const AttentionSpec& spec) const override {
    const std::int64_t group = kv_group(q, k, v, "shadow");  // it declares grouped_kv
    return attention_core(rope_queries(q, spec), expand_kv_heads(rope_keys(k, spec), group),
                          expand_kv_heads(v, group), without_rope(spec));
  }
};

}  // namespace

HEADGRAD_PLUGIN(Shadow)
