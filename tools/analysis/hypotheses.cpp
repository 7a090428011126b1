#include "analysis/hypotheses.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace headgrad::diagnosis {

namespace {

bool is(BugSet bug, Bug b) { return bug.has(b); }

// The name of the bugs, for messages.
std::string names_of(BugSet bug) {
  std::string s;
  for (Bug b : bug.bugs()) s += (s.empty() ? "" : " + ") + std::string(bug_info(b).name);
  return s;
}

double hypothesis_scale(const AttentionSpec& spec, std::int64_t d, BugSet bug) {
  if (is(bug, Bug::scale_one_over_d)) return 1.0 / static_cast<double>(d);
  if (is(bug, Bug::scale_model_dim))
    return 1.0 / std::sqrt(static_cast<double>(spec.d_model > 0 ? spec.d_model : d));
  if (is(bug, Bug::no_scale)) return 1.0;
  return spec.scale_for(d);
}

// Rolls dim 0 by one: item b takes item b+1's values.
Variable roll_batch(const Variable& p) {
  const std::int64_t n = p.size(0);
  if (n < 2) return p;
  return cat({narrow(p, 0, 1, n - 1), narrow(p, 0, 0, 1)}, 0);
}

// a [..., M, K] @ b [..., K, N] one term of K at a time, the running sum stored
// in the operands' dtype after each add: a 16-bit accumulator in 16 bits (in
// float32 and float64 the same sum as a matmul, to their rounding).
Variable matmul_narrow_accumulator(const Variable& a, const Variable& b) {
  Variable acc = mul(narrow(a, -1, 0, 1), narrow(b, -2, 0, 1));
  for (std::int64_t i = 1; i < a.size(-1); ++i) acc = add(acc, mul(narrow(a, -1, i, 1), narrow(b, -2, i, 1)));
  return acc;
}

// The soft-cap and the sinks as a hypothesis applies them: the cap C (0: none)
// on the scaled scores before any mask; sigma (undefined: no sinks) the sink
// logits, broadcastable to the scores' [..., Tq, 1], one softmax column each.
struct Extras {
  double cap = 0;
  Variable sigma;
  Tensor mask_without_window;  // window_ignored_in_backward: the mask its backward uses
};

// s's value with the gradient of `grad` (forward one thing, backward another).
Variable value_with_grad_of(const Variable& value, const Variable& grad) {
  return add(Variable(value.data()), sub(grad, Variable(grad.data())));
}

// The capped scores as `bug` caps them: raw = q k^T (unscaled).
Variable capped_scores(const Variable& raw, double factor, double cap, BugSet bug) {
  if (cap <= 0 || is(bug, Bug::softcap_ignored)) return scale(raw, factor);
  if (is(bug, Bug::softcap_before_scale)) return scale(softcap(raw, cap), factor);  // C tanh(q.k / C) * scale
  const Variable s = scale(raw, factor);
  if (is(bug, Bug::softcap_after_mask)) return s;  // capped after the mask
  if (is(bug, Bug::softcap_wrong_formula)) {  // u tanh(u), u = s / C (tanh(u) = 1 * tanh(u / 1))
    const Variable u = scale(s, 1.0 / cap);
    return mul(u, softcap(u, 1.0));
  }
  if (is(bug, Bug::softcap_missing_in_backward)) return value_with_grad_of(softcap(s, cap), s);  // ds = dc
  return softcap(s, cap);
}

// x [..., Tq, Tk] -> [..., Tq, 1]: each row's largest value (-inf when all are).
Tensor row_max(const Tensor& x) {
  const std::int64_t n = x.size(-1), rows = x.numel() / n;
  const std::vector<double> v = x.contiguous().to_vector();
  std::vector<double> m(static_cast<std::size_t>(rows), -INFINITY);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < n; ++j) {
      double& best = m[static_cast<std::size_t>(r)];
      best = std::max(best, v[static_cast<std::size_t>(r * n + j)]);
    }
  Shape shape = x.shape();
  shape.back() = 1;
  return Tensor::from_values(m, shape, x.dtype());
}

// x with each `from` replaced by `to`.
Tensor replace_value(const Tensor& x, double from, double to) {
  std::vector<double> v = x.contiguous().to_vector();
  for (double& e : v) e = e == from ? to : e;
  return Tensor::from_values(v, x.shape(), x.dtype());
}

// sink_per_tile: how many key tiles [t kKeyTile, (t + 1) kKeyTile) hold a key
// row i attends (at least 1: a row with none still has its one sink), per row
// of the mask ([..., Tq, 1]; undefined mask: every key, ceil(Tk / kKeyTile)).
Tensor tiles_read(const Tensor& mask, std::int64_t tq, std::int64_t tk) {
  Shape shape = mask.defined() ? mask.shape() : Shape{tq, tk};
  shape.back() = 1;
  const std::int64_t rows = mask.defined() ? mask.numel() / tk : tq;
  const std::vector<double> m = mask.defined() ? mask.contiguous().to_vector() : std::vector<double>{};
  std::vector<double> out(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t tiles = 0;
    for (std::int64_t j0 = 0; j0 < tk; j0 += kKeyTile) {
      bool reads = m.empty();
      for (std::int64_t j = j0; j < std::min(tk, j0 + kKeyTile) && !reads; ++j) reads = m[static_cast<std::size_t>(r * tk + j)] != 0;
      tiles += reads ? 1 : 0;
    }
    out[static_cast<std::size_t>(r)] = static_cast<double>(std::max<std::int64_t>(tiles, 1));
  }
  return Tensor::from_values(out, shape, DType::float64);
}

