// per_head: the oracle. Slow, obvious, trusted: a loop over heads, each with
// its own slice of the weights and its own [T, T] scores; no reshape of
// activations ever touches the head layout. At large shapes each head runs
// under the engine's checkpoint: its [T, T] buffers live in its own forward
// and its own backward only (one head's at a time, not all of them).
//
// Biases (when given): head h's slice of bq is added to its own projection,
// kv head j's slices of bk and bv to its own, bo once after the concatenation.
//
// Grouped kv heads: query head h slices the rows of kv head floor(h / G)
// out of wk and wv; nothing is repeated, so the gradient of a shared kv head
// is the sum over its G query heads by plain accumulation. RoPE (when on)
// rotates each query head and each kv head once, with the engine's rope op.
//
// QK-norm (when on): RMSNorm written out from the engine's elementary ops, so
// that its backward comes from autodiff and not from the rms_norm op the
// batched plugins use. Axis head: each head's [B, T, d] over its own d; axis
// model: the sums of squares of a token's every head added up first, over H*d
// (Hkv*d for k). Cross-attention: k and v from x_kv, q from x.
// Windows, soft-capping, sinks: the window is part of attention_mask; the
// cap (softcap op) comes after the scale and before the mask; query head h's
// sink is one more softmax column, so dsinks is plain autodiff.
//
// Shape legend: B batch, T sequence, D model width, H query heads, Hkv
// key/value heads, G = H / Hkv, d head width (D / H unless given).
#include <headgrad/checkpoint.hpp>
#include <headgrad/plugin.hpp>

namespace {

using namespace headgrad;

// Scores, cap, mask, softmax, weighted values for one head: q [B, Tq, d],
// k [B, Tk, d], v [B, Tk, dv] -> [B, Tq, dv]. hidden: [.., Tq, Tk], true where
// a query must not see a key (the complement of the causal, window and bool
// masks together), or undefined. cap: C > 0 replaces s by C tanh(s / C) before
// the mask. sink: this head's logit [1] or undefined.
Variable one_head(const Variable& q, const Variable& k, const Variable& v, const Tensor& hidden,
                  double scale_factor, double cap, const Variable& sink) {
  Variable s = scale(matmul(q, transpose(k, -2, -1)), scale_factor);  // [B, Tq, Tk]
  if (cap > 0.0) s = softcap(s, cap);
  if (hidden.defined()) s = masked_fill(s, hidden, -INFINITY);
  if (!sink.defined()) return matmul(softmax(s, -1), v);
  // The sink: one more softmax column holding sigma on every row, with no
  // value; its weight is dropped after the softmax (gpt-oss).
  Shape column = s.shape();
  column.back() = 1;
  const Variable p = softmax(cat({s, expand(reshape(sink, {1, 1, 1}), column)}, -1), -1);
  return matmul(narrow(p, -1, 0, k.size(-2)), v);
}

// Every head's [Tq, Tk] buffers together above this many bytes: each head
// runs under checkpoint. Below it they are kept, as the plain loop keeps
// them: recomputing costs a third more attention FLOPs, which shapes this
// small do not need to pay. The runner's memory estimate uses the same bound
// (tools/case/budget.hpp, kOracleRecomputeAboveBytes).
constexpr double kRecomputeAboveBytes = 256.0 * 1024 * 1024;

bool recompute_heads(std::int64_t slices, std::int64_t tq, std::int64_t tk, DType dtype) {
  return static_cast<double>(slices) * static_cast<double>(tq) * static_cast<double>(tk) *
             static_cast<double>(dtype_size(dtype)) > kRecomputeAboveBytes;
}

// one_head, under checkpoint when `recompute`: a head's [Tq, Tk] scores and
// weights are then not kept from its forward to its backward but computed
// again, the same ops on the same values, when its backward runs. So one
// head's are alive at a time, not every head's (32 float64 heads at T 8192
// would keep 16 GiB), and the gradients are those of one_head's ops, bit for
// bit.
Variable head(bool recompute, const Variable& q, const Variable& k, const Variable& v, const Tensor& hidden,
              double scale_factor, double cap, const Variable& sink) {
  if (!recompute) return one_head(q, k, v, hidden, scale_factor, cap, sink);
  std::vector<Variable> in{q, k, v};
  if (sink.defined()) in.push_back(sink);
  return checkpoint("per_head.head", std::move(in), [=](const std::vector<Variable>& x) {
    return one_head(x[0], x[1], x[2], hidden, scale_factor, cap, x.size() > 3 ? x[3] : Variable());
  });
}

// Query head h's sink logit [1], or undefined without sinks ([H] expected).
Variable head_sink(const AttentionSpec& spec, std::int64_t heads, std::int64_t h) {
  if (!spec.sinks.defined()) return {};
  if (spec.sinks.dim() != 1 || spec.sinks.numel() != heads)
    throw std::invalid_argument("per_head: sinks " + shape_str(spec.sinks.shape()) + ", expected [" +
                                std::to_string(heads) + "]: one logit per query head");
  return narrow(spec.sinks, 0, h, 1);
}

// Entries [start, start + n) of a bias; undefined stays undefined (no bias).
Variable slice(const Variable& b, std::int64_t start, std::int64_t n) {
  return b.defined() ? narrow(b, 0, start, n) : b;
}

// The mask's slice for head h when the mask has a head dim ([B, H, Tq, Tk]).
Tensor head_mask(const Tensor& attend, std::int64_t h) {
  if (!attend.defined() || attend.dim() < 4) return attend;
  const std::int64_t slice = attend.size(-3) == 1 ? 0 : h;  // a size-1 head dim is shared
  return attend.narrow(-3, slice, 1).squeeze(attend.dim() - 3);
}

// x as `shape` (a broadcasting view; its backward sums the broadcast dims).
Variable expand_to(const Variable& x, const Shape& shape) {
  return x.shape() == shape ? x : expand(x, shape);
}

// The leading dims of the core's output: q's, k's and v's (Hkv read as H) and
// the mask's, broadcast. A tensor that does not fit is named with the shape
// it should have, not left to a size error deep inside an op.
Shape core_lead(const Variable& q, const Variable& k, const Variable& v, const Tensor& attend,
                std::int64_t group) {
  const std::int64_t tq = q.size(-2), tk = k.size(-2);
  Shape lead(q.shape().begin(), q.shape().end() - 2);
  const auto join = [&](const std::string& name, const Shape& shape, std::int64_t heads_per,
                        std::int64_t rows, std::int64_t cols) {
    Shape own(shape.begin(), shape.end() - 2);
    if (!own.empty()) own.back() *= heads_per;
    try {
      lead = broadcast_shapes(lead, own, "per_head");
    } catch (const std::invalid_argument&) {
      Shape expected = lead;
      if (!expected.empty()) expected.back() /= heads_per;
      throw std::invalid_argument("per_head: " + name + " " + shape_str(shape) + " does not fit q " +
                                  shape_str(q.shape()) + ": expected " +
                                  shape_str(with_last2(expected, rows, cols)) +
                                  " (a leading dim of 1 is broadcast)");
    }
  };
  join("k", k.shape(), group, tk, k.size(-1));
  join("v", v.shape(), group, tk, v.size(-1));
  if (attend.defined()) join("mask", attend.shape(), 1, tq, tk);
  return lead;
}

// ---- QK-norm: RMSNorm from elementary ops ----
// parts: the slices of one normalized row (one head's [B, T, d] for axis head,
// every head's for axis model); gains: their slices of the gain. y = x / rms * g,
// rms = sqrt(sum of squares / width + eps), g = w or 1 + w.
std::vector<Variable> rms_normed(const std::vector<Variable>& parts, const std::vector<Variable>& gains,
                                 const QkNormSpec& n) {
  const DType dt = parts.front().dtype();
  Variable squares;
  std::int64_t width = 0;
  for (const Variable& p : parts) {
    const Variable s = sum(mul(p, p), -1, true);  // [B, T, 1]
    squares = squares.defined() ? add(squares, s) : s;
    width += p.size(-1);
  }
  const Variable ms = add(scale(squares, 1.0 / static_cast<double>(width)), Variable(Tensor::scalar(n.eps, dt)));
  const Variable inv_rms = exp(scale(log(ms), -0.5));
  std::vector<Variable> out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const Variable g = n.gain == QkNormGain::one_plus_w ? add(gains[i], Variable(Tensor::scalar(1.0, dt))) : gains[i];
    out.push_back(mul(mul(parts[i], inv_rms), g));
  }
  return out;
}

