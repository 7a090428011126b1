/* naive_c: the attention core in plain C99 through headgrad's C ABI
 * (<headgrad/c_plugin.h>), with a hand-written backward. It proves the escape
 * hatch for kernels written outside C++: the tests compare it with fused_sdpa
 * and gradcheck it.
 *
 * Shape legend: N leading index (the leading dims [...] flattened), Tq/Tk
 * query/key lengths, d query/key width, dv value width.
 *
 * Forward, per leading index n and query row i, over the attended keys j
 * (causal: j <= i, or j <= i + Tk - Tq bottom-right; mask: mask[i, j] != 0):
 *   s_j = scale * q_i . k_j;   m = max_j s_j;   l = sum_j exp(s_j - m)
 *   out_i = sum_j exp(s_j - m) / l * v_j;   stats_i = lse_i = m + log(l)
 * A row with no attended key has out_i = 0 and lse_i = -inf.
 *
 * Backward, recomputing p_ij = exp(s_ij - lse_i) from the saved lse:
 *   D_i = dout_i . out_i;   dv_j += p_ij dout_i;   dp_ij = dout_i . v_j
 *   ds_ij = p_ij (dp_ij - D_i);   dq_i += scale ds_ij k_j;   dk_j += scale ds_ij q_i
 *
 * Grouped KV heads (HG_CAP_GROUPED_KV): q's leading index n reads k's and v's
 * leading index n / G (G = hg_kv_group(call)), so query head h reads kv head
 * h / G; dk and dv accumulate (+=) over the G query heads of each kv head.
 *
 * Windows, soft-capping, sinks (C ABI 3, this build only): a key outside the
 * window (p_i - left <= j <= p_i + right, p_i = i + window_offset) is not
 * attended; with a cap C, s_j = C tanh(scale q_i . k_j / C) and the backward
 * multiplies ds by 1 - (s_j / C)^2; with sinks, sigma_h (h = n mod H) joins
 * m and l as one more term with no value (an empty row: out 0, lse sigma_h)
 * and dsinks_h -= exp(sigma_h - lse_i) D_i.
 *
 * Built with NAIVE_C_TOP_LEFT_ONLY it is "naive_c_top_left", a plugin written
 * before bottom-right alignment existed: it does not declare it and fails the
 * call if it ever sees HG_CAUSAL_BOTTOM_RIGHT.
 *
 * Built with NAIVE_C_ABI_V1 it is "naive_c_v1", the plugin as it was written
 * against C ABI 1, before grouped KV heads: it reports version 1, uses no name
 * version 2 added (version 2 changed no layout, so this is the version-1
 * build), and reads k and v at q's own leading index.
 *
 * Elements are read and written through the strides headgrad gives, in double
 * whatever the dtype (float32 buffers are converted on load and store).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <headgrad/c_plugin.h>

/* The storage offset (in elements) of leading index n of t, whose last two
 * dims are rows and columns. */
static int64_t lead_offset(const hg_tensor* t, int64_t n) {
  int64_t off = 0;
  int a;
  for (a = t->ndim - 3; a >= 0; --a) {
    off += (n % t->shape[a]) * t->strides[a];
    n /= t->shape[a];
  }
  return off;
}

/* t[base + r * stride[-2] + c * stride[-1]] */
static double load(const hg_tensor* t, int64_t base, int64_t r, int64_t c) {
  const int64_t i = base + r * t->strides[t->ndim - 2] + c * t->strides[t->ndim - 1];
  return t->dtype == HG_FLOAT64 ? ((const double*)t->data)[i] : (double)((const float*)t->data)[i];
}

static void store(const hg_tensor* t, int64_t base, int64_t r, int64_t c, double x) {
  const int64_t i = base + r * t->strides[t->ndim - 2] + c * t->strides[t->ndim - 1];
  if (t->dtype == HG_FLOAT64)
    ((double*)t->data)[i] = x;
  else
    ((float*)t->data)[i] = (float)x;
}

static void add_to(const hg_tensor* t, int64_t base, int64_t r, int64_t c, double x) {
  store(t, base, r, c, load(t, base, r, c) + x);
}