// One head: q [N, Tq, d], k [N, Tk, d], v [N, Tk, dv]; mask broadcast to [N, Tq, Tk].
Variable attend(const Variable& q, const Variable& k_in, const Variable& v_in, const Tensor& mask,
                double factor, BugSet bug, const Extras& extras = {}) {
  const bool swapped = is(bug, Bug::kv_swapped);
  const Variable& k = swapped ? v_in : k_in;
  const Variable& v = swapped ? k_in : v_in;
  const bool narrow_acc = is(bug, Bug::fp16_accumulator);
  const Variable kt = transpose(k, -2, -1);
  const Variable raw = narrow_acc ? matmul_narrow_accumulator(q, kt) : matmul(q, kt);
  Variable s = capped_scores(raw, factor, extras.cap, bug);  // C tanh(s / C), before the mask
  const double fill = is(bug, Bug::mask_fill_finite) ? -1e4 : -INFINITY;
  const Variable unmasked = s;
  if (mask.defined()) s = masked_fill(s, logical_not(mask), fill);
  if (extras.cap > 0 && is(bug, Bug::softcap_after_mask)) s = softcap(s, extras.cap);  // -inf becomes -C
  const std::int64_t tk = s.size(-1);
  Shape column = s.shape();
  column.back() = 1;
  if (extras.sigma.defined() && is(bug, Bug::sink_not_in_max)) {
    // The keys' max m alone, -inf on a row with every key masked (a constant:
    // the softmax does not depend on it); the keys' exps guarded at m = 0 there,
    // the sink's exp(sigma - m) not: l = inf, out 0 and d out / d sigma = 0 * inf.
    const Tensor m = row_max(s.data());
    const Variable e = exp(sub(s, Variable(replace_value(m, -INFINITY, 0.0))));
    const Variable sink = exp(sub(expand(cast(extras.sigma, s.dtype()), column), Variable(m)));
    return div(matmul(e, v), add(sum(e, -1, true), sink));
  }
  Extras ex = extras;
  if (ex.sigma.defined() && is(bug, Bug::sink_per_tile)) {
    // The forward counts the sink once per key tile the row reads (n of them):
    // sigma_h + ln n. The backward takes one sink's weight, exp(sigma_h - L) =
    // P_sink / n, for dsinks: the gradient of sigma_h / n.
    const Variable n(tiles_read(mask, s.size(-2), tk).to(s.dtype()));
    const Variable sigma = expand(cast(ex.sigma, s.dtype()), column);
    ex.sigma = add(value_with_grad_of(sigma, div(sigma, n)), log(n));
  }
  // the softmax over the keys, with sigma as one more key with no value
  const auto weights = [&](const Variable& scores, const Variable& sigma) {
    return sigma.defined() ? softmax(cat({scores, expand(cast(sigma, scores.dtype()), column)}, -1), -1)
                           : softmax(scores, -1);
  };
  if (ex.mask_without_window.defined()) {
    // window_ignored_in_backward: out is the windowed attention O; the backward
    // takes P' = exp(c - L) (L the windowed log-sum-exp, a constant here) over
    // the keys causal and the mask allow, window or not: dv = P'^T dO and
    // dc = P' (dP' - D), D = dO . O: the gradient of P' v - O (sum_j P') at the value O.
    const Variable pw = weights(s, ex.sigma);
    const Variable o = matmul(narrow(pw, -1, 0, tk), v);
    Variable lse = log(sum(exp(Variable(s.data())), -1, true));
    if (ex.sigma.defined())
      lse = log(add(sum(exp(Variable(s.data())), -1, true), exp(expand(cast(Variable(ex.sigma.data()), s.dtype()), column))));
    else  // a row with no key (L = -inf) is skipped by the backward: L = +inf makes its P' 0
      lse = Variable(replace_value(lse.data(), -INFINITY, INFINITY));
    const Variable p_bw = exp(sub(masked_fill(unmasked, logical_not(ex.mask_without_window), -INFINITY), lse));
    const Variable o_const(o.data());
    const Variable grads = sub(matmul(p_bw, v), mul(o_const, sum(p_bw, -1, true)));
    Variable out = value_with_grad_of(o, grads);
    if (ex.sigma.defined()) {  // dsinks as the correct attention has it (the backward's D pass)
      const Variable sink_only = matmul(narrow(weights(Variable(s.data()), ex.sigma), -1, 0, tk), Variable(v.data()));
      out = add(out, sub(sink_only, Variable(sink_only.data())));
    }
    return out;
  }
  if (ex.sigma.defined()) {  // sigma as one more key with no value: in the softmax, not in P V
    const Variable p = weights(s, ex.sigma);
    Variable o = matmul(narrow(p, -1, 0, tk), v);
    if (is(bug, Bug::sink_with_value)) o = add(o, mul(narrow(p, -1, tk, 1), narrow(v, -2, 0, 1)));  // + P_sink v_0
    return o;
  }
  Variable p;
  if (is(bug, Bug::softmax_no_max_subtraction)) {  // exp(s) / sum(exp(s)) over the keys
    const Variable e = exp(s);
    p = div(e, sum(e, -1, true));
  } else {
    p = softmax(s, is(bug, Bug::softmax_over_queries) ? -2 : -1);
  }
  if (is(bug, Bug::batch_mixing)) p = roll_batch(p);
  return narrow_acc ? matmul_narrow_accumulator(p, v) : matmul(p, v);
}

// x W^T + b (b undefined: no bias); the bug transposes W only.
Variable project(const Variable& x, const Variable& w, const Variable& b, BugSet bug) {
  const Variable y = is(bug, Bug::weights_not_transposed) ? matmul(x, w) : linear(x, w);
  return b.defined() ? add(y, b) : y;
}

// Head h's slice of a projection P [B, T, D], as the hypothesis lays heads out.
Variable head_slice(const Variable& p, std::int64_t h, std::int64_t heads, BugSet bug) {
  const std::int64_t b = p.size(0), t = p.size(1), dm = p.size(2), d = dm / heads;
  if (is(bug, Bug::split_without_transpose))  // the flat buffer cut as [B, H, T, d]
    return reshape(narrow(reshape(p, {b, heads, t, d}), 1, h, 1), {b, t, d});
  if (is(bug, Bug::interleaved_head_slices))  // features h, h+H, ...
    return reshape(narrow(reshape(p, {b, t, d, heads}), 3, h, 1), {b, t, d});
  return narrow(p, 2, h * d, d);
}

// Heads' outputs o_h [B, T, d] back to [B, T, D], as the hypothesis merges them.
Variable merge(const std::vector<Variable>& heads, BugSet bug) {
  const std::int64_t b = heads[0].size(0), t = heads[0].size(1), d = heads[0].size(2);
  const std::int64_t dm = d * static_cast<std::int64_t>(heads.size());
  if (is(bug, Bug::merge_without_transpose)) return reshape(stack(heads, 1), {b, t, dm});
  if (is(bug, Bug::interleaved_head_slices)) return reshape(stack(heads, 3), {b, t, dm});
  return cat(heads, 2);
}

