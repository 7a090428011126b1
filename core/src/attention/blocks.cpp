// Shape legend: B batch, T sequence, D model width, H query heads, Hkv
// key/value heads, G = H / Hkv, d head width.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "headgrad/attention.hpp"
#include "headgrad/kernels.hpp"

namespace headgrad {

std::string_view causal_alignment_name(CausalAlignment alignment) {
  switch (alignment) {
    case CausalAlignment::top_left: return "top_left";
    case CausalAlignment::bottom_right: return "bottom_right";
  }
  throw std::logic_error("causal_alignment_name: unknown alignment " +
                         std::to_string(static_cast<int>(alignment)));
}

std::string_view qk_norm_axis_name(QkNormAxis axis) {
  switch (axis) {
    case QkNormAxis::head: return "head";
    case QkNormAxis::model: return "model";
  }
  throw std::logic_error("qk_norm_axis_name: unknown axis " + std::to_string(static_cast<int>(axis)));
}

std::string_view qk_norm_gain_name(QkNormGain gain) {
  switch (gain) {
    case QkNormGain::w: return "w";
    case QkNormGain::one_plus_w: return "one_plus_w";
  }
  throw std::logic_error("qk_norm_gain_name: unknown gain " + std::to_string(static_cast<int>(gain)));
}

Tensor attention_mask(const AttentionSpec& spec, std::int64_t tq, std::int64_t tk) {
  const bool has_mask = spec.mask.defined();
  if (has_mask && spec.mask.dtype() != DType::boolean)
    throw std::invalid_argument("attention mask must be bool (True = attend), got " +
                                std::string(dtype_name(spec.mask.dtype())));
  Tensor m = has_mask ? spec.mask : Tensor();
  if (spec.causal) {
    Tensor causal = causal_mask(tq, tk, spec.causal_shift(tq, tk));
    m = has_mask ? logical_and(spec.mask, causal) : causal;
  }
  if (spec.window.enabled()) {
    Tensor window = window_mask(spec, tq, tk);
    m = m.defined() ? logical_and(m, window) : window;
  }
  return m;
}

// ---- sliding windows, soft-capping, sinks

std::int64_t window_offset(const AttentionSpec& spec, std::int64_t tq, std::int64_t tk) {
  // The window sits on the causal diagonal: shifted only under causal bottom_right.
  return spec.causal ? spec.causal_shift(tq, tk) : 0;
}

void check_window(const WindowSpec& w, std::string_view who) {
  for (const auto& [bound, name] : {std::pair{w.left, "left"}, std::pair{w.right, "right"}})
    if (bound && *bound < 0)
      throw std::invalid_argument(std::string(who) + ": window " + name + " " + std::to_string(*bound) +
                                  " is negative (keys p_i - left .. p_i + right, bounds >= 0)");
}

Tensor window_mask(const AttentionSpec& spec, std::int64_t tq, std::int64_t tk) {
  if (!spec.window.enabled()) return {};
  check_window(spec.window, "window_mask");
  const std::int64_t o = window_offset(spec, tq, tk);
  Tensor m = Tensor::empty({tq, tk}, DType::boolean);
  bool* p = m.mutable_data<bool>();
  for (std::int64_t i = 0; i < tq; ++i)
    for (std::int64_t j = 0; j < tk; ++j)
      p[i * tk + j] = (!spec.window.left || j >= i + o - *spec.window.left) &&
                      (!spec.window.right || j <= i + o + *spec.window.right);
  return m;
}

Variable with_sink_column(const Variable& scores, const Variable& sinks) {
  const std::int64_t heads = sinks.numel();
  if (sinks.dim() != 1 || (scores.dim() < 3 ? heads != 1 : scores.size(-3) != heads))
    throw std::invalid_argument("sinks " + shape_str(sinks.shape()) + " do not fit scores " +
                                shape_str(scores.shape()) + ": expected [H], one logit per query head (dim -3)");
  Shape col = scores.shape();
  col.back() = 1;
  const Variable sigma = expand(reshape(sinks, {heads, 1, 1}), col);  // head h's logit on each of its rows
  return cat({scores, cast(sigma, scores.dtype())}, -1);
}

namespace {

// ---- QK-norm and cross-attention: the shapes mha_dims checks ----
void check_qk_norm_and_cross(const Variable& x, const MhaWeights& w, const AttentionSpec& spec, const MhaDims& m,
                             const std::string& at) {
  if (spec.qk_norm.enabled) {
    const bool model = spec.qk_norm.axis == QkNormAxis::model;
    const Shape want_q = {model ? m.heads * m.head_dim : m.head_dim};
    const Shape want_k = {model ? m.kv_heads * m.head_dim : m.head_dim};
    const std::string why = model ? " (qk_norm axis model: q_norm [H*d], k_norm [Hkv*d])"
                                  : " (qk_norm axis head: q_norm and k_norm [d], shared by every head)";
    const std::pair<const Variable*, Shape> gains[] = {{&w.q_norm, want_q}, {&w.k_norm, want_k}};
    const char* names[] = {"q_norm", "k_norm"};
    for (std::size_t i = 0; i < 2; ++i)
      if (!gains[i].first->defined() || gains[i].first->shape() != gains[i].second)
        throw std::invalid_argument(at + names[i] + " is " +
                                    (gains[i].first->defined() ? shape_str(gains[i].first->shape()) : "undefined") +
                                    ", expected " + shape_str(gains[i].second) + why);
    if (!(spec.qk_norm.eps >= 0.0) || !std::isfinite(spec.qk_norm.eps))
      throw std::invalid_argument(at + "qk_norm eps must be finite and >= 0, got " + std::to_string(spec.qk_norm.eps));
  }
  if (!spec.x_kv.defined()) return;
  const Shape& xs = x.shape();
  const Shape& ks = spec.x_kv.shape();
  const bool lead_ok = ks.size() == xs.size() && std::equal(xs.begin(), xs.end() - 2, ks.begin());
  if (!lead_ok || ks.back() != m.d_model || ks[ks.size() - 2] < 1)
    throw std::invalid_argument(at + "x_kv is " + shape_str(ks) + ", expected [..., Tk, " + std::to_string(m.d_model) +
                                "] with the leading dims of x " + shape_str(xs) + " (cross-attention)");
  if (spec.rope.enabled)
    throw std::invalid_argument(at + "RoPE with cross-attention (x_kv) is not defined: the query and key "
                                "streams' positions are unrelated; turn one of them off");
}

}  // namespace

MhaDims mha_dims(const Variable& x, const MhaWeights& w, const AttentionSpec& spec,
                 std::string_view who) {
  const std::string at = std::string(who) + ": ";
  if (x.dim() < 2)
    throw std::invalid_argument(at + "x " + shape_str(x.shape()) + " is not [..., T, D]");
  MhaDims m;
  m.d_model = x.size(-1);
  m.heads = spec.num_heads;
  m.kv_heads = spec.kv_heads();
  if (m.heads < 1 || m.kv_heads < 1 || m.kv_heads > m.heads || m.heads % m.kv_heads != 0)
    throw std::invalid_argument(at + "num_kv_heads " + std::to_string(m.kv_heads) +
                                " must divide num_heads " + std::to_string(m.heads) +
                                " (query head h reads kv head h / (H / Hkv))");
  m.group = m.heads / m.kv_heads;
  if (spec.head_width > 0) {
    m.head_dim = spec.head_width;
  } else if (m.d_model % m.heads == 0) {
    m.head_dim = m.d_model / m.heads;
  } else {
    throw std::invalid_argument(at + "D = " + std::to_string(m.d_model) + " (x " +
                                shape_str(x.shape()) + ") is not a multiple of H = " +
                                std::to_string(m.heads) + " and no head width is given");
  }
  const std::int64_t dm = m.d_model, hd = m.heads * m.head_dim, kvd = m.kv_heads * m.head_dim;
  const std::pair<const Variable*, Shape> expected[] = {
      {&w.wq, {hd, dm}}, {&w.wk, {kvd, dm}}, {&w.wv, {kvd, dm}}, {&w.wo, {dm, hd}}};
  const char* names[] = {"wq", "wk", "wv", "wo"};
  for (std::size_t i = 0; i < 4; ++i)
    if (!expected[i].first->defined() || expected[i].first->shape() != expected[i].second)
      throw std::invalid_argument(
          at + names[i] + " is " +
          (expected[i].first->defined() ? shape_str(expected[i].first->shape()) : "undefined") +
          ", expected " + shape_str(expected[i].second) + " for D " + std::to_string(dm) +
          ", H " + std::to_string(m.heads) + ", Hkv " + std::to_string(m.kv_heads) + ", d " +
          std::to_string(m.head_dim) +
          " (wq [H*d, D], wk and wv [Hkv*d, D], wo [D, H*d])");
  if (w.has_bias()) {
    const std::pair<const Variable*, Shape> biases[] = {{&w.bq, {hd}}, {&w.bk, {kvd}}, {&w.bv, {kvd}}, {&w.bo, {dm}}};
    const char* bias_names[] = {"bq", "bk", "bv", "bo"};
    for (std::size_t i = 0; i < 4; ++i)
      if (!biases[i].first->defined() || biases[i].first->shape() != biases[i].second)
        throw std::invalid_argument(
            at + bias_names[i] + " is " +
            (biases[i].first->defined() ? shape_str(biases[i].first->shape()) : "undefined") + ", expected " +
            shape_str(biases[i].second) + " (biases come as all four of bq [H*d], bk and bv [Hkv*d], bo [D], or none)");
  }
  check_qk_norm_and_cross(x, w, spec, m, at);
  return m;
}

Variable linear_bias(const Variable& x, const Variable& w, const Variable& b) {
  const Variable y = linear(x, w);
  return b.defined() ? add(y, b) : y;  // b [out] broadcasts over the rows
}

std::int64_t kv_group(const Variable& q, const Variable& k, const Variable& v,
                      std::string_view who) {
  const auto fail = [&](const std::string& why) {
    throw std::invalid_argument(std::string(who) + ": q " + shape_str(q.shape()) + ", k " +
                                shape_str(k.shape()) + ", v " + shape_str(v.shape()) + ": " + why);
  };
  if (q.dim() < 2 || k.dim() != q.dim() || v.dim() != q.dim())
    fail("expected [..., Tq, d], [..., Tk, d], [..., Tk, dv] with the same number of dims");
  if (q.dim() < 3) return 1;
  const std::int64_t h = q.size(-3), hkv = k.size(-3);
  if (hkv == h && v.size(-3) == h) return 1;
  // One query head over several kv heads is plain broadcasting, not grouping;
  // dims before the head dim are left to the core's broadcasting too.
  if (h == 1 && v.size(-3) == hkv) return 1;
  if (v.size(-3) != hkv || hkv < 1 || h % hkv != 0)
    fail("k and v must have Hkv heads (dim -3) dividing the H = " + std::to_string(h) +
         " heads of q");
  return h / hkv;
}

Variable expand_kv_heads(const Variable& kv, std::int64_t group) {
  return group == 1 ? kv : repeat_interleave(kv, group, -3);
}

namespace {

// A copy for the spec's tap sink, if it has one.
Variable tapped(const Variable& rotated, const AttentionSpec& spec, bool queries) {
  if (spec.rope_taps)
    (queries ? spec.rope_taps->q_rot : spec.rope_taps->k_rot).push_back(rotated.data().clone());
  return rotated;
}

}  // namespace

Variable rope_keys(const Variable& k, const AttentionSpec& spec) {
  return spec.rope.enabled ? tapped(rope(k, spec.rope), spec, false) : k;
}

Variable rope_queries(const Variable& q, const AttentionSpec& spec) {
  if (!spec.rope.enabled) return q;
  if (spec.rope.q_offset == 0) return tapped(rope(q, spec.rope), spec, true);
  RopeSpec shifted = spec.rope;
  if (shifted.positions.defined()) {
    Tensor p = shifted.positions.clone();
    for (std::int64_t i = 0; i < p.numel(); ++i) p.set_flat(i, p.flat(i) + static_cast<double>(shifted.q_offset));
    shifted.positions = p;
  } else {
    shifted.offset += shifted.q_offset;
  }
  return tapped(rope(q, shifted), spec, true);
}

AttentionSpec fold_rope_positions(const AttentionSpec& spec, const Shape& x_shape) {
  const Tensor& p = spec.rope.positions;
  const auto lead = static_cast<std::int64_t>(x_shape.size()) - 2;
  if (!spec.rope.enabled || !p.defined() || lead <= 1 || p.dim() < 2 || p.dim() > lead + 1)
    return spec;
  // positions [L0 .. Lk, T] over x [L0 .. Lk, .., L_lead, T, D]: spread over the
  // remaining leading dims, then [N, T] as x is folded. A prefix that does not
  // match is left for rope() to refuse with both shapes.
  Shape prefix(p.shape().begin(), p.shape().end() - 1);
  if (!std::equal(prefix.begin(), prefix.end(), x_shape.begin())) return spec;
  Shape spread(x_shape.begin(), x_shape.end() - 1);  // [L0 .. L_lead, T]
  Shape with_ones = prefix;
  with_ones.resize(static_cast<std::size_t>(lead), 1);
  with_ones.push_back(p.size(-1));
  AttentionSpec folded = spec;
  folded.rope.positions = p.reshape(with_ones).expand(spread).reshape({-1, p.size(-1)});
  return folded;
}

AttentionSpec without_rope(const AttentionSpec& spec) {
  AttentionSpec s = spec;
  s.rope.enabled = false;
  return s;
}

Variable split_heads(const Variable& x, std::int64_t heads) {
  if (x.dim() != 3 || heads < 1 || x.size(2) % heads != 0)
    throw std::invalid_argument("split_heads: input " + shape_str(x.shape()) +
                                " is not [B, T, D] with D divisible by " + std::to_string(heads) +
                                " heads");
  const std::int64_t b = x.size(0), t = x.size(1), d = x.size(2) / heads;
  return transpose(reshape(x, {b, t, heads, d}), 1, 2);  // [B, H, T, d]
}

Variable merge_heads(const Variable& x) {
  if (x.dim() != 4)
    throw std::invalid_argument("merge_heads: input " + shape_str(x.shape()) +
                                " is not [B, H, T, d]");
  const std::int64_t b = x.size(0), h = x.size(1), t = x.size(2), d = x.size(3);
  return reshape(transpose(x, 1, 2), {b, t, h * d});  // [B, T, H, d] first, then [B, T, D]
}

// ---- QK-norm and cross-attention ----
Variable kv_source(const Variable& x3, const AttentionSpec& spec) {
  if (!spec.x_kv.defined()) return x3;
  return reshape(spec.x_kv, {-1, spec.x_kv.size(-2), spec.x_kv.size(-1)});
}

Variable qk_norm_projection(const Variable& p, const Variable& gain, const AttentionSpec& spec) {
  const QkNormSpec& n = spec.qk_norm;
  if (!n.enabled || n.axis != QkNormAxis::model) return p;
  return rms_norm(p, gain, n.eps, n.gain == QkNormGain::one_plus_w);
}

Variable qk_norm_heads(const Variable& h, const Variable& gain, const AttentionSpec& spec) {
  const QkNormSpec& n = spec.qk_norm;
  if (!n.enabled || n.axis != QkNormAxis::head) return h;
  return rms_norm(h, gain, n.eps, n.gain == QkNormGain::one_plus_w);
}

Variable batched_mha(const Variable& x, const MhaWeights& w, const AttentionSpec& spec,
                     const AttentionCore& core, KvHeads kv_heads) {
  const MhaDims m = mha_dims(x, w, spec, "batched_mha");
  const AttentionSpec s = fold_rope_positions(spec, x.shape());
  const Variable x3 = reshape(x, {-1, x.size(-2), m.d_model});                 // [B, Tq, D]
  const Variable kv3 = kv_source(x3, s);                                       // [B, Tk, D]: x3 unless cross
  const Variable pq = qk_norm_projection(linear_bias(x3, w.wq, w.bq), w.q_norm, s);
  const Variable pk = qk_norm_projection(linear_bias(kv3, w.wk, w.bk), w.k_norm, s);
  const Variable q = rope_queries(qk_norm_heads(split_heads(pq, m.heads), w.q_norm, s), s);  // [B, H, Tq, d]
  Variable k = rope_keys(qk_norm_heads(split_heads(pk, m.kv_heads), w.k_norm, s), s);        // [B, Hkv, Tk, d]
  Variable v = split_heads(linear_bias(kv3, w.wv, w.bv), m.kv_heads);                         // never rotated
  if (kv_heads == KvHeads::repeat) {  // widened to H: query head h reads kv head h / G
    k = expand_kv_heads(k, m.group);
    v = expand_kv_heads(v, m.group);
  }
  const Variable o = merge_heads(core(q, k, v, without_rope(s)));  // [B, T, H*d]
  return reshape(linear_bias(o, w.wo, w.bo), x.shape());
}

Variable attention_core(const Variable& q, const Variable& k, const Variable& v,
                        const AttentionSpec& spec) {
  if (q.dim() < 2 || k.dim() != q.dim() || v.dim() != q.dim() || q.size(-1) != k.size(-1) ||
      k.size(-2) != v.size(-2))
    throw std::invalid_argument("attention_core: q " + shape_str(q.shape()) + ", k " +
                                shape_str(k.shape()) + ", v " + shape_str(v.shape()) +
                                " are not [..., Tq, d], [..., Tk, d], [..., Tk, dv]");
  const std::int64_t tq = q.size(-2), tk = k.size(-2);
  if (spec.softcap > 0.0 || spec.sinks.defined()) {
    // s = scale q k^T, capped, masked (-inf), the sink column appended, softmax,
    // the sink's probability dropped: it has no value. Autodiff gives dsinks.
    Variable s = scale(matmul(q, transpose(k, -2, -1)), spec.scale_for(q.size(-1)));
    if (spec.softcap > 0.0) s = softcap(s, spec.softcap);
    if (const Tensor attend = attention_mask(spec, tq, tk); attend.defined())
      s = masked_fill(s, logical_not(attend), -INFINITY);
    if (!spec.sinks.defined()) return matmul(softmax(s, -1), v);
    const Variable p = softmax(with_sink_column(s, spec.sinks), -1);  // [..., Tq, Tk + 1]
    return matmul(narrow(p, -1, 0, tk), v);
  }
  // softmax(masked_fill(scale(q k^T), !attend, -inf)) as one fused op: the same
  // values in one pass over [..., Tq, Tk]; causal is taken from the indices.
  AttentionSpec mask_only = spec;
  mask_only.causal = false;
  mask_only.window = {};  // the window's offset depends on causal: its mask is added whole
  if (spec.window.enabled()) {
    const Tensor window = window_mask(spec, tq, tk);
    mask_only.mask = mask_only.mask.defined() ? logical_and(mask_only.mask, window) : window;
  }
  const Tensor attend = attention_mask(mask_only, tq, tk);
  const Variable p = masked_softmax(matmul(q, transpose(k, -2, -1)),
                                    spec.scale_for(q.size(-1)), attend, spec.causal,
                                    spec.causal_shift(tq, tk));
  return matmul(p, v);  // [..., Tq, dv]
}

}  // namespace headgrad