// The projections of every head ([B, T, d] each) after QK-norm.
std::vector<Variable> qk_normed(std::vector<Variable> heads, const Variable& gain, const AttentionSpec& spec) {
  const QkNormSpec& n = spec.qk_norm;
  if (!n.enabled) return heads;
  const std::int64_t d = heads.front().size(-1);
  if (n.axis == QkNormAxis::head) {
    for (Variable& h : heads) h = rms_normed({h}, {gain}, n).front();
    return heads;
  }
  std::vector<Variable> gains;
  for (std::size_t h = 0; h < heads.size(); ++h) gains.push_back(narrow(gain, 0, static_cast<std::int64_t>(h) * d, d));
  return rms_normed(heads, gains, n);
}

class PerHead final : public Attention {
 public:
  PluginInfo info() const override {
    PluginInfo i;
    i.name = "per_head";
    i.version = "1.0.0";
    i.description = "loop over heads with sliced weights: the slow, obvious oracle";
    auto& c = i.capabilities;
    c.mha = c.core = c.causal = c.bool_mask = c.cross_lengths = c.grouped_kv = c.rope = c.rope_level = true;
    c.bias = true;
    c.qk_norm = c.cross_attention = true;
    c.window = c.softcap = c.sinks = true;  // window in attention_mask; cap and sink in one_head
    c.extra = {"bfloat16", "float16"};  // through the engine's ops: float32 math, 16-bit results
    return i;
  }