// The kv head query head h reads, as the hypothesis maps them (G = H / Hkv).
std::int64_t kv_head_of(std::int64_t h, std::int64_t heads, std::int64_t kv_heads, BugSet bug) {
  const std::int64_t group = heads / kv_heads;
  // G = 1: no grouping, so no mapping to get wrong (a kernel takes its grouped
  // path only when G > 1, as the catalog's needs_group says).
  if (group == 1) return h;
  if (is(bug, Bug::kv_map_tile)) return h % kv_heads;
  // h / Hkv runs past the last kv head when G > Hkv: a gather that clamps the
  // index (JAX's, an unchecked kernel's) reads the last one
  if (is(bug, Bug::kv_group_wrong_divisor)) return std::min(h / kv_heads, kv_heads - 1);
  return h / group;
}

// The kv head j's slice of K or V as query head h (member g of its group) sees
// it: same values, but the gradient bugs change what reaches kv head j.
Variable kv_for_query_head(const Variable& kv, std::int64_t g, std::int64_t group, BugSet bug) {
  if (group == 1) return kv;
  const Variable constant(kv.data());  // the values without a path back to Wk, Wv
  if (is(bug, Bug::kv_grad_not_accumulated)) return g == 0 ? kv : constant;  // only member 0 counts
  if (is(bug, Bug::kv_grad_averaged))  // the value kv, the gradient kv / G from each of G members
    return add(scale(kv, 1.0 / static_cast<double>(group)),
               scale(constant, 1.0 - 1.0 / static_cast<double>(group)));
  return kv;
}

// k or v [..., Hkv, T, d] -> [..., H, T, d] (the core level), each query head
// h reading kv head kv_head_of(h) through kv_for_query_head: one head at a
// time, as hypothesis_mha does, not one repeat over the group.
Variable widen_kv_per_head(const Variable& kv, std::int64_t heads, BugSet bug) {
  const std::int64_t kv_heads = kv.size(-3), group = heads / kv_heads;
  std::vector<Variable> per_head;
  for (std::int64_t h = 0; h < heads; ++h) {
    const Variable kj = narrow(kv, -3, kv_head_of(h, heads, kv_heads, bug), 1);  // [..., 1, T, d]
    per_head.push_back(kv_for_query_head(kj, h % group, group, bug));
  }
  return cat(per_head, -3);
}


// ---- QK-norm and cross-attention, as the hypothesis does them ----

// Where in the pipeline a QK-norm runs: before RoPE (right) or after it (the bug).
enum class NormStage { before_rope, after_rope };

// The heads' slices of q (or k), [B, T, d] each, after QK-norm as the
// definition has it: x / sqrt(mean(x^2) + eps) * g, mean over each head's d
// (axis head) or over every head of the token together (axis model); g = w or
// 1 + w, read per dim: one [d] gain for every head (axis head) or head h's
// d entries of [H*d] (axis model). The bugs change one piece each: skipped,
// k left out, the statistics of the other axis, the convention, the eps, the stage.
std::vector<Variable> qk_normed_as(std::vector<Variable> heads, const Variable& gain, const AttentionSpec& spec,
                                   BugSet bug, bool keys, NormStage stage) {
  const QkNormSpec& n = spec.qk_norm;
  if (!n.enabled || is(bug, Bug::qk_norm_ignored) || (keys && is(bug, Bug::qk_norm_missing_on_k))) return heads;
  if ((stage == NormStage::after_rope) != is(bug, Bug::qk_norm_after_rope)) return heads;
  const DType dt = heads.front().dtype();
  const std::int64_t d = heads.front().size(-1);
  const bool gain_per_head = n.axis == QkNormAxis::model;  // the gain's layout follows the axis asked for
  const bool model_stats = (n.axis == QkNormAxis::model) != is(bug, Bug::qk_norm_axis_swapped);
  const bool one_plus_w = (n.gain == QkNormGain::one_plus_w) != is(bug, Bug::qk_norm_gain_convention);
  const double eps = is(bug, Bug::qk_norm_eps) ? 1e-5 : n.eps;
  const Variable eps_t(Tensor::scalar(eps, dt));
  // 1 / rms of a list of slices taken together
  auto inv_rms = [&](const std::vector<Variable>& parts) {
    Variable squares;
    for (const Variable& p : parts) {
      const Variable sq = sum(mul(p, p), -1, true);
      squares = squares.defined() ? add(squares, sq) : sq;
    }
    const double width = static_cast<double>(d * static_cast<std::int64_t>(parts.size()));
    return exp(scale(log(add(scale(squares, 1.0 / width), eps_t)), -0.5));
  };
  const Variable model_inv = model_stats ? inv_rms(heads) : Variable();
  for (std::size_t h = 0; h < heads.size(); ++h) {
    Variable g = gain_per_head ? narrow(gain, 0, static_cast<std::int64_t>(h) * d, d) : gain;
    if (one_plus_w) g = add(g, Variable(Tensor::scalar(1.0, dt)));
    heads[h] = mul(mul(heads[h], model_stats ? model_inv : inv_rms({heads[h]})), g);
  }
  return heads;
}

// The input k and v are projected from: x_kv [B, Tk, D] in cross-attention,
// unless the bug projects them from the queries' x.
Variable kv_input(const Variable& x3, const AttentionSpec& spec, BugSet bug) {
  if (!spec.x_kv.defined() || is(bug, Bug::cross_kv_from_queries)) return x3;
  return reshape(spec.x_kv, {-1, spec.x_kv.size(-2), spec.x_kv.size(-1)});
}

// ---- RoPE, as the hypothesis rotates (spec.rope on) ----

// r, the rotary width (0 in the spec means d).
std::int64_t rotary_width(const RopeSpec& r, std::int64_t d) { return r.rotary_dim > 0 ? r.rotary_dim : d; }

// A copy of q or k after the rotation for the case's taps (q_rot, k_rot), if it asked.
Variable tap(const AttentionSpec& spec, bool queries, const Variable& rotated) {
  if (spec.rope_taps) (queries ? spec.rope_taps->q_rot : spec.rope_taps->k_rot).push_back(rotated.data().clone());
  return rotated;
}

