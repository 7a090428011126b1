// Shared by the misbehaving test plugins: a correct attention to fall back
// on, and the info every one of them declares.
//
// Shape legend: B batch, T sequence, D model width, H heads, d = D / H;
// Tq/Tk query/key lengths.
#pragma once

#include "../plugins/one_unit.hpp"

namespace runner_test {

using namespace headgrad;

inline PluginInfo test_info(const char* name, const char* description) {
  PluginInfo i;
  i.name = name;
  i.version = "0.0.1";
  i.description = description;
  auto& c = i.capabilities;
  c.mha = c.core = c.causal = c.bool_mask = c.cross_lengths = true;
  return i;
}

// x [B, T, D] -> [B, T, D]: split, core, merge, project (batched's recipe).
inline Variable good_mha(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) {
  const Variable q = split_heads(linear(x, w.wq), spec.num_heads);
  const Variable k = split_heads(linear(x, w.wk), spec.num_heads);
  const Variable v = split_heads(linear(x, w.wv), spec.num_heads);
  return linear(merge_heads(attention_core(q, k, v, spec)), w.wo);
}

}  // namespace runner_test