  // x [..., T, D] -> [..., T, D]
  Variable mha_forward(const Variable& x, const MhaWeights& w,
                       const AttentionSpec& spec) const override {
    const MhaDims m = mha_dims(x, w, spec, "per_head");
    const AttentionSpec s = fold_rope_positions(spec, x.shape());
    const std::int64_t t = x.size(-2), d = m.head_dim;
    const Variable x3 = reshape(x, {-1, t, m.d_model});  // leading dims folded into one batch
    const Variable kv3 = kv_source(x3, s);               // x_kv [B, Tk, D] in cross-attention
    const Tensor attend = attention_mask(spec, t, kv3.size(-2));
    const Tensor hidden = attend.defined() ? logical_not(attend) : Tensor();  // once, not per head
    std::vector<Variable> ks, vs;  // kv head j: rows [j*d, (j+1)*d) of wk and wv
    for (std::int64_t j = 0; j < m.kv_heads; ++j) {
      ks.push_back(linear_bias(kv3, narrow(w.wk, 0, j * d, d), slice(w.bk, j * d, d)));  // [B, Tk, d]
      vs.push_back(linear_bias(kv3, narrow(w.wv, 0, j * d, d), slice(w.bv, j * d, d)));
    }
    ks = qk_normed(ks, w.k_norm, s);
    for (Variable& k : ks) k = rope_keys(k, s);  // norm first, then rotate
    std::vector<Variable> qs;
    for (std::int64_t h = 0; h < m.heads; ++h)
      qs.push_back(linear_bias(x3, narrow(w.wq, 0, h * d, d), slice(w.bq, h * d, d)));  // [B, T, d]
    qs = qk_normed(qs, w.q_norm, s);
    std::vector<Variable> heads;
    const bool recompute = recompute_heads(x3.size(0) * m.heads, t, kv3.size(-2), x.dtype());
    for (std::int64_t h = 0; h < m.heads; ++h) {
      const std::int64_t j = h / m.group;  // the kv head this query head reads
      heads.push_back(head(recompute, rope_queries(qs[static_cast<std::size_t>(h)], s), ks[j], vs[j],
                           head_mask(hidden, h), spec.scale_for(d), spec.softcap, head_sink(spec, m.heads, h)));
    }
    const Variable concat = cat(heads, -1);  // [B, T, H*d]: head h in columns [h*d, (h+1)*d)
    Shape out_shape = x.shape();
    return reshape(linear_bias(concat, w.wo, w.bo), out_shape);
  }

  // x [..., T, d]: the engine's RoPE op, the oracle of the rope level.
  Variable rope_forward(const Variable& x, const RopeSpec& spec) const override { return rope(x, spec); }

  // q [..., H, Tq, d], k [..., Hkv, Tk, d], v [..., Hkv, Tk, dv] -> [..., Tq, dv]:
  // the leading dims broadcast (k's and v's Hkv read as H), as in batched and
  // fused_sdpa, then every slice of them (batch x heads) on its own; query
  // slice n reads kv slice (n / H) * Hkv + (n % H) / G.
  Variable core_forward(const Variable& q0, const Variable& k0, const Variable& v0,
                        const AttentionSpec& spec) const override {
    const std::int64_t group = kv_group(q0, k0, v0, "per_head");
    const std::int64_t tq = q0.size(-2), tk = k0.size(-2), d = q0.size(-1), dv = v0.size(-1);
    const Tensor attend = attention_mask(spec, tq, tk);
    const Shape lead = core_lead(q0, k0, v0, attend, group);
    Shape kv_lead = lead;
    if (group > 1) kv_lead.back() /= group;
    const Variable q = expand_to(q0, with_last2(lead, tq, d));
    const Variable k = expand_to(k0, with_last2(kv_lead, tk, d));
    const Variable v = expand_to(v0, with_last2(kv_lead, tk, dv));
    const std::int64_t heads = lead.empty() ? 1 : lead.back();
    const Variable q3 = reshape(rope_queries(q, spec), {-1, tq, d});  // rotated before slicing
    const Variable k3 = reshape(rope_keys(k, spec), {-1, tk, d});
    const Variable v3 = reshape(v, {-1, tk, dv});
    // the complement once, before the expand (not per slice)
    const Tensor hidden =
        attend.defined() ? logical_not(attend).expand(with_last2(lead, tq, tk)).reshape({-1, tq, tk}) : Tensor();
    std::vector<Variable> slices;
    const bool recompute = recompute_heads(q3.size(0), tq, tk, q0.dtype());
    for (std::int64_t n = 0; n < q3.size(0); ++n) {
      const Tensor m = hidden.defined() ? hidden.narrow(0, n, 1) : Tensor();
      const std::int64_t kv = (n / heads) * (heads / group) + (n % heads) / group;
      slices.push_back(head(recompute, narrow(q3, 0, n, 1), narrow(k3, 0, kv, 1), narrow(v3, 0, kv, 1), m,
                            spec.scale_for(d), spec.softcap, head_sink(spec, heads, n % heads)));
    }
    Shape out_shape = q.shape();
    out_shape.back() = dv;
    return reshape(cat(slices, 0), out_shape);
  }
};

}  // namespace

HEADGRAD_PLUGIN(PerHead)