static int attends(const hg_core_call* call, int64_t mask_base, int64_t i, int64_t j) {
  const hg_tensor* m = call->mask;
  const int64_t tq = call->q.shape[call->q.ndim - 2], tk = call->k.shape[call->k.ndim - 2];
  const int64_t shift = call->causal == HG_CAUSAL_BOTTOM_RIGHT ? tk - tq : 0;
  if (call->causal != HG_CAUSAL_NONE && j > i + shift) return 0;
#if !defined(NAIVE_C_TOP_LEFT_ONLY) && !defined(NAIVE_C_ABI_V1)
  if ((call->window_flags & HG_WINDOW_LEFT) && j < i + call->window_offset - call->window_left) return 0;
  if ((call->window_flags & HG_WINDOW_RIGHT) && j > i + call->window_offset + call->window_right) return 0;
#endif
  if (m) {
    const int64_t at = mask_base + i * m->strides[m->ndim - 2] + j * m->strides[m->ndim - 1];
    if (!((const uint8_t*)m->data)[at]) return 0;
  }
  return 1;
}

#if defined(NAIVE_C_TOP_LEFT_ONLY) || defined(NAIVE_C_ABI_V1)
#define NAIVE_C_CAPS (HG_CAP_CAUSAL | HG_CAP_BOOL_MASK | HG_CAP_CROSS_LENGTHS | HG_CAP_FLOAT32 | HG_CAP_FLOAT64)
#else
#define NAIVE_C_CAPS                                                                              \
  (HG_CAP_CAUSAL | HG_CAP_CAUSAL_BOTTOM_RIGHT | HG_CAP_BOOL_MASK | HG_CAP_CROSS_LENGTHS |       \
   HG_CAP_FLOAT32 | HG_CAP_FLOAT64 | HG_CAP_GROUPED_KV | HG_CAP_WINDOW | HG_CAP_SOFTCAP | HG_CAP_SINKS)
#endif

/* Whether this call has sinks, and head h's logit (h = n mod H); C ABI 3 only. */
static int has_sinks(const hg_core_call* call) {
#if defined(NAIVE_C_TOP_LEFT_ONLY) || defined(NAIVE_C_ABI_V1)
  (void)call;
  return 0;
#else
  return call->sinks != NULL;
#endif
}
static double sink_of(const hg_core_call* call, int64_t n) {
  const hg_tensor* t = call->sinks;
  const int64_t at = (n % t->shape[0]) * t->strides[0];
  return t->dtype == HG_FLOAT64 ? ((const double*)t->data)[at] : (double)((const float*)t->data)[at];
}
/* The cap C (0: none); C ABI 3 only. */
static double cap_of(const hg_core_call* call) {
#if defined(NAIVE_C_TOP_LEFT_ONLY) || defined(NAIVE_C_ABI_V1)
  (void)call;
  return 0.0;
#else
  return call->softcap;
#endif
}

/* G: query heads per kv head (1 for a version-1 plugin, which never gets Hkv < H). */
static int64_t kv_group_of(const hg_core_call* call) {
#ifdef NAIVE_C_ABI_V1
  (void)call;
  return 1;
#else
  return hg_kv_group(call);
#endif
}

static int64_t leading_count(const hg_tensor* t) {
  int64_t n = 1;
  int a;
  for (a = 0; a < t->ndim - 2; ++a) n *= t->shape[a];
  return n;
}

static int fail(const hg_core_call* call, int code, const char* message) {
  snprintf(call->error, call->error_size, "%s", message);
  return code;
}

