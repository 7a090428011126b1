// Shared by the plugins with bugs outside the catalog (tests/test_findings.cpp):
// their info, the correct pieces each bug is written into, the way a
// hand-written backward's mistake is put in without writing a custom op. They
// compile as one unit (../one_unit.hpp, meson.build).
//
// Shape legend: B batch, T sequence, D model width, H heads, d = D / H;
// Tq/Tk query/key lengths.
#pragma once

#include <cmath>
#include <string>

#include "../one_unit.hpp"

namespace uncatalogued {

using namespace headgrad;

// levels: "mha", "core" or "both"
inline PluginInfo info_of(const char* name, const char* description, const char* levels = "both") {
  PluginInfo i;
  i.name = name;
  i.version = "0.0.1";
  i.description = description;
  const std::string l = levels;
  i.capabilities.mha = l != "core";
  i.capabilities.core = l != "mha";
  i.capabilities.causal = i.capabilities.cross_lengths = true;
  return i;
}

// The value of x with `factor` times its gradient: what a backward that
// scales the gradient reaching x computes (x is unchanged in the forward).
inline Variable grad_times(const Variable& x, double factor) {
  return add(scale(x, factor), scale(Variable(x.data()), 1.0 - factor));
}

// The value of x with no gradient path back: a backward that drops it.
inline Variable no_grad(const Variable& x) { return Variable(x.data()); }

// q [B, H, Tq, d], k [B, H, Tk, d], v [B, H, Tk, dv]: the scaled, masked scores.
inline Variable scores(const Variable& q, const Variable& k, const AttentionSpec& spec) {
  Variable s = scale(matmul(q, transpose(k, -2, -1)), spec.scale_for(q.size(-1)));
  const Tensor mask = attention_mask(spec, q.size(-2), k.size(-2));
  return mask.defined() ? masked_fill(s, logical_not(mask), -INFINITY) : s;
}

// The projections, split into heads [B, H, T, d] (kv heads as many as H here).
struct Heads {
  Variable q, k, v;
};
inline Heads project(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) {
  return {split_heads(linear(x, w.wq), spec.num_heads), split_heads(linear(x, w.wk), spec.num_heads),
          split_heads(linear(x, w.wv), spec.num_heads)};
}

// o [B, H, T, d] -> out [B, T, D]
inline Variable finish(const Variable& o, const MhaWeights& w) { return linear(merge_heads(o), w.wo); }

// [B, H, T, d] with head h's slice taken from head order(h)
template <class Order>
Variable reorder_heads(const Variable& o, Order order) {
  std::vector<Variable> heads;
  for (std::int64_t h = 0; h < o.size(1); ++h) heads.push_back(narrow(o, 1, order(h, o.size(1)), 1));
  return cat(heads, 1);
}

}  // namespace uncatalogued