// The spec without a tap sink: v rotated by rope_on_v is no tap.
AttentionSpec without_rope_taps(const AttentionSpec& spec) {
  AttentionSpec s = spec;
  s.rope_taps = nullptr;
  return s;
}

// x [..., d] with the second member of each rotating pair negated (F, its own
// inverse): F R(phi) F = R(-phi), the rotation the other way round.
Variable flip_pair_seconds(const Variable& x, const RopeSpec& rope) {
  const std::int64_t d = x.size(-1), r = rotary_width(rope, d);
  Tensor f = Tensor::empty({d}, x.dtype());
  for (std::int64_t i = 0; i < d; ++i) {
    const bool second = i < r && (rope.style == RopeStyle::interleaved ? i % 2 == 1 : i >= r / 2);
    f.set({i}, second ? -1.0 : 1.0);
  }
  return mul(x, Variable(f));
}

// The HF permutation on the last dim, between the pairings: rotating in
// `style` equals rotating P x in the other style and permuting back (P^-1).
// Applied to q = x Wq^T per head it is Wq's rows permuted, so the hypothesis
// of a swapped pairing is the correct attention re-run with Wq, Wk permuted.
// from_half: P takes the half layout [s*r/2 + p] to the interleaved [2p + s].
Variable permute_pairing(const Variable& x, std::int64_t r, bool from_half) {
  const std::int64_t d = x.size(-1);
  Shape lead(x.shape().begin(), x.shape().end() - 1);
  Shape split = lead, flat = lead;
  split.push_back(from_half ? 2 : r / 2);
  split.push_back(from_half ? r / 2 : 2);
  flat.push_back(r);
  const Variable rot = reshape(transpose(reshape(narrow(x, -1, 0, r), split), -1, -2), flat);
  return r == d ? rot : cat({rot, narrow(x, -1, r, d - r)}, -1);
}

// x [..., T, d] rotated with angles and cos/sin tables built in float32 (w_k,
// phi = p * w_k, cos, sin), as popular float32 code does, then applied in x's
// dtype: out = x * C + partner(x) * S, partner swapping the two members of
// each pair, S = -sin on the first member and +sin on the second.
Variable rotate_float32_tables(const Variable& x, const RopeSpec& rope, std::int64_t q_shift) {
  const std::int64_t t = x.size(-2), d = x.size(-1), r = rotary_width(rope, d), half = r / 2;
  std::vector<double> pos;
  if (rope.positions.defined()) pos = rope.positions.to_vector();
  else
    for (std::int64_t i = 0; i < t; ++i) pos.push_back(static_cast<double>(rope.offset + i));
  const std::int64_t rows = static_cast<std::int64_t>(pos.size()) / t;
  std::vector<double> c(pos.size() * static_cast<std::size_t>(d), 1.0), sn(c.size(), 0.0);
  for (std::size_t i = 0; i < pos.size(); ++i) {
    const float p = static_cast<float>(pos[i] + static_cast<double>(q_shift));
    for (std::int64_t k = 0; k < half; ++k) {
      const float w = std::pow(static_cast<float>(rope.theta), -2.0f * static_cast<float>(k) / static_cast<float>(r));
      const float phi = p * w;
      const std::int64_t a = rope.style == RopeStyle::interleaved ? 2 * k : k;
      const std::int64_t b = rope.style == RopeStyle::interleaved ? 2 * k + 1 : k + half;
      const std::size_t at = i * static_cast<std::size_t>(d);
      c[at + a] = c[at + b] = std::cos(phi);
      sn[at + a] = -std::sin(phi);
      sn[at + b] = std::sin(phi);
    }
  }
  // [rows, 1.., T, d]: a positions row per first dim of x (rope()'s alignment)
  Shape shape{t, d};
  if (rows > 1) {
    shape.assign(static_cast<std::size_t>(x.dim() - 2), 1);
    shape[0] = rows;
    shape.push_back(t);
    shape.push_back(d);
  }
  const Variable cos_t(Tensor::from_values(c, shape, x.dtype()));
  const Variable sin_t(Tensor::from_values(sn, shape, x.dtype()));
  std::vector<Variable> partner;
  if (rope.style == RopeStyle::half) {
    partner = {narrow(x, -1, half, half), narrow(x, -1, 0, half)};
  } else {
    Shape pairs(x.shape().begin(), x.shape().end() - 1), flat = pairs;
    pairs.push_back(half);
    pairs.push_back(2);
    flat.push_back(r);
    const Variable p2 = reshape(narrow(x, -1, 0, r), pairs);
    partner = {reshape(cat({narrow(p2, -1, 1, 1), narrow(p2, -1, 0, 1)}, -1), flat)};
  }
  if (r < d) partner.push_back(narrow(x, -1, r, d - r));
  return add(mul(x, cos_t), mul(cat(partner, -1), sin_t));
}

// rope_positions_wrong_axis: head i (of q, or kv head i of k) rotates at
// positions row i mod P in every batch row, as [T]; other bugs keep the spec.
AttentionSpec positions_of_head(const AttentionSpec& spec, std::int64_t i, BugSet bug) {
  const Tensor& p = spec.rope.positions;
  if (!is(bug, Bug::rope_positions_wrong_axis) || !p.defined() || p.dim() != 2) return spec;
  AttentionSpec s = spec;
  s.rope.positions = p.narrow(0, i % p.size(0), 1).reshape({p.size(1)}).clone();
  return s;
}