/* s[j] = scale * q_i . k_j for attended keys, -inf elsewhere; returns the max. */
static double score_row(const hg_core_call* call, int64_t qb, int64_t kb, int64_t mb, int64_t i,
                        double* s) {
  const int64_t tk = call->k.shape[call->k.ndim - 2], d = call->q.shape[call->q.ndim - 1];
  double m = -INFINITY;
  int64_t j, c;
  for (j = 0; j < tk; ++j) {
    double dot = 0.0;
    if (!attends(call, mb, i, j)) {
      s[j] = -INFINITY;
      continue;
    }
    for (c = 0; c < d; ++c) dot += load(&call->q, qb, i, c) * load(&call->k, kb, j, c);
    s[j] = dot * call->scale;
    if (cap_of(call) > 0) s[j] = cap_of(call) * tanh(s[j] / cap_of(call)); /* the scale inside tanh */
    if (s[j] > m) m = s[j];
  }
  return m;
}

/* out [..., Tq, dv], stats [..., Tq, 1] (the log-sum-exp) */
static int naive_forward(const hg_core_call* call, hg_tensor* out, hg_tensor* stats) {
  const int64_t n_lead = leading_count(&call->q);
  const int64_t tq = call->q.shape[call->q.ndim - 2], tk = call->k.shape[call->k.ndim - 2];
  const int64_t dv = call->v.shape[call->v.ndim - 1], group = kv_group_of(call);
  double* s;
  int64_t n, i, j, c;
  if (call->q.dtype != HG_FLOAT32 && call->q.dtype != HG_FLOAT64)
    return fail(call, 1, "naive_c: q must be float32 or float64");
  if (call->causal != HG_CAUSAL_NONE && call->causal != HG_CAUSAL_TOP_LEFT &&
      (!(NAIVE_C_CAPS & HG_CAP_CAUSAL_BOTTOM_RIGHT) || call->causal != HG_CAUSAL_BOTTOM_RIGHT))
    return fail(call, 3, "naive_c: causal setting not declared in its capabilities");
  s = (double*)malloc((size_t)(tk > 0 ? tk : 1) * sizeof(double));
  if (!s) return fail(call, 2, "naive_c: out of memory for a row of scores");
  for (n = 0; n < n_lead; ++n) {
    /* query head h of leading index n reads kv head h / G: kv leading index n / G */
    const int64_t qb = lead_offset(&call->q, n), kb = lead_offset(&call->k, n / group),
                  vb = lead_offset(&call->v, n / group), ob = lead_offset(out, n),
                  sb = lead_offset(stats, n), mb = call->mask ? lead_offset(call->mask, n) : 0;
    for (i = 0; i < tq; ++i) {
      double m = score_row(call, qb, kb, mb, i, s);
      double l = 0.0;
      if (has_sinks(call)) { /* the sink: one more term, no value */
        if (sink_of(call, n) > m) m = sink_of(call, n);
        l = exp(sink_of(call, n) - m);
      }
      if (m == -INFINITY) { /* every key masked: zeros, not NaN */
        for (c = 0; c < dv; ++c) store(out, ob, i, c, 0.0);
        store(stats, sb, i, 0, -INFINITY);
        continue;
      }
      for (j = 0; j < tk; ++j) {
        s[j] = exp(s[j] - m); /* exp(-inf) = 0 for masked keys */
        l += s[j];
      }
      for (c = 0; c < dv; ++c) {
        double acc = 0.0;
        for (j = 0; j < tk; ++j) acc += s[j] * load(&call->v, vb, j, c);
        store(out, ob, i, c, acc / l);
      }
      store(stats, sb, i, 0, m + log(l));
    }
  }
  free(s);
  return 0;
}

