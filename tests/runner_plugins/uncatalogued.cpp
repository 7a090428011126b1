// uncatalogued_<bug>: an attention with one realistic bug that the bug
// catalog does not hold, chosen by the library it is linked into
// (uncatalogued_bug.cpp names it, as the mutants' bug.cpp does): the
// diagnosis must say that no known bug reproduces it rather than name one.
//   heads_reversed       heads merged in reverse order (head h's output lands in slot H-1-h)
//   wq_wk_swapped        q is projected with Wk and k with Wq
//   scale_after_softmax  softmax(q k^T), then the 1/sqrt(d) scale, then @ v
//
// Shape legend: B batch, T sequence, D model width, H heads, d = D / H;
// Tq/Tk query/key lengths.
#include <cmath>
#include <string>
#include <string_view>

#include "common.hpp"

extern "C" const char headgrad_uncatalogued_bug[];

namespace {

using namespace runner_test;

const std::string_view kBug = headgrad_uncatalogued_bug;

// [B, H, T, d] with the heads in reverse order.
Variable reverse_heads(const Variable& o) {
  std::vector<Variable> heads;
  for (std::int64_t h = o.size(1) - 1; h >= 0; --h) heads.push_back(narrow(o, 1, h, 1));
  return cat(heads, 1);
}

// q [B, H, Tq, d], k [B, H, Tk, d], v [B, H, Tk, dv] -> [B, H, Tq, dv]
Variable core(const Variable& q, const Variable& k, const Variable& v, const AttentionSpec& spec) {
  if (kBug != "scale_after_softmax") return attention_core(q, k, v, spec);
  Variable s = matmul(q, transpose(k, -2, -1));  // [B, H, Tq, Tk], unscaled
  const Tensor mask = attention_mask(spec, q.size(-2), k.size(-2));
  if (mask.defined()) s = masked_fill(s, logical_not(mask), -INFINITY);
  return matmul(scale(softmax(s, -1), spec.scale_for(q.size(-1))), v);  // BUG: scaled after the softmax
}

class Uncatalogued final : public Attention {
 public:
  PluginInfo info() const override {
    PluginInfo i = test_info("", "test plugin: a bug outside the catalog");
    i.name = "uncatalogued_" + std::string(kBug);
    return i;
  }
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    const bool swap = kBug == "wq_wk_swapped";
    const Variable q = split_heads(linear(x, swap ? w.wk : w.wq), spec.num_heads);  // BUG when swapped
    const Variable k = split_heads(linear(x, swap ? w.wq : w.wk), spec.num_heads);
    const Variable v = split_heads(linear(x, w.wv), spec.num_heads);
    Variable o = core(q, k, v, spec);                    // [B, H, T, d]
    if (kBug == "heads_reversed") o = reverse_heads(o);  // BUG
    return linear(merge_heads(o), w.wo);
  }
  Variable core_forward(const Variable& q, const Variable& k, const Variable& v,
                        const AttentionSpec& spec) const override {
    Variable o = core(q, k, v, spec);
    return kBug == "heads_reversed" ? reverse_heads(o) : o;  // BUG
  }
};

}  // namespace

HEADGRAD_PLUGIN(Uncatalogued)