// q or k of one head [B, T, d] (core level: [..., T, d]) rotated as `bug`
// rotates it. Keys sit at the positions, queries there plus q_offset.
Variable rope_as(const Variable& x, const AttentionSpec& spec, bool queries, BugSet bug) {
  if (is(bug, Bug::rope_missing_on_k) && !queries) return x;
  const std::int64_t base = queries ? spec.rope.q_offset : 0;
  AttentionSpec s = spec;
  s.rope_taps = nullptr;  // tapped here, once
  if (is(bug, Bug::rope_wrong_theta)) s.rope.theta = 10000.0;
  // theta^(-k/r) = sqrt(theta)^(-2k/r)
  if (is(bug, Bug::rope_freq_exponent)) s.rope.theta = std::sqrt(spec.rope.theta);
  if (is(bug, Bug::rope_positions_ignored)) {
    s.rope.positions = Tensor();
    s.rope.offset = 0;
  }
  // rope_queries rotates at the positions + q_offset: any extra shift rides on it
  auto at = [&](const Variable& v, std::int64_t shift) {
    s.rope.q_offset = base + shift;
    return rope_queries(v, s);
  };
  const std::int64_t r = rotary_width(spec.rope, x.size(-1));
  Variable out;
  if (is(bug, Bug::rope_positions_wrong_axis) && x.dim() >= 4) {  // [B, H, .., T, d]: per head slice
    std::vector<Variable> slices;
    for (std::int64_t i = 0; i < x.size(1); ++i) {
      AttentionSpec head = positions_of_head(s, i, bug);
      head.rope.q_offset = base;
      slices.push_back(rope_queries(narrow(x, 1, i, 1), head));
    }
    out = cat(slices, 1);
  } else if (is(bug, Bug::rope_position_shift)) {
    out = at(x, 1);
  } else if (is(bug, Bug::rope_qk_offset_mismatch)) {
    out = at(x, queries ? 0 : 1);
  } else if (is(bug, Bug::rope_sign_flipped)) {
    out = flip_pair_seconds(at(flip_pair_seconds(x, spec.rope), 0), spec.rope);
  } else if (is(bug, Bug::rope_backward_not_transposed)) {
    // the value of R x; the gradient of F R F x = R^T x, which is R dy
    const Variable reverse = flip_pair_seconds(at(flip_pair_seconds(x, spec.rope), 0), spec.rope);
    out = add(Variable(at(x, 0).data()), sub(reverse, Variable(reverse.data())));
  } else if (is(bug, Bug::rope_tables_float32)) {
    out = rotate_float32_tables(x, spec.rope, base);
  } else if (is(bug, Bug::rope_partial_wrong_span)) {
    const std::int64_t d = x.size(-1);
    s.rope.rotary_dim = 0;
    out = r == d ? at(x, 0) : cat({narrow(x, -1, 0, d - r), at(narrow(x, -1, d - r, r), 0)}, -1);
  } else if (is(bug, Bug::rope_style_swapped)) {
    const bool half = spec.rope.style == RopeStyle::half;  // the side rotates in the other style
    out = permute_pairing(at(permute_pairing(x, r, !half), 0), r, half);
  } else {
    out = at(x, 0);
  }
  return tap(spec, queries, out);
}

// q or k [B, T, n*d] rotated as one vector before the head split
// (rope_before_head_split): pairs and frequencies over n*r.
Variable rope_whole_width(const Variable& p, const AttentionSpec& spec, bool queries, std::int64_t n) {
  AttentionSpec s = spec;
  s.rope_taps = nullptr;
  s.rope.rotary_dim = rotary_width(spec.rope, spec.head_dim()) * n;
  return queries ? rope_queries(p, s) : rope_keys(p, s);
}

// The rows of [wq; wk; wv] (packed blocked, q | k | v) that a per-head split
// reads as head h's q, k, v: kv group j owns rows [j (G+2) d, (j+1) (G+2) d),
// its G query heads first, then k_j, then v_j (GPT-NeoX's order at G = 1).
// reverse: the rows packed per kv group that a blocked split reads as q, k, v
// (the first H d rows, the next Hkv d, the last Hkv d).
MhaWeights repack_qkv(const MhaWeights& w, const AttentionSpec& spec, bool reverse) {
  const std::int64_t heads = spec.num_heads, kv = spec.kv_heads(), d = w.wq.size(0) / heads;
  const std::int64_t group = heads / kv, rows = w.wq.size(0) + 2 * w.wk.size(0);
  // the weights' rows, and the biases' entries with them (a packed projection packs its bias alike)
  auto repack = [&](const Variable& a, const Variable& b, const Variable& c) {
    if (reverse) {
      std::vector<Variable> packed;
      for (std::int64_t j = 0; j < kv; ++j) {
        packed.push_back(narrow(a, 0, j * group * d, group * d));
        packed.push_back(narrow(b, 0, j * d, d));
        packed.push_back(narrow(c, 0, j * d, d));
      }
      const Variable p = cat(packed, 0);
      return std::array<Variable, 3>{narrow(p, 0, 0, heads * d), narrow(p, 0, heads * d, kv * d),
                                     narrow(p, 0, (heads + kv) * d, kv * d)};
    }
    const Variable packed = cat({a, b, c}, 0);
    if (packed.size(0) != rows) throw std::logic_error("repack: packed rows do not add up");
    std::vector<Variable> q, k, v;
    for (std::int64_t j = 0; j < kv; ++j) {
      const std::int64_t base = j * (group + 2) * d;
      for (std::int64_t g = 0; g < group; ++g) q.push_back(narrow(packed, 0, base + g * d, d));
      k.push_back(narrow(packed, 0, base + group * d, d));
      v.push_back(narrow(packed, 0, base + (group + 1) * d, d));
    }
    return std::array<Variable, 3>{cat(q, 0), cat(k, 0), cat(v, 0)};
  };
  const auto [wq, wk, wv] = repack(w.wq, w.wk, w.wv);
  MhaWeights out{wq, wk, wv, w.wo};
  if (w.has_bias()) {
    const auto [bq, bk, bv] = repack(w.bq, w.bk, w.bv);
    out.bq = bq, out.bk = bk, out.bv = bv, out.bo = w.bo;
  }
  return out;
}

