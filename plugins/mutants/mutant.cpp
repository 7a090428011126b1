// !! DELIBERATELY WRONG !! A batched attention with exactly one known bug,
// chosen by the library it is linked into (bug.cpp names it). Each bug is written the way
// people really write it; the line that differs from plugins/batched is marked
// BUG. These plugins exist so that configs/mutants.yaml can prove each bug
// class is caught and named. Never use them as a reference.
//
// Shape legend: B batch, T sequence, D model width, H (query) heads, Hkv kv
// heads, G = H / Hkv, d head width, r rotary width.
#include <headgrad/plugin.hpp>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

// The bug's catalog name (tools/analysis/bug_names.def), e.g. "kv_swapped":
// the one definition that differs between mutant libraries (bug.cpp).
extern "C" const char headgrad_mutant_bug[];

namespace {

using namespace headgrad;

const std::string_view kBug = headgrad_mutant_bug;

Tensor mutant_mask_without_window(const AttentionSpec& spec, std::int64_t tq, std::int64_t tk);
Tensor window_on_rope_positions(const AttentionSpec& spec, std::int64_t tq, std::int64_t tk);

// The window this mutant applies ([Tq, Tk] bool, or undefined), and the
// spec with its window taken out (so attention_mask does not add it again).
Tensor mutant_window(const AttentionSpec& spec, std::int64_t tq, std::int64_t tk) {
  AttentionSpec w = spec;
  if (kBug == "window_ignored" || !spec.window.enabled()) return {};  // BUG: spec.window never read
  if (kBug == "window_off_by_one" && w.window.left) *w.window.left += 1;  // BUG: W + 1 keys (kv_idx >= q_idx - W)
  if (kBug == "window_both_sides") w.window.right = w.window.left;  // BUG: window_size=(W, W), not (W, 0)
  if (kBug == "window_anchor_top_left") w.causal_alignment = CausalAlignment::top_left;  // BUG: p_i = i at a decode step
  if (kBug == "window_by_position" && spec.rope.enabled) return window_on_rope_positions(spec, tq, tk);
  return window_mask(w, tq, tk);
}

// BUG window_by_position: llama.cpp's is_masked_swa, the window on the positions
// the rotation reads: key at pos_k masked when pos_q - pos_k > left or pos_k -
// pos_q > right. [Tq, Tk], or [B, 1, Tq, Tk] for per-row positions [B, T].
Tensor window_on_rope_positions(const AttentionSpec& spec, std::int64_t tq, std::int64_t tk) {
  const RopeSpec& r = spec.rope;
  const bool rows = r.positions.defined() && r.positions.dim() == 2;
  const std::int64_t b = rows ? r.positions.size(0) : 1;
  Tensor m = Tensor::empty(rows ? Shape{b, 1, tq, tk} : Shape{tq, tk}, DType::boolean);
  for (std::int64_t n = 0; n < b; ++n)
    for (std::int64_t i = 0; i < tq; ++i)
      for (std::int64_t j = 0; j < tk; ++j) {
        const auto pos = [&](std::int64_t t) {
          if (!r.positions.defined()) return r.offset + t;
          return static_cast<std::int64_t>(rows ? r.positions.at({n, t}) : r.positions.at({t}));
        };
        const std::int64_t pq = pos(i) + r.q_offset, pk = pos(j);
        const bool masked = (spec.window.left && pq - pk > *spec.window.left) ||
                            (spec.window.right && pk - pq > *spec.window.right);
        if (rows) m.set({n, 0, i, j}, !masked);
        else m.set({i, j}, !masked);
      }
  return m;
}

// The mask this mutant applies: [Tq, Tk] bool, True = attend, or undefined.
Tensor mutant_mask(const AttentionSpec& spec_in, std::int64_t tq, std::int64_t tk) {
  AttentionSpec spec = spec_in;
  spec.window = {};  // added by mutant_window
  const Tensor window = mutant_window(spec_in, tq, tk);
  const Tensor m = mutant_mask_without_window(spec, tq, tk);
  if (!window.defined()) return m;
  return m.defined() ? logical_and(m, window) : window;
}

Tensor mutant_mask_without_window(const AttentionSpec& spec, std::int64_t tq, std::int64_t tk) {
  AttentionSpec s = spec;
  if (kBug == "missing_causal_mask") s.causal = false;  // BUG: the causal flag is ignored
  if (kBug == "causal_alignment")  // BUG: FlashAttention's convention whatever is asked
    s.causal_alignment = CausalAlignment::bottom_right;
  if (kBug == "mask_ignored") s.mask = Tensor();  // BUG: only the causal flag is read, spec.mask never
  const bool wrong_causal =
      kBug == "causal_mask_excludes_diagonal" || kBug == "causal_mask_inverted";
  if (!s.causal || !wrong_causal) return attention_mask(s, tq, tk);
  Tensor m = Tensor::empty({tq, tk}, DType::boolean);
  for (std::int64_t i = 0; i < tq; ++i)
    for (std::int64_t j = 0; j < tk; ++j)
      m.set({i, j}, kBug == "causal_mask_excludes_diagonal" ? j < i    // BUG: j < i
                                                                : j >= i);  // BUG: inverted
  return m;
}

// x W^T + b (b undefined: no bias).
Variable project(const Variable& x, const Variable& w, const Variable& b) {
  if (kBug == "weights_not_transposed") {  // BUG: x W, not x W^T
    const Variable y = matmul(x, w);
    return b.defined() ? add(y, b) : y;
  }
  return linear_bias(x, w, b);
}

// [B, T, D] -> [B, H, T, d]
Variable split(const Variable& x, std::int64_t h) {
  const std::int64_t b = x.size(0), t = x.size(1), d = x.size(2) / h;
  if (kBug == "split_without_transpose") return reshape(x, {b, h, t, d});  // BUG
  if (kBug == "interleaved_head_slices")  // BUG: head i takes features i, i+H, i+2H, ...
    return permute(reshape(x, {b, t, d, h}), {0, 3, 1, 2});
  return split_heads(x, h);
}

// BUG qkv_packing_mismatch: wq, wk, wv packed blocked into one [(H + 2 Hkv) d, D]
// weight, then split as if packed per kv group: [G query heads; k; v], d rows each.
// BUG qkv_packing_mismatch_reverse: packed per kv group, then split blocked
// (the first H d rows as q, the next Hkv d as k, the last Hkv d as v).
MhaWeights split_packed_wrongly(const MhaWeights& w, std::int64_t h, std::int64_t hkv, bool reverse) {
  const std::int64_t d = w.wk.size(0) / hkv, g = h / hkv;
  // the biases (packed like their weights: nn.MultiheadAttention's in_proj_bias) split the same way
  auto split = [&](const Variable& a, const Variable& b, const Variable& c, Variable& oq, Variable& ok, Variable& ov) {
    if (reverse) {
      std::vector<Variable> groups;
      for (std::int64_t j = 0; j < hkv; ++j)
        groups.insert(groups.end(), {narrow(a, 0, j * g * d, g * d), narrow(b, 0, j * d, d), narrow(c, 0, j * d, d)});
      const Variable packed = cat(groups, 0);
      oq = narrow(packed, 0, 0, h * d), ok = narrow(packed, 0, h * d, hkv * d), ov = narrow(packed, 0, (h + hkv) * d, hkv * d);
      return;
    }
    const Variable packed = cat({a, b, c}, 0);
    std::vector<Variable> q, k, v;
    for (std::int64_t j = 0; j < hkv; ++j) {
      const std::int64_t at = j * (g + 2) * d;
      q.push_back(narrow(packed, 0, at, g * d));
      k.push_back(narrow(packed, 0, at + g * d, d));
      v.push_back(narrow(packed, 0, at + (g + 1) * d, d));
    }
    oq = cat(q, 0), ok = cat(k, 0), ov = cat(v, 0);
  };
  MhaWeights out{{}, {}, {}, w.wo};
  split(w.wq, w.wk, w.wv, out.wq, out.wk, out.wv);
  if (w.has_bias()) {
    split(w.bq, w.bk, w.bv, out.bq, out.bk, out.bv);
    out.bo = w.bo;
  }
  out.q_norm = w.q_norm;  // the QK-norm gains are not packed
  out.k_norm = w.k_norm;
  return out;
}

// k or v [B, T, Hkv*d] -> [B, Hkv, T, d]
Variable split_kv(const Variable& x, std::int64_t hkv) {
  if (kBug == "kv_interleaved_head_slices") {  // BUG: kv head j takes features j, j+Hkv, ...
    const std::int64_t b = x.size(0), t = x.size(1), d = x.size(2) / hkv;
    return permute(reshape(x, {b, t, d, hkv}), {0, 3, 1, 2});
  }
  return split(x, hkv);
}

// k or v [B, Hkv, T, d] -> [B, H, T, d]: query head h reads kv head h / G.
Variable widen_kv(const Variable& kv, std::int64_t h) {
  const std::int64_t hkv = kv.size(1), g = h / hkv;
  if (g == 1) return kv;
  if (kBug == "kv_map_tile" || kBug == "kv_group_wrong_divisor") {
    std::vector<Variable> heads;
    for (std::int64_t i = 0; i < h; ++i) {
      // BUG (wrong divisor): divides by Hkv, not by G. When G > Hkv, h / Hkv runs
      // past the last kv head; written as a gather that clamps (JAX's indexing
      // does, an unchecked kernel reads on) it gives wrong numbers, not an error.
      const std::int64_t j = kBug == "kv_map_tile" ? i % hkv  // BUG: tiled, as repeat() lays them out
                                                   : std::min(i / hkv, hkv - 1);
      heads.push_back(narrow(kv, 1, j, 1));
    }
    return cat(heads, 1);
  }
  const Variable wide = repeat_interleave(kv, g, 1);
  const Variable constant(wide.data());  // the same values, no path back to kv
  if (kBug == "kv_grad_not_accumulated") {
    // BUG: a hand-written backward keeps the gradient of the group's first member only
    std::vector<Variable> heads;
    for (std::int64_t i = 0; i < h; ++i) heads.push_back(narrow(i % g == 0 ? wide : constant, 1, i, 1));
    return cat(heads, 1);
  }
  if (kBug == "kv_grad_averaged")  // BUG: a hand-written backward means over the group instead of summing
    return add(scale(wide, 1.0 / static_cast<double>(g)), scale(constant, 1.0 - 1.0 / static_cast<double>(g)));
  return wide;
}

// ---- RoPE as this mutant rotates (spec.rope on) ----

bool rope_bug() { return kBug.rfind("rope_", 0) == 0; }

// The spec with every position shifted by `by` (p_t + by): explicit
// positions get it per element, offset positions through the offset.
RopeSpec shift_positions(RopeSpec r, double by) {
  if (!r.positions.defined()) {
    r.offset += static_cast<std::int64_t>(by);
    return r;
  }
  Tensor p = r.positions.clone();
  for (std::int64_t i = 0; i < p.numel(); ++i) p.set_flat(i, p.flat(i) + by);
  r.positions = p;
  return r;
}

// The spec with every position negated (-p_t), q_offset too: rotation by -phi.
RopeSpec negate_positions(RopeSpec r, std::int64_t t) {
  if (!r.positions.defined()) {
    std::vector<std::int64_t> p;
    for (std::int64_t i = 0; i < t; ++i) p.push_back(-(r.offset + i));
    r.positions = positions_tensor(p, {t});
    r.offset = 0;
  } else {
    Tensor p = r.positions.clone();
    for (std::int64_t i = 0; i < p.numel(); ++i) p.set_flat(i, -p.flat(i));
    r.positions = p;
  }
  r.q_offset = -r.q_offset;
  return r;
}

// x [B, H, T, d] rotated with float32 angle tables (BUG rope_tables_float32):
// inv_freq, t * inv_freq, cos and sin in float, as float32 reference code builds them.
Variable rotate_float32(const Variable& x, const RopeSpec& r, std::int64_t q_offset) {
  const std::int64_t t = x.size(-2), d = x.size(-1), rot = r.rotary_dim > 0 ? r.rotary_dim : d, half = rot / 2;
  const std::vector<double> pos = r.positions.defined() ? r.positions.to_vector() : std::vector<double>{};
  const std::int64_t rows = pos.empty() ? 1 : static_cast<std::int64_t>(pos.size()) / t;
  std::vector<double> c, sn;  // [rows, T, r/2]
  for (std::int64_t row = 0; row < rows; ++row)
    for (std::int64_t i = 0; i < t; ++i) {
      const double p = pos.empty() ? static_cast<double>(r.offset + i) : pos[static_cast<std::size_t>(row * t + i)];
      const float pf = static_cast<float>(p + static_cast<double>(q_offset));
      for (std::int64_t k = 0; k < half; ++k) {
        const float w = std::pow(static_cast<float>(r.theta), -2.0f * static_cast<float>(k) / static_cast<float>(rot));
        const float phi = pf * w;  // BUG: float32 angles and tables in a float64 unit
        c.push_back(std::cos(phi));
        sn.push_back(std::sin(phi));
      }
    }
  Shape table{t, half};  // positions [B, T]: row b for every head of batch item b, [B, 1.., T, r/2]
  if (rows > 1) {
    table.assign(static_cast<std::size_t>(x.dim() - 2), 1);
    table[0] = rows;
    table.push_back(t);
    table.push_back(half);
  }
  const Variable cs(Tensor::from_values(c, table, x.dtype())), sn_t(Tensor::from_values(sn, table, x.dtype()));
  Variable a, b;  // the pairs' first and second members, [.., T, r/2]
  Shape lead(x.shape().begin(), x.shape().end() - 1);
  if (r.style == RopeStyle::half) {
    a = narrow(x, -1, 0, half);
    b = narrow(x, -1, half, half);
  } else {
    Shape pairs = lead;
    pairs.push_back(half);
    pairs.push_back(2);
    const Variable p2 = reshape(narrow(x, -1, 0, rot), pairs);
    Shape one = lead;
    one.push_back(half);
    a = reshape(narrow(p2, -1, 0, 1), one);
    b = reshape(narrow(p2, -1, 1, 1), one);
  }
  const Variable a2 = sub(mul(a, cs), mul(b, sn_t)), b2 = add(mul(a, sn_t), mul(b, cs));
  Variable rotated;
  if (r.style == RopeStyle::half) {
    rotated = cat({a2, b2}, -1);
  } else {
    Shape flat = lead;
    flat.push_back(rot);
    rotated = reshape(stack({a2, b2}, -1), flat);
  }
  return rot == d ? rotated : cat({rotated, narrow(x, -1, rot, d - rot)}, -1);
}

// A rotation of the mutant's own, reported to the taps as rope_queries/rope_keys would.
Variable tapped(const Variable& rotated, const AttentionSpec& spec, bool queries) {
  if (spec.rope_taps) (queries ? spec.rope_taps->q_rot : spec.rope_taps->k_rot).push_back(rotated.data().clone());
  return rotated;
}

// Positions [P, T] as read by the head axis: [B, H, T] whose [b, h] is row
// h mod P, what broadcasting [P, T] to [1, H, T] instead of [B, 1, T] gives
// (P = H exactly; the mod stands in for the shape error otherwise). [T]
// positions, or x without a head axis, are left as they are.
Tensor positions_by_head_axis(const Tensor& p, const Variable& x) {
  if (!p.defined() || p.dim() != 2 || x.dim() < 4) return p;
  const std::int64_t rows = p.size(0), t = p.size(1), b = x.size(0), h = x.size(1);
  const std::vector<double> in = p.to_vector();
  std::vector<double> out;
  out.reserve(static_cast<std::size_t>(b * h * t));
  for (std::int64_t i = 0; i < b; ++i)
    for (std::int64_t j = 0; j < h; ++j)
      for (std::int64_t k = 0; k < t; ++k) out.push_back(in[static_cast<std::size_t>((j % rows) * t + k)]);
  return Tensor::from_values(out, {b, h, t}, DType::float64);
}

// q [B, H, T, d] or k [B, Hkv, T, d] (or x [..., T, d] at the rope level,
// rotated as keys) with this mutant's RoPE. The helpers rope_queries and
// rope_keys record the taps; a rotation of its own records them by tapped().
Variable mutant_rope(const Variable& x, const AttentionSpec& spec, bool queries) {
  AttentionSpec s = spec;
  auto rotate = [&](const Variable& v, const AttentionSpec& sp) { return queries ? rope_queries(v, sp) : rope_keys(v, sp); };
  if (kBug == "rope_missing_on_k" && !queries) return x;  // BUG: k is never rotated
  if (kBug == "rope_style_swapped")  // BUG: the other pairing
    s.rope.style = spec.rope.style == RopeStyle::half ? RopeStyle::interleaved : RopeStyle::half;
  if (kBug == "rope_wrong_theta") s.rope.theta = 10000.0;  // BUG: the base hard-coded
  if (kBug == "rope_freq_exponent")  // BUG: theta^(-k/r), written as sqrt(theta)^(-2k/r)
    s.rope.theta = std::sqrt(spec.rope.theta);
  if (kBug == "rope_position_shift") s.rope = shift_positions(spec.rope, 1.0);  // BUG: positions from 1
  if (kBug == "rope_qk_offset_mismatch" && !queries)  // BUG: keys one position ahead
    s.rope = shift_positions(spec.rope, 1.0);
  if (kBug == "rope_positions_ignored") {  // BUG: arange(T) whatever the positions
    s.rope.positions = Tensor();
    s.rope.offset = 0;
  }
  if (kBug == "rope_positions_wrong_axis")  // BUG: positions row by head, not by batch
    s.rope.positions = positions_by_head_axis(spec.rope.positions, x);
  if (kBug == "rope_sign_flipped")  // BUG: rotation by -phi
    s.rope = negate_positions(spec.rope, x.size(-2));
  if (kBug == "rope_backward_not_transposed") {
    // BUG: a hand-written backward that applies R(phi) to dy, not R^T: the
    // value of R(phi) x, the gradient path of R(-phi) x (whose backward is R(phi))
    AttentionSpec back = spec;
    back.rope = negate_positions(spec.rope, x.size(-2));
    back.rope_taps = nullptr;
    const Variable wrong = rotate(x, back);
    return add(Variable(rotate(x, s).data()), sub(wrong, Variable(wrong.data())));
  }
  if (kBug == "rope_tables_float32")
    return tapped(rotate_float32(x, spec.rope, queries ? spec.rope.q_offset : 0), spec, queries);
  if (kBug == "rope_partial_wrong_span") {  // BUG: the last r dims rotate, the first d - r pass
    const std::int64_t d = x.size(-1), r = spec.rope.rotary_dim > 0 ? spec.rope.rotary_dim : d;
    if (r == d) return rotate(x, s);
    s.rope.rotary_dim = 0;
    s.rope_taps = nullptr;
    return tapped(cat({narrow(x, -1, 0, d - r), rotate(narrow(x, -1, d - r, r), s)}, -1), spec, queries);
  }
  return rotate(x, s);
}

// ---- QK-norm and cross-attention as this mutant does them ----

// RMSNorm over the last dim of x with gain g (already w or 1 + w, the mutant's choice).
Variable rms(const Variable& x, const Variable& g, double eps) {
  return mul(rms_norm(x, Variable(Tensor::ones({x.size(-1)}, x.dtype())), eps), g);
}

// The gain the mutant multiplies by: w, or 1 + w, as it reads the convention.
Variable mutant_gain(const Variable& w, const QkNormSpec& n) {
  bool one_plus_w = n.gain == QkNormGain::one_plus_w;
  if (kBug == "qk_norm_gain_convention") one_plus_w = !one_plus_w;  // BUG: w read as 1 + w and back
  return one_plus_w ? add(w, Variable(Tensor::scalar(1.0, w.dtype()))) : w;
}

double mutant_eps(const QkNormSpec& n) {
  return kBug == "qk_norm_eps" ? 1e-5 : n.eps;  // BUG: a library default hard-coded
}

// q [B, T, H*d] (or k [B, T, Hkv*d]) -> [B, H, T, d], QK-norm done at the
// right place for the mutant's axis (the RoPE comes after, in mha_forward).
Variable mutant_qk_norm(const Variable& p, const Variable& w, const AttentionSpec& spec, std::int64_t heads,
                        bool keys) {
  const QkNormSpec& n = spec.qk_norm;
  const bool norm = n.enabled && kBug != "qk_norm_ignored" && !(keys && kBug == "qk_norm_missing_on_k")  // BUG: both
                    && kBug != "qk_norm_after_rope";  // BUG (after_rope): normalized later, see mutant_norm_after_rope
  if (!norm) return keys ? split_kv(p, heads) : split(p, heads);
  const std::int64_t b = p.size(0), t = p.size(1), d = p.size(2) / heads;
  const Variable g = mutant_gain(w, n);
  bool model = n.axis == QkNormAxis::model;
  if (kBug == "qk_norm_axis_swapped") {  // BUG: the statistics of the other axis, the gain as given
    if (model)  // per head over d, then the [H*d] gain over the whole row
      return keys ? split_kv(mul(reshape(rms(reshape(p, {b, t, heads, d}), Variable(Tensor::ones({d}, p.dtype())),
                                                 mutant_eps(n)), {b, t, heads * d}), g), heads)
                  : split(mul(reshape(rms(reshape(p, {b, t, heads, d}), Variable(Tensor::ones({d}, p.dtype())),
                                          mutant_eps(n)), {b, t, heads * d}), g), heads);
    std::vector<Variable> tiled(static_cast<std::size_t>(heads), g);  // over H*d, the [d] gain for each head
    const Variable normed = rms(p, cat(tiled, 0), mutant_eps(n));
    return keys ? split_kv(normed, heads) : split(normed, heads);
  }
  if (model) {
    const Variable normed = rms(p, g, mutant_eps(n));
    return keys ? split_kv(normed, heads) : split(normed, heads);
  }
  return rms(keys ? split_kv(p, heads) : split(p, heads), g, mutant_eps(n));
}

// BUG qk_norm_after_rope: the norm of the right axis, applied to the rotated
// q or k [B, H, T, d] instead of before the rotation.
Variable mutant_norm_after_rope(const Variable& x, const Variable& w, const AttentionSpec& spec) {
  const QkNormSpec& n = spec.qk_norm;
  if (kBug != "qk_norm_after_rope" || !n.enabled) return x;
  const Variable g = mutant_gain(w, n);
  if (n.axis == QkNormAxis::head) return rms(x, g, n.eps);
  return split_heads(rms(merge_heads(x), g, n.eps), x.size(1));
}

// [B, H, T, d] -> [B, T, D]
Variable merge(const Variable& o) {
  const std::int64_t b = o.size(0), h = o.size(1), t = o.size(2), d = o.size(3);
  if (kBug == "merge_without_transpose") return reshape(o, {b, t, h * d});  // BUG
  if (kBug == "interleaved_head_slices")  // BUG (the same layout on the way back)
    return reshape(permute(o, {0, 2, 3, 1}), {b, t, d * h});
  return merge_heads(o);
}

// a [..., M, K] @ b [..., K, N] as a loop over K whose running sum is stored in
// the operands' dtype after every term: exact enough in float64 and float32,
// a 16-bit accumulator in bfloat16 / float16.
Variable matmul_accumulating(const Variable& a, const Variable& b) {
  if (kBug != "fp16_accumulator") return matmul(a, b);
  Variable acc = mul(narrow(a, -1, 0, 1), narrow(b, -2, 0, 1));
  for (std::int64_t i = 1; i < a.size(-1); ++i)
    acc = add(acc, mul(narrow(a, -1, i, 1), narrow(b, -2, i, 1)));  // BUG: rounded to 16 bits each step
  return acc;
}

// ---- sliding windows, soft-capping, sinks as this mutant computes them

// The sink logits [H] as this mutant reads them, shaped [H, 1, 1] against the
// scores [.., H, Tq, Tk] (undefined: no sink column). group: G = H / Hkv.
Variable mutant_sigma(const AttentionSpec& spec, std::int64_t heads, std::int64_t group, double factor) {
  if (!spec.sinks.defined() || kBug == "sink_ignored") return {};  // BUG (sink_ignored): accepted, never read
  Variable sig = spec.sinks;
  if (kBug == "sink_grad_missing") sig = Variable(spec.sinks.data());  // BUG: the backward drops dsinks
  if (kBug == "sink_per_kv_head" && group > 1) {  // BUG: sinks[h / G], indexed like k and v
    std::vector<Variable> per;
    for (std::int64_t h = 0; h < heads; ++h) per.push_back(narrow(sig, 0, h / group, 1));
    sig = cat(per, 0);
  }
  if (kBug == "sink_scaled") sig = scale(sig, factor);  // BUG: the sink logit scaled like q.k
  return reshape(sig, {heads, 1, 1});
}

// The key tile of this mutant's fused form (fused_sdpa's default Bc).
constexpr std::int64_t kKeyTile = 128;

// Attention as a fused kernel writes it, in FlashAttention's form: the forward
// walks key tiles of kKeyTile with an online softmax (running max m, sum l),
// keeping O and L = m + log l; the hand-written backward recomputes
// P = exp(S - L) over the keys attend_backward allows. Three bugs live here:
// BUG window_ignored_in_backward: attend_backward is causal and the mask
// without the window (the forward has it).
// BUG sink_not_in_max: the running max starts at -inf, not at the sink, and the
// sink is added after the key loop at the keys' max.
// BUG sink_per_tile: the sink is added again in every key tile after the first.
// q, k, v [.., T, d] with the same leading dims; the masks [Tq, Tk] or
// broadcastable to [.., Tq, Tk].
Variable fused_form(const Variable& q, const Variable& k, const Variable& v, const Variable& sinks,
                    const Tensor& attend, const Tensor& attend_backward, double factor, double cap) {
  const std::int64_t tq = q.size(-2), tk = k.size(-2), d = q.size(-1), dv = v.size(-1);
  const std::int64_t n = q.numel() / (tq * d), heads = q.dim() >= 3 ? q.size(-3) : 1;
  Shape full(q.shape().begin(), q.shape().end() - 2);
  full.push_back(tq);
  full.push_back(tk);
  const auto flat_mask = [&](const Tensor& m) {
    return m.defined() ? m.expand(full).contiguous().to_vector() : std::vector<double>(static_cast<std::size_t>(n * tq * tk), 1.0);
  };
  const std::vector<double> fwd = flat_mask(attend), bwd = flat_mask(attend_backward);
  std::vector<Variable> inputs = {q, k, v};
  if (sinks.defined()) inputs.push_back(sinks);
  const Shape out_shape = [&] { Shape s = q.shape(); s.back() = dv; return s; }();
  const DType dtype = q.dtype();
  // the capped score of (slice, i, j) and its 1 - tanh^2
  struct Score { double c, dt; };
  auto score = [=](const std::vector<double>& qv, const std::vector<double>& kv, std::int64_t nn, std::int64_t i, std::int64_t j) {
    double s = 0;
    for (std::int64_t c = 0; c < d; ++c) s += qv[(nn * tq + i) * d + c] * kv[(nn * tk + j) * d + c];
    s *= factor;
    if (cap <= 0) return Score{s, 1.0};
    const double t = std::tanh(s / cap);
    return Score{cap * t, 1 - t * t};
  };
  auto forward = [=](CustomOpContext& ctx, const std::vector<Tensor>& in) {
    const auto qv = in[0].contiguous().to_vector(), kv = in[1].contiguous().to_vector(), vv = in[2].contiguous().to_vector();
    const std::vector<double> sig = in.size() > 3 ? in[3].contiguous().to_vector() : std::vector<double>{};
    std::vector<double> o(static_cast<std::size_t>(n * tq * dv), 0.0), lse(static_cast<std::size_t>(n * tq));
    std::vector<double> acc(static_cast<std::size_t>(dv));
    for (std::int64_t nn = 0; nn < n; ++nn)
      for (std::int64_t i = 0; i < tq; ++i) {
        const bool sink = !sig.empty();
        const double sigma = sink ? sig[static_cast<std::size_t>(nn % heads)] : 0.0;
        // the sink as the first column: m = sigma, l = exp(sigma - m) = 1
        const bool sink_first = sink && kBug != "sink_not_in_max";  // BUG (sink_not_in_max): m starts at -inf
        double m = sink_first ? sigma : -INFINITY, l = sink_first ? 1.0 : 0.0;
        std::fill(acc.begin(), acc.end(), 0.0);
        bool first_tile = true;
        std::vector<double> c(static_cast<std::size_t>(kKeyTile));
        for (std::int64_t j0 = 0; j0 < tk; j0 += kKeyTile) {
          const std::int64_t bc = std::min(kKeyTile, tk - j0);
          double tile_max = -INFINITY;
          for (std::int64_t j = 0; j < bc; ++j) {
            c[j] = fwd[(nn * tq + i) * tk + j0 + j] != 0 ? score(qv, kv, nn, i, j0 + j).c : -INFINITY;
            tile_max = std::max(tile_max, c[j]);
          }
          if (tile_max == -INFINITY) continue;  // no key of this row in the tile
          const double m_new = std::max(m, tile_max), alpha = std::exp(m - m_new);
          l *= alpha;
          for (double& a : acc) a *= alpha;
          for (std::int64_t j = 0; j < bc; ++j) {
            const double p = std::exp(c[j] - m_new);
            l += p;
            for (std::int64_t e = 0; e < dv; ++e) acc[e] += p * vv[(nn * tk + j0 + j) * dv + e];
          }
          if (kBug == "sink_per_tile" && sink && !first_tile) l += std::exp(sigma - m_new);  // BUG: once per tile
          first_tile = false;
          m = m_new;
        }
        if (sink && !sink_first) l += std::exp(sigma - m);  // BUG (sink_not_in_max): inf where m = -inf
        if (l == 0) { lse[nn * tq + i] = -INFINITY; continue; }  // every key masked: zeros
        for (std::int64_t e = 0; e < dv; ++e) o[(nn * tq + i) * dv + e] = acc[e] / l;
        lse[nn * tq + i] = m + std::log(l);
      }
    Tensor out = Tensor::from_values(o, out_shape, dtype);
    ctx.saved = {out, Tensor::from_values(lse, {n * tq}, DType::float64)};
    return out;
  };
  auto backward = [=](const CustomOpContext& ctx, const Tensor& g) {
    const auto qv = q.data().contiguous().to_vector(), kv = k.data().contiguous().to_vector(), vv = v.data().contiguous().to_vector();
    const auto ov = ctx.saved[0].contiguous().to_vector(), lse = ctx.saved[1].to_vector(), gv = g.contiguous().to_vector();
    const std::vector<double> sig = sinks.defined() ? sinks.data().contiguous().to_vector() : std::vector<double>{};
    std::vector<double> dq(qv.size(), 0.0), dk(kv.size(), 0.0), dvv(vv.size(), 0.0), dsig(sig.size(), 0.0);
    for (std::int64_t nn = 0; nn < n; ++nn)
      for (std::int64_t i = 0; i < tq; ++i) {
        const double l = lse[nn * tq + i];
        if (l == -INFINITY) continue;
        double dd = 0;  // D = dO . O
        for (std::int64_t e = 0; e < dv; ++e) dd += gv[(nn * tq + i) * dv + e] * ov[(nn * tq + i) * dv + e];
        if (!sig.empty()) dsig[static_cast<std::size_t>(nn % heads)] -= std::exp(sig[static_cast<std::size_t>(nn % heads)] - l) * dd;
        for (std::int64_t j = 0; j < tk; ++j) {
          if (bwd[(nn * tq + i) * tk + j] == 0) continue;  // BUG: the window is not in this mask
          const Score sc = score(qv, kv, nn, i, j);
          const double p = std::exp(sc.c - l);
          double dp = 0;
          for (std::int64_t e = 0; e < dv; ++e) {
            dvv[(nn * tk + j) * dv + e] += p * gv[(nn * tq + i) * dv + e];
            dp += gv[(nn * tq + i) * dv + e] * vv[(nn * tk + j) * dv + e];
          }
          const double ds = p * (dp - dd) * sc.dt * factor;
          for (std::int64_t c = 0; c < d; ++c) {
            dq[(nn * tq + i) * d + c] += ds * kv[(nn * tk + j) * d + c];
            dk[(nn * tk + j) * d + c] += ds * qv[(nn * tq + i) * d + c];
          }
        }
      }
    std::vector<Tensor> grads = {Tensor::from_values(dq, q.shape(), dtype), Tensor::from_values(dk, k.shape(), dtype),
                                 Tensor::from_values(dvv, v.shape(), dtype)};
    if (sinks.defined()) grads.push_back(Tensor::from_values(dsig, sinks.shape(), sinks.dtype()));
    return grads;
  };
  return custom_op("mutant_fused_form", inputs, std::move(forward), std::move(backward));
}

Variable core(const Variable& q, const Variable& k_in, const Variable& v_in,
              const AttentionSpec& spec, std::int64_t d_model, std::int64_t group = 1) {
  const Variable& k = kBug == "kv_swapped" ? v_in : k_in;  // BUG: keys and values swapped
  const Variable& v = kBug == "kv_swapped" ? k_in : v_in;
  const std::int64_t d = q.size(-1);
  double factor = spec.scale_for(d);
  if (kBug == "scale_one_over_d") factor = 1.0 / static_cast<double>(d);  // BUG
  if (kBug == "scale_model_dim")
    factor = 1.0 / std::sqrt(static_cast<double>(d_model > 0 ? d_model : d));  // BUG
  if (kBug == "no_scale") factor = 1.0;                                   // BUG
  const std::int64_t heads = q.dim() >= 3 ? q.size(-3) : 1;
  const Tensor attend = mutant_mask(spec, q.size(-2), k.size(-2));
  if (kBug == "window_ignored_in_backward" && spec.window.enabled()) {
    AttentionSpec no_window = spec;
    no_window.window = {};
    return fused_form(q, k, v, spec.sinks, attend, mutant_mask(no_window, q.size(-2), k.size(-2)), factor,
                      spec.softcap);
  }
  if ((kBug == "sink_not_in_max" || kBug == "sink_per_tile") && spec.sinks.defined())
    return fused_form(q, k, v, spec.sinks, attend, attend, factor, spec.softcap);
  const Variable raw = matmul_accumulating(q, transpose(k, -2, -1));
  const double cap = spec.softcap;
  const bool cap_here = cap > 0 && kBug != "softcap_ignored" && kBug != "softcap_before_scale" &&
                        kBug != "softcap_after_mask";  // BUG (softcap_ignored): spec.softcap never read
  Variable s = cap > 0 && kBug == "softcap_before_scale" ? scale(softcap(raw, cap), factor)  // BUG: C tanh(q.k / C) * scale
                                                         : scale(raw, factor);
  if (cap_here && kBug == "softcap_wrong_formula") {  // BUG: u tanh(u), u = s / C
    const Variable u = scale(s, 1.0 / cap);
    s = mul(u, softcap(u, 1.0));
  } else if (cap_here && kBug == "softcap_missing_in_backward") {  // BUG: the backward passes ds = dc
    s = add(Variable(softcap(s, cap).data()), sub(s, Variable(s.data())));
  } else if (cap_here) {
    s = softcap(s, cap);
  }
  if (attend.defined())  // BUG when mask_fill_finite: a "large negative" instead of -inf
    s = masked_fill(s, logical_not(attend), kBug == "mask_fill_finite" ? -1e4 : -INFINITY);
  if (cap > 0 && kBug == "softcap_after_mask") s = softcap(s, cap);  // BUG: -inf capped to -C
  const Variable sigma = mutant_sigma(spec, heads, group, factor);
  if (sigma.defined() || (spec.sinks.defined() && kBug == "sink_ignored")) {
    Variable o;
    if (sigma.defined()) {
      Shape column = s.shape();
      column.back() = 1;
      const std::int64_t tk = s.size(-1);
      const Variable pc = softmax(cat({s, expand(cast(sigma, s.dtype()), column)}, -1), -1);
      o = matmul_accumulating(narrow(pc, -1, 0, tk), v);
      if (kBug == "sink_with_value")  // BUG: the sink column weighs v_0 (a sink token's value)
        o = add(o, mul(narrow(pc, -1, tk, 1), narrow(v, -2, 0, 1)));
    } else {
      o = matmul_accumulating(softmax(s, -1), v);
    }
    // a zero dsinks (not a missing one) from the bugs that drop it
    if (kBug == "sink_ignored" || kBug == "sink_grad_missing") o = add(o, scale(sum(spec.sinks), 0.0));
    return o;
  }
  const std::int64_t dim = kBug == "softmax_over_queries" ? -2 : -1;  // BUG: over queries
  Variable p = softmax(s, dim);
  if (kBug == "softmax_no_max_subtraction") {  // BUG: exp without the row max subtracted first
    const Variable e = exp(s);
    p = div(e, sum(e, dim, true));
  }
  if (kBug == "batch_mixing" && p.dim() >= 4 && p.size(0) > 1) {
    // BUG: the batch rolled by one on the way out, as a wrong gather would do
    const std::int64_t n = p.size(0);
    p = cat({narrow(p, 0, 1, n - 1), narrow(p, 0, 0, 1)}, 0);
  }
  return matmul_accumulating(p, v);
}

class Mutant final : public Attention {
 public:
  PluginInfo info() const override {
    PluginInfo i;
    i.name = "mutant_" + std::string(kBug);
    i.version = "1.0.0";
    i.description = "DELIBERATELY WRONG: batched attention with the bug " + std::string(kBug);
    i.mutant = true;
    auto& c = i.capabilities;
    c.mha = c.core = c.causal = c.bool_mask = c.cross_lengths = true;
    c.grouped_kv = true;
    c.bias = true;  // biases on every projection; no catalog bug lives in them
    c.rope = true;  // the RoPE bugs rotate wrongly, the others rotate the one right way
    c.rope_level = rope_bug();
    c.qk_norm = c.cross_attention = true;  // every mutant; the QK-norm and cross bugs do them wrongly
    c.window = c.softcap = c.sinks = true;  // each computed the one right way unless it is the bug's
    c.extra = {"bfloat16", "float16"};  // the engine's ops: float32 math, 16-bit results
    return i;
  }

