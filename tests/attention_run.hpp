// Attention and its backward, run the way the runner runs a side: the
// inputs as fresh leaf variables holding the given tensors (so two runs on
// the same tensors share nothing), out = forward(...), loss = sum(out * R),
// backward. The one helper for the tests that need out and the gradients,
// at the core level (q, k, v) and the MHA level (x, Wq, Wk, Wv, Wo): plugins,
// the fused kernel, C plugins, hypotheses.
#pragma once

#include <cstdint>
#include <vector>

#include "headgrad/attention.hpp"
#include "headgrad/ops.hpp"

namespace headgrad::test {

struct CoreResult {
  Tensor out, dq, dk, dv;
  std::vector<Tensor> all() const { return {out, dq, dk, dv}; }
};

struct MhaResult {
  Tensor out, dx, dwq, dwk, dwv, dwo;
  std::vector<Tensor> all() const { return {out, dx, dwq, dwk, dwv, dwo}; }
};

// A causal MHA spec: D model width, H query heads, Hkv kv heads, d head width.
inline AttentionSpec causal_mha_spec(std::int64_t D, std::int64_t H, std::int64_t Hkv, std::int64_t d) {
  AttentionSpec spec;
  spec.d_model = D;
  spec.num_heads = H;
  spec.num_kv_heads = Hkv;
  spec.head_width = d;
  spec.causal = true;
  return spec;
}

namespace detail {

// A gradient that never reached its input reads as zeros, so a broken
// backward fails a comparison instead of throwing.
inline Tensor grad_or_zero(const Variable& x) {
  return x.grad().defined() ? x.grad() : Tensor::zeros(x.shape(), x.dtype());
}

// make_r(out) gives R.
template <class Forward, class MakeR>
CoreResult run_core_with(Forward&& forward, const Tensor& q, const Tensor& k, const Tensor& v,
                         MakeR&& make_r) {
  const Variable vq(q, true), vk(k, true), vv(v, true);
  const Variable out = forward(vq, vk, vv);
  sum(mul(out, Variable(make_r(out.data())))).backward();
  return {out.data(), grad_or_zero(vq), grad_or_zero(vk), grad_or_zero(vv)};
}

}  // namespace detail

// forward(Variable q, Variable k, Variable v) -> out, under R = r.
template <class Forward>
CoreResult run_core(Forward&& forward, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& r) {
  return detail::run_core_with(forward, q, k, v, [&](const Tensor&) { return r; });
}

// R drawn N(0, 1) in out's shape and dtype from Generator(r_seed).
template <class Forward>
CoreResult run_core(Forward&& forward, const Tensor& q, const Tensor& k, const Tensor& v, std::uint64_t r_seed) {
  return detail::run_core_with(forward, q, k, v, [&](const Tensor& out) {
    Generator gen(r_seed);
    return randn(out.shape(), out.dtype(), gen);
  });
}

// A plugin (headgrad::Attention, or anything with its core_forward and
// mha_forward) under spec. A template, so that this header needs no plugin.hpp.
template <class Plugin>
concept AttentionPlugin = requires(const Plugin& p, const Variable& x, const MhaWeights& w, const AttentionSpec& s) {
  p.core_forward(x, x, x, s);
  p.mha_forward(x, w, s);
};

template <AttentionPlugin Plugin>
CoreResult run_core(const Plugin& a, const Tensor& q, const Tensor& k, const Tensor& v, const AttentionSpec& spec,
                    const Tensor& r) {
  return run_core([&](const Variable& x, const Variable& y, const Variable& z) { return a.core_forward(x, y, z, spec); },
                  q, k, v, r);
}

template <AttentionPlugin Plugin>
CoreResult run_core(const Plugin& a, const Tensor& q, const Tensor& k, const Tensor& v, const AttentionSpec& spec,
                    std::uint64_t r_seed = 99) {
  return run_core([&](const Variable& x, const Variable& y, const Variable& z) { return a.core_forward(x, y, z, spec); },
                  q, k, v, r_seed);
}

// forward(Variable& x, MhaWeights& w) -> out, under R = r.
template <class Forward>
MhaResult run_mha(Forward&& forward, const Tensor& x, const Tensor& wq, const Tensor& wk, const Tensor& wv,
                  const Tensor& wo, const Tensor& r) {
  Variable vx(x, true);
  MhaWeights w{Variable(wq, true), Variable(wk, true), Variable(wv, true), Variable(wo, true)};
  const Variable out = forward(vx, w);
  sum(mul(out, Variable(r))).backward();
  using detail::grad_or_zero;
  return {out.data(), grad_or_zero(vx), grad_or_zero(w.wq), grad_or_zero(w.wk), grad_or_zero(w.wv),
          grad_or_zero(w.wo)};
}

template <AttentionPlugin Plugin>
MhaResult run_mha(const Plugin& a, const Tensor& x, const Tensor& wq, const Tensor& wk, const Tensor& wv,
                  const Tensor& wo, const AttentionSpec& spec, const Tensor& r) {
  return run_mha([&](const Variable& vx, const MhaWeights& w) { return a.mha_forward(vx, w, spec); },
                 x, wq, wk, wv, wo, r);
}

}  // namespace headgrad::test