// window_by_position: query i at RoPE position P_q(i), key j at P_k(j) (the
// case's positions, or offset + t; queries plus q_offset), and key j in the
// window when P_q(i) - left <= P_k(j) <= P_q(i) + right, whatever the indices.
// Positions [T] give [Tq, Tk]; per-row positions [R, T] give [R, 1, Tq, Tk].
Tensor window_on_positions(const AttentionSpec& spec, std::int64_t tq, std::int64_t tk,
                           std::optional<std::int64_t> left, std::optional<std::int64_t> right) {
  const RopeSpec& r = spec.rope;
  const bool given = r.positions.defined();
  if (given && (r.positions.dim() > 2 || r.positions.size(-1) != tq || tq != tk))
    throw std::invalid_argument("hypothesis window_by_position: positions " + shape_str(r.positions.shape()) +
                                " for Tq " + std::to_string(tq) + ", Tk " + std::to_string(tk) +
                                ": expected [T] or [B, T] with Tq = Tk = T");
  const std::int64_t rows = given && r.positions.dim() == 2 ? r.positions.size(0) : 1;
  const std::vector<double> p = given ? r.positions.contiguous().to_vector() : std::vector<double>{};
  const auto position = [&](std::int64_t row, std::int64_t t) {
    return given ? static_cast<std::int64_t>(p[static_cast<std::size_t>(row * tk + t)]) : r.offset + t;
  };
  std::vector<double> values(static_cast<std::size_t>(rows * tq * tk));
  for (std::int64_t n = 0; n < rows; ++n)
    for (std::int64_t i = 0; i < tq; ++i)
      for (std::int64_t j = 0; j < tk; ++j) {
        const std::int64_t pq = position(n, i) + r.q_offset, pk = position(n, j);
        const bool in = (!left || pk >= pq - *left) && (!right || pk <= pq + *right);
        values[static_cast<std::size_t>((n * tq + i) * tk + j)] = in ? 1.0 : 0.0;
      }
  const Shape shape = rows > 1 || (given && r.positions.dim() == 2) ? Shape{rows, 1, tq, tk} : Shape{tq, tk};
  return Tensor::from_values(values, shape, DType::boolean);
}

// Two boolean masks broadcast against each other (aligned at the last dim),
// True where both are.
Tensor both_allow(const Tensor& a, const Tensor& b) {
  Shape shape(static_cast<std::size_t>(std::max(a.dim(), b.dim())), 1);
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const auto size_of = [&](const Tensor& t) {
      const std::int64_t at = t.dim() - static_cast<std::int64_t>(shape.size() - i);
      return at >= 0 ? t.size(at) : 1;
    };
    shape[i] = std::max(size_of(a), size_of(b));
  }
  const std::vector<double> av = a.expand(shape).contiguous().to_vector(), bv = b.expand(shape).contiguous().to_vector();
  std::vector<double> out(av.size());
  for (std::size_t i = 0; i < av.size(); ++i) out[i] = av[i] != 0 && bv[i] != 0 ? 1.0 : 0.0;
  return Tensor::from_values(out, shape, DType::boolean);
}

}  // namespace

// The mask as the hypothesis applies it, element by element from the
// definitions (docs/design.md, Conventions): query i attends key j when
// causal allows it (top-left j <= i; bottom-right j <= i + Tk - Tq) and the
// boolean mask, broadcast to [..., Tq, Tk], says True. Undefined when nothing
// is masked. Written apart from the engine's attention_mask and the mutants'
// mask, so that a hypothesis matching a mutant is two implementations agreeing.
Tensor hypothesis_mask(const AttentionSpec& spec, std::int64_t tq, std::int64_t tk, BugSet bug) {
  const bool causal = spec.causal && !is(bug, Bug::missing_causal_mask);
  const bool bottom_right =
      is(bug, Bug::causal_alignment) || spec.causal_alignment == CausalAlignment::bottom_right;
  const Tensor given = is(bug, Bug::mask_ignored) ? Tensor() : spec.mask;
  // The window: p_i - left <= j <= p_i + right, p_i = i + (Tk - Tq) under causal bottom_right, else i.
  const bool windowed = spec.window.enabled() && !is(bug, Bug::window_ignored);
  const bool anchored_bottom_right = bottom_right && !is(bug, Bug::window_anchor_top_left);  // the bug: p_i = i
  const std::int64_t offset = spec.causal && anchored_bottom_right ? tk - tq : 0;
  std::optional<std::int64_t> left = spec.window.left, right = spec.window.right;
  if (is(bug, Bug::window_off_by_one) && left) *left += 1;  // W + 1 keys
  // (W, W); with no left bound the copy is no window at all, which is window_ignored: named as that
  if (is(bug, Bug::window_both_sides) && left) right = left;
  auto window_allows = [&](std::int64_t i, std::int64_t j) {
    if (!windowed) return true;
    const std::int64_t p = i + offset;
    return (!left || j >= p - *left) && (!right || j <= p + *right);
  };
  if (windowed && is(bug, Bug::window_by_position) && spec.rope.enabled) {  // the same bounds on RoPE positions
    AttentionSpec rest = spec;
    rest.window = {};
    const Tensor others = hypothesis_mask(rest, tq, tk, bug);
    const Tensor by_position = window_on_positions(spec, tq, tk, left, right);
    return others.defined() ? both_allow(others, by_position) : by_position;
  }
  if (!causal && !given.defined() && !windowed) return Tensor();
  if (given.defined() && given.dtype() != DType::boolean)
    throw std::invalid_argument("hypothesis mask: the mask must be bool (True = attend), got " +
                                std::string(dtype_name(given.dtype())));
  const std::int64_t shift = bottom_right ? tk - tq : 0;
  auto causal_allows = [&](std::int64_t i, std::int64_t j) {
    if (!causal) return true;
    if (is(bug, Bug::causal_mask_excludes_diagonal)) return j < i;  // the diagonal left out
    if (is(bug, Bug::causal_mask_inverted)) return j >= i;          // future instead of past
    return j <= i + shift;
  };
  // The given mask's leading dims (any), its last two broadcast from 1 or Tq, Tk.
  Shape shape = given.defined() ? given.shape() : Shape{};
  while (shape.size() < 2) shape.insert(shape.begin(), 1);
  const std::int64_t mq = shape[shape.size() - 2], mk = shape[shape.size() - 1];
  if ((mq != 1 && mq != tq) || (mk != 1 && mk != tk))
    throw std::invalid_argument("hypothesis mask: mask " + shape_str(given.shape()) + " does not broadcast to [.., " +
                                std::to_string(tq) + ", " + std::to_string(tk) + "]");
  Shape out_shape(shape.begin(), shape.end() - 2);
  out_shape.push_back(tq);
  out_shape.push_back(tk);
  std::int64_t lead = 1;
  for (std::size_t i = 0; i + 2 < shape.size(); ++i) lead *= shape[i];
  const std::vector<double> m = given.defined() ? given.contiguous().to_vector() : std::vector<double>{};
  std::vector<double> values(static_cast<std::size_t>(lead * tq * tk));
  for (std::int64_t n = 0; n < lead; ++n)
    for (std::int64_t i = 0; i < tq; ++i)
      for (std::int64_t j = 0; j < tk; ++j) {
        bool attend = causal_allows(i, j) && window_allows(i, j);
        if (!m.empty()) attend = attend && m[static_cast<std::size_t>((n * mq + (mq == 1 ? 0 : i)) * mk + (mk == 1 ? 0 : j))] != 0;
        values[static_cast<std::size_t>((n * tq + i) * tk + j)] = attend ? 1.0 : 0.0;
      }
  return Tensor::from_values(values, out_shape, DType::boolean);
}