  Variable mha_forward(const Variable& x, const MhaWeights& w_in,
                       const AttentionSpec& spec) const override {
    const std::int64_t t = x.size(-2), dm = x.size(-1), h = spec.num_heads, hkv = spec.kv_heads();
    const bool packing = kBug == "qkv_packing_mismatch" || kBug == "qkv_packing_mismatch_reverse";
    const MhaWeights w = packing ? split_packed_wrongly(w_in, h, hkv, kBug == "qkv_packing_mismatch_reverse") : w_in;
    const AttentionSpec s = fold_rope_positions(spec, x.shape());
    const Variable x3 = reshape(x, {-1, t, dm});
    // BUG cross_kv_from_queries: k and v projected from x, x_kv never read
    const Variable kv3 = kBug == "cross_kv_from_queries" ? x3 : kv_source(x3, s);
    Variable pq = project(x3, w.wq, w.bq), pk = project(kv3, w.wk, w.bk);
    const bool rope_on = s.rope.enabled;
    if (rope_on && kBug == "rope_before_head_split") {  // BUG: rotated over the whole H*d width
      AttentionSpec wide = s;
      const std::int64_t r = s.rope.rotary_dim > 0 ? s.rope.rotary_dim : s.head_dim();
      wide.rope.rotary_dim = r * h;
      pq = rope_queries(pq, wide);
      wide.rope.rotary_dim = r * hkv;
      pk = rope_keys(pk, wide);
    }
    const bool per_head = rope_on && kBug != "rope_before_head_split";
    Variable q = mutant_qk_norm(pq, w.q_norm, s, h, false), k = mutant_qk_norm(pk, w.k_norm, s, hkv, true);
    Variable v = split_kv(project(kv3, w.wv, w.bv), hkv);
    if (per_head) {
      q = mutant_rope(q, s, true);
      k = mutant_rope(k, s, false);
      if (kBug == "rope_on_v") v = rope(v, s.rope);  // BUG: v rotated like k
    }
    q = mutant_norm_after_rope(q, w.q_norm, s);
    k = mutant_norm_after_rope(k, w.k_norm, s);
    AttentionSpec cs = without_rope(s);
    if (kBug == "window_by_position") cs.rope = s.rope;  // its window reads the positions (core() rotates nothing)
    if (kBug == "cross_causal" && s.x_kv.defined()) cs.causal = true;  // BUG: the decoder's causal mask kept
    const Variable o = merge(core(q, widen_kv(k, h), widen_kv(v, h), cs, dm, h / hkv));
    if (kBug == "missing_output_projection") return reshape(o, x.shape());  // BUG: no wo (nor bo)
    return reshape(project(o, w.wo, w.bo), x.shape());
  }

  Variable core_forward(const Variable& q_in, const Variable& k_in, const Variable& v_in,
                        const AttentionSpec& spec) const override {
    const bool rope_on = spec.rope.enabled;
    const Variable q = rope_on ? mutant_rope(q_in, spec, true) : q_in;
    const Variable k = rope_on ? mutant_rope(k_in, spec, false) : k_in;
    const Variable v = rope_on && kBug == "rope_on_v" ? rope(v_in, spec.rope) : v_in;  // BUG: v rotated
    if (q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.size(1) < q.size(1))  // k, v with Hkv heads
      return core(q, widen_kv(k, q.size(1)), widen_kv(v, q.size(1)), spec, spec.d_model, q.size(1) / k.size(1));
    return core(q, k, v, spec, spec.d_model);
  }

  // x [..., T, d]: the rotation alone, as queries at offset 0 are rotated
  // (the RoPE bugs only; one tensor: a q/k mismatch has nothing to show on).
  Variable rope_forward(const Variable& x, const RopeSpec& spec) const override {
    AttentionSpec s;
    s.rope = spec;
    s.rope.enabled = true;
    s.rope.q_offset = 0;
    return mutant_rope(x, s, true);
  }
};

}  // namespace

HEADGRAD_PLUGIN(Mutant)