static int naive_backward(const hg_core_call* call, const hg_tensor* out, const hg_tensor* stats,
                          const hg_tensor* dout, hg_tensor* dq, hg_tensor* dk, hg_tensor* dv) {
  const int64_t n_lead = leading_count(&call->q);
  const int64_t tq = call->q.shape[call->q.ndim - 2], tk = call->k.shape[call->k.ndim - 2];
  const int64_t d = call->q.shape[call->q.ndim - 1], dvw = call->v.shape[call->v.ndim - 1];
  const int64_t group = kv_group_of(call);
  const double cap = cap_of(call);
  double* p;
  double* dtanh;
  int64_t n, i, j, c;
  p = (double*)malloc((size_t)(tk > 0 ? tk : 1) * sizeof(double));
  dtanh = (double*)malloc((size_t)(tk > 0 ? tk : 1) * sizeof(double));
  if (!p || !dtanh) {
    free(p);
    free(dtanh);
    return fail(call, 2, "naive_c: out of memory for a row of probabilities");
  }
  for (n = 0; n < n_lead; ++n) {
    /* dk, dv of kv leading index n / G: each of its G query heads adds its part */
    const int64_t qb = lead_offset(&call->q, n), kb = lead_offset(&call->k, n / group),
                  vb = lead_offset(&call->v, n / group), ob = lead_offset(out, n),
                  sb = lead_offset(stats, n), gb = lead_offset(dout, n),
                  mb = call->mask ? lead_offset(call->mask, n) : 0;
    const int64_t dqb = dq->data ? lead_offset(dq, n) : 0, dkb = dk->data ? lead_offset(dk, n / group) : 0,
                  dvb = dv->data ? lead_offset(dv, n / group) : 0;
    for (i = 0; i < tq; ++i) {
      const double lse = load(stats, sb, i, 0);
      double big_d = 0.0;
      if (lse == -INFINITY) continue; /* a fully masked row sends no gradient */
      /* in the forward pass this was: p_ij = exp(s_ij - m) / l */
      score_row(call, qb, kb, mb, i, p);
      for (j = 0; j < tk; ++j) {
        dtanh[j] = cap > 0 && p[j] != -INFINITY ? 1.0 - (p[j] / cap) * (p[j] / cap) : 1.0;
        p[j] = exp(p[j] - lse);
      }
      for (c = 0; c < dvw; ++c) big_d += load(dout, gb, i, c) * load(out, ob, i, c);
#if !defined(NAIVE_C_TOP_LEFT_ONLY) && !defined(NAIVE_C_ABI_V1)
      if (has_sinks(call) && call->dsinks && call->dsinks->data) { /* dsigma_h -= P_sink D */
        const int64_t at = (n % call->dsinks->shape[0]) * call->dsinks->strides[0];
        const double g = -exp(sink_of(call, n) - lse) * big_d;
        if (call->dsinks->dtype == HG_FLOAT64)
          ((double*)call->dsinks->data)[at] += g;
        else
          ((float*)call->dsinks->data)[at] += (float)g;
      }
#endif
      for (j = 0; j < tk; ++j) {
        double dp = 0.0, ds;
        if (p[j] == 0.0) continue;
        for (c = 0; c < dvw; ++c) {
          const double g = load(dout, gb, i, c);
          dp += g * load(&call->v, vb, j, c);
          if (dv->data) add_to(dv, dvb, j, c, p[j] * g);
        }
        ds = p[j] * (dp - big_d) * dtanh[j] * call->scale;
        for (c = 0; c < d; ++c) {
          if (dq->data) add_to(dq, dqb, i, c, ds * load(&call->k, kb, j, c));
          if (dk->data) add_to(dk, dkb, j, c, ds * load(&call->q, qb, i, c));
        }
      }
    }
  }
  free(p);
  free(dtanh);
  return 0;
}

static const hg_c_plugin kNaive = {
#if defined(NAIVE_C_TOP_LEFT_ONLY)
    "naive_c_top_left",
    "1.0.0",
    "naive attention core in C99 (C ABI), top-left causal only",
#elif defined(NAIVE_C_ABI_V1)
    "naive_c_v1",
    "1.0.0",
    "naive attention core in C99 built against C ABI 1 (no grouped KV heads)",
#else
    "naive_c",
    "1.0.0",
    "naive attention core in C99 with a hand-written backward (C ABI)",
#endif
    NAIVE_C_CAPS,
    1, /* stats_per_row: the log-sum-exp */
    naive_forward,
    naive_backward,
};

#ifdef NAIVE_C_ABI_V1
HG_C_EXPORT int headgrad_c_abi_version(void) { return 1; }
#else
HG_C_EXPORT int headgrad_c_abi_version(void) { return HEADGRAD_C_ABI_VERSION; }
#endif
HG_C_EXPORT const hg_c_plugin* headgrad_c_plugin(void) { return &kNaive; }