namespace {

// The cap and the sinks as `bug` reads them: query head h's sigma [1, 1, 1]
// (h < 0: every head's [H]), sigma_h read at h / G by sink_per_kv_head,
// times the scale by sink_scaled, without a gradient by sink_grad_missing,
// absent by sink_ignored.
Extras extras_of(const AttentionSpec& spec, std::int64_t h, std::int64_t group, double factor, BugSet bug) {
  Extras e;
  e.cap = spec.softcap;
  if (!spec.sinks.defined() || is(bug, Bug::sink_ignored)) return e;
  const Variable sinks = is(bug, Bug::sink_grad_missing) ? Variable(spec.sinks.data()) : spec.sinks;
  const std::int64_t heads = sinks.numel();
  const auto index = [&](std::int64_t head) { return is(bug, Bug::sink_per_kv_head) ? head / group : head; };
  Variable sigma;
  if (h >= 0) {
    sigma = reshape(narrow(sinks, 0, index(h), 1), {1, 1, 1});
  } else {
    std::vector<Variable> per;
    for (std::int64_t i = 0; i < heads; ++i) per.push_back(narrow(sinks, 0, index(i), 1));
    sigma = cat(per, 0);
  }
  e.sigma = is(bug, Bug::sink_scaled) ? scale(sigma, factor) : sigma;
  return e;
}

// window_ignored_in_backward: the mask its backward uses (causal and the mask
// without the window); undefined for every other bug or without a window.
Tensor window_free_mask(const AttentionSpec& spec, std::int64_t tq, std::int64_t tk, BugSet bug) {
  if (!is(bug, Bug::window_ignored_in_backward) || !spec.window.enabled()) return {};
  AttentionSpec without = spec;
  without.window = {};
  BugSet rest;
  for (Bug b : bug.bugs())
    if (b != Bug::window_ignored_in_backward) rest.add(b);
  const Tensor m = hypothesis_mask(without, tq, tk, rest);
  return m.defined() ? m : Tensor::from_values(std::vector<double>(static_cast<std::size_t>(tq * tk), 1.0), {tq, tk}, DType::boolean);
}

}  // namespace

Variable hypothesis_mha(const Variable& x, const MhaWeights& w_in, const AttentionSpec& spec_in,
                        BugSet bug) {
  const AttentionSpec spec = fold_rope_positions(spec_in, x.shape());
  // qkv_packing_mismatch (either direction) is the correct attention on repacked weights
  MhaWeights w = w_in;
  if (is(bug, Bug::qkv_packing_mismatch)) w = repack_qkv(w, spec, false);
  if (is(bug, Bug::qkv_packing_mismatch_reverse)) w = repack_qkv(w, spec, true);
  if (is(bug, Bug::qkv_packing_mismatch) || is(bug, Bug::qkv_packing_mismatch_reverse)) {
    BugSet rest;  // the rest of the set (a pair) on those weights
    for (Bug b : bug.bugs())
      if (b != Bug::qkv_packing_mismatch && b != Bug::qkv_packing_mismatch_reverse) rest.add(b);
    bug = rest;
  }
  const std::int64_t t = x.size(-2), dm = x.size(-1), heads = spec.num_heads;
  const std::int64_t kv_heads = spec.kv_heads(), group = heads / kv_heads;
  const std::int64_t d = spec.head_dim();
  // kv heads laid out like the query heads, unless the bug interleaves only them
  BugSet kv_layout = bug;
  if (is(bug, Bug::kv_interleaved_head_slices)) kv_layout.add(Bug::interleaved_head_slices);
  const Variable x3 = reshape(x, {-1, t, dm});
  const Variable kv3 = kv_input(x3, spec, bug);  // x3 unless cross-attention
  const std::int64_t tk = kv3.size(-2);
  Variable q = project(x3, w.wq, w.bq, bug), k = project(kv3, w.wk, w.bk, bug);
  const Variable v = project(kv3, w.wv, w.bv, bug);
  // RoPE per head after the split, unless the bug rotates the whole width first
  const bool whole = spec.rope.enabled && is(bug, Bug::rope_before_head_split);
  const bool per_head = spec.rope.enabled && !whole;
  if (whole) {
    q = rope_whole_width(q, spec, true, heads);
    k = rope_whole_width(k, spec, false, kv_heads);
  }
  std::vector<Variable> ks, vs;  // kv head j, normalized and rotated once
  for (std::int64_t j = 0; j < kv_heads; ++j) ks.push_back(head_slice(k, j, kv_heads, kv_layout));
  ks = qk_normed_as(ks, w.k_norm, spec, bug, true, NormStage::before_rope);
  for (std::int64_t j = 0; j < kv_heads; ++j) {
    const Variable kj = ks[static_cast<std::size_t>(j)], vj = head_slice(v, j, kv_heads, kv_layout);
    ks[static_cast<std::size_t>(j)] = per_head ? rope_as(kj, positions_of_head(spec, j, bug), false, bug) : kj;
    vs.push_back(per_head && is(bug, Bug::rope_on_v) ? rope_as(vj, without_rope_taps(spec), false, BugSet()) : vj);
  }
  ks = qk_normed_as(ks, w.k_norm, spec, bug, true, NormStage::after_rope);
  std::vector<Variable> qs;  // query head h, normalized and rotated
  for (std::int64_t h = 0; h < heads; ++h) qs.push_back(head_slice(q, h, heads, bug));
  qs = qk_normed_as(qs, w.q_norm, spec, bug, false, NormStage::before_rope);
  for (std::int64_t h = 0; h < heads; ++h)
    if (per_head) qs[static_cast<std::size_t>(h)] = rope_as(qs[static_cast<std::size_t>(h)], positions_of_head(spec, h, bug), true, bug);
  qs = qk_normed_as(qs, w.q_norm, spec, bug, false, NormStage::after_rope);
  AttentionSpec mask_spec = spec;
  if (spec.x_kv.defined() && is(bug, Bug::cross_causal)) mask_spec.causal = true;  // the decoder's mask kept
  const Tensor mask = hypothesis_mask(mask_spec, t, tk, bug);
  const double factor = hypothesis_scale(spec, d, bug);
  std::vector<Variable> outs;
  for (std::int64_t h = 0; h < heads; ++h) {
    Tensor m = mask;
    if (m.defined() && m.dim() >= 4)  // a [B, H, T, T] mask: this head's slice
      m = m.narrow(-3, m.size(-3) == 1 ? 0 : h, 1).squeeze(m.dim() - 3);
    const std::int64_t j = kv_head_of(h, heads, kv_heads, bug);
    if (j >= kv_heads)
      throw std::invalid_argument("hypothesis " + names_of(bug) + ": query head " +
                                  std::to_string(h) + " would read kv head " + std::to_string(j) + " of " +
                                  std::to_string(kv_heads));
    const Variable kh = kv_for_query_head(ks[static_cast<std::size_t>(j)], h % group, group, bug);
    const Variable vh = kv_for_query_head(vs[static_cast<std::size_t>(j)], h % group, group, bug);
    Extras extras = extras_of(spec, h, group, factor, bug);
    extras.mask_without_window = window_free_mask(mask_spec, t, tk, bug);
    if (extras.mask_without_window.defined() && extras.mask_without_window.dim() >= 4)
      extras.mask_without_window = extras.mask_without_window.narrow(-3, extras.mask_without_window.size(-3) == 1 ? 0 : h, 1)
                                       .squeeze(extras.mask_without_window.dim() - 3);
    outs.push_back(attend(qs[static_cast<std::size_t>(h)], kh, vh, m, factor, bug, extras));
  }
  const Variable merged = merge(outs, bug);
  if (is(bug, Bug::missing_output_projection)) return reshape(merged, x.shape());
  return reshape(project(merged, w.wo, w.bo, bug), x.shape());
}

Variable hypothesis_core(const Variable& q, const Variable& k, const Variable& v,
                         const AttentionSpec& spec, BugSet bug) {
  for (Bug b : bug.bugs())
    if (bug_info(b).visibility.mha_only)
      throw std::invalid_argument(std::string("bug '") + std::string(bug_info(b).name) + "' has no core-level form");
  const std::int64_t tq = q.size(-2), tk = k.size(-2);
  const Tensor mask = hypothesis_mask(spec, tq, tk, bug);
  // k, v with Hkv heads where q has H: query head h reads kv head h / G (widened
  // here one query head at a time, not with the engine's expand_kv_heads)
  const std::int64_t hq = q.dim() >= 3 ? q.size(-3) : 1, hk = k.dim() >= 3 ? k.size(-3) : 1;
  const std::int64_t hv = v.dim() >= 3 ? v.size(-3) : 1;
  if (hk < 1 || hv != hk || hq % hk != 0)
    throw std::invalid_argument("hypothesis: q " + shape_str(q.shape()) + ", k " + shape_str(k.shape()) + ", v " +
                                shape_str(v.shape()) + ": k and v need one head count that divides q's (dim -3)");
  const std::int64_t group = hq / hk;
  const bool rope = spec.rope.enabled;
  const Variable qr = rope ? rope_as(q, spec, true, bug) : q;
  const Variable kr = rope ? rope_as(k, spec, false, bug) : k;
  const Variable vr = rope && is(bug, Bug::rope_on_v) ? rope_as(v, without_rope_taps(spec), false, BugSet()) : v;
  const double factor = hypothesis_scale(spec, q.size(-1), bug);
  Extras extras = extras_of(spec, -1, group, factor, bug);
  if (extras.sigma.defined())  // [H] -> [H, 1, 1] against [..., H, Tq, Tk] ([1, 1] without a head dim)
    extras.sigma = q.dim() >= 3 ? reshape(extras.sigma, {hq, 1, 1}) : reshape(extras.sigma, {1, 1});
  extras.mask_without_window = window_free_mask(spec, tq, tk, bug);
  if (group > 1)
    return attend(qr, widen_kv_per_head(kr, hq, bug), widen_kv_per_head(vr, hq, bug), mask, factor, bug, extras);
  return attend(qr, kr, vr, mask, factor, bug, extras);
}

std::vector<std::int64_t> tile_to_repeat_heads(std::int64_t heads, std::int64_t kv_heads) {
  if (kv_heads < 1 || heads % kv_heads != 0)
    throw std::invalid_argument("tile_to_repeat_heads: H = " + std::to_string(heads) +
                                " is not a multiple of Hkv = " + std::to_string(kv_heads));
  const std::int64_t group = heads / kv_heads;
  std::vector<std::int64_t> order;
  for (std::int64_t h = 0; h < heads; ++h) order.push_back((h % kv_heads) * group + h / kv_heads);
  return order;
}

Tensor reorder_blocks(const Tensor& w, std::int64_t dim, std::int64_t block,
                      const std::vector<std::int64_t>& order) {
  if (block < 1 || w.size(dim) != block * static_cast<std::int64_t>(order.size()))
    throw std::invalid_argument("reorder_blocks: " + std::to_string(order.size()) + " blocks of " +
                                std::to_string(block) + " do not tile dim " + std::to_string(dim) + " of " +
                                shape_str(w.shape()));
  std::vector<Variable> blocks;
  for (std::int64_t b : order) blocks.push_back(Variable(w.narrow(dim, b * block, block)));
  return cat(blocks, dim).data();
}

Variable hypothesis_rope(const Variable& x, const RopeSpec& spec, BugSet bug) {
  for (Bug b : bug.bugs())
    if (!has_rope_level_form(bug_info(b)))
      throw std::invalid_argument(std::string("bug '") + std::string(bug_info(b).name) + "' has no rope-level form");
  AttentionSpec s;
  s.rope = spec;
  s.rope.enabled = true;
  s.rope.q_offset = 0;
  return rope_as(x, s, true, bug);  // one tensor, rotated as queries at offset 0
}

}  // namespace headgrad::diagnosis
