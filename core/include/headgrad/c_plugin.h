/* The headgrad C plugin ABI: an attention core written in C, or a CUDA/other
 * kernel wrapped in C, without any C++ on the plugin's side. Plain C99; also
 * compiles as C++.
 *
 *   #include <headgrad/c_plugin.h>
 *
 *   static int my_forward(const hg_core_call* call, hg_tensor* out, hg_tensor* stats) {...}
 *   static int my_backward(const hg_core_call* call, const hg_tensor* out,
 *                          const hg_tensor* stats, const hg_tensor* dout,
 *                          hg_tensor* dq, hg_tensor* dk, hg_tensor* dv) {...}
 *
 *   static const hg_c_plugin kPlugin = {
 *       "my_attention", "0.1.0", "my kernel, wrapped in C",
 *       HG_CAP_CAUSAL | HG_CAP_BOOL_MASK | HG_CAP_FLOAT64,
 *       1,                          // stats_per_row: one log-sum-exp per query row
 *       my_forward, my_backward};
 *   HG_C_EXPORT int headgrad_c_abi_version(void) { return HEADGRAD_C_ABI_VERSION; }
 *   HG_C_EXPORT const hg_c_plugin* headgrad_c_plugin(void) { return &kPlugin; }
 *
 * headgrad's loader sees the two symbols (its own names, apart from the C++
 * SDK's), checks the version first, then wraps the plugin as an Attention with the core level only
 * (no projections, so no biases: a `bias: true` case, MHA level, is refused naming `mha` and `bias`):
 * core_forward becomes a custom op whose forward calls `core_forward` and whose
 * backward calls `core_backward`.
 *
 * Shape legend: [...] leading dims (batch, heads), Tq/Tk query/key lengths,
 * d query/key width, dv value width, S = stats_per_row.
 *
 * The contract
 * - Every tensor has the same leading dims [...]: headgrad broadcasts q, k, v
 *   and the mask before the call (a broadcast dim has stride 0). The one
 *   exception is grouped KV heads, below.
 * - Grouped KV heads (GQA, MQA; C ABI 2, only for a plugin that declares
 *   HG_CAP_GROUPED_KV): k and v may have Hkv heads at dim -3 where q has H,
 *   [..., H, Tq, d] against [..., Hkv, Tk, d], H a multiple of Hkv, every
 *   other leading dim the same. Query head h reads kv head h / G, G = H / Hkv
 *   (PyTorch's repeat_interleave and enable_gqa, HF's repeat_kv; not h mod Hkv).
 *   Heads being the last leading dim, leading index n of q (and out, dout, dq)
 *   reads leading index n / G of k and v: hg_kv_group(call) gives G (1 when k
 *   has q's heads). dk and dv have k's and v's shapes: the gradient of a kv
 *   head is the SUM over its G query heads. A plugin without the capability
 *   never sees Hkv < H: headgrad refuses the call naming the capability.
 * - Inputs (q, k, v, mask, dout) may be strided views: read element
 *   (i0, ..., in) at data[i0 * strides[0] + ... + in * strides[n]]. Strides are
 *   in elements, not bytes, and are >= 0. Inputs are read only.
 * - Outputs (out, stats, dq, dk, dv) are allocated by headgrad, contiguous
 *   (row-major), and owned by headgrad: write into them, never free them, keep no
 *   pointer to them after returning. dq, dk, dv are zero-filled (write or
 *   accumulate); one whose gradient is not needed has data == NULL: skip it.
 * - out and stats from the forward are handed back to the backward unchanged:
 *   stats is the place for what the backward needs (FlashAttention's log-sum-exp).
 * - q, k, v, out, stats, dout, dq, dk, dv share one dtype (float32 or float64);
 *   the mask is HG_BOOL (one byte per element, 0 or 1; 1 = attend).
 * - Causal: query i attends key j when j <= i (top-left aligned when Tq != Tk).
 *   With a mask too, a key is attended when both allow it. A query row with no
 *   attended key gives zeros (out and gradients), not NaN.
 * - Sliding windows, soft-capping, sinks (C ABI 3, each only for a plugin that
 *   declares HG_CAP_WINDOW, HG_CAP_SOFTCAP, HG_CAP_SINKS; a plugin without one
 *   never sees it: headgrad refuses the call naming the capability). With
 *   call->window_flags, key j is in query i's window when p_i - window_left <= j
 *   (HG_WINDOW_LEFT) and j <= p_i + window_right (HG_WINDOW_RIGHT), p_i = i +
 *   window_offset (Tk - Tq under bottom-right causal, else 0); a key is
 *   attended when causal, the window and the mask all allow it. With
 *   call->softcap = C > 0 every scaled score s becomes C tanh(s / C) before any
 *   mask (the backward multiplies ds by 1 - tanh^2). With call->sinks (an
 *   [H] tensor, H = q's dim -3, 1 without one; leading index n of q is query
 *   head n mod H) each row of head h has one more softmax term exp(sigma_h)
 *   with no value; a row with no attended key then gives out 0; the backward
 *   writes dsinks_h = -sum over the rows of head h of P_sink D (P_sink =
 *   exp(sigma_h - lse), D = dout . out) into call->dsinks (zero-filled, [H];
 *   data NULL when not needed or in the forward).
 * - Return 0 on success. On failure return a nonzero code and write a one-line
 *   message into call->error (at most call->error_size bytes, NUL included):
 *   headgrad raises it as an error naming the plugin.
 * - Functions may be called from several threads at once, each call with its
 *   own buffers: keep no mutable global state. They must not exit or abort.
 */
#ifndef HEADGRAD_C_PLUGIN_H
#define HEADGRAD_C_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

/* Bumped whenever a type below changes layout or meaning. A C plugin's
 * headgrad_c_abi_version() returns this; it is apart from the C++ SDK's
 * version (<headgrad/abi.hpp>), which moves with the C++ types. The loader
 * skips a mismatch with a message. Only C crosses this boundary: a C plugin
 * may be built by any C compiler for the same platform. */
#define HEADGRAD_C_ABI_VERSION 3
/* The oldest version headgrad still loads. Version 2 only added
 * HG_CAP_GROUPED_KV and hg_kv_group(), changing no layout: a plugin built
 * against version 1 runs as it did, and is refused grouped KV heads (a
 * capability bit headgrad does not read from a version-1 plugin). Version 3
 * added HG_CAP_WINDOW, HG_CAP_SOFTCAP, HG_CAP_SINKS and fields at the END of
 * hg_core_call: an older plugin reads the prefix it knows and is refused a
 * window, a cap or sinks (bits headgrad does not read from it). */
#define HEADGRAD_C_ABI_MIN_VERSION 1

#if defined(_WIN32)
#define HG_C_EXPORT_ATTR __declspec(dllexport)
#else
#define HG_C_EXPORT_ATTR __attribute__((visibility("default")))
#endif
#ifdef __cplusplus
#define HG_C_EXPORT extern "C" HG_C_EXPORT_ATTR
#else
#define HG_C_EXPORT HG_C_EXPORT_ATTR
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum hg_dtype { HG_FLOAT32 = 0, HG_FLOAT64 = 1, HG_BOOL = 2 } hg_dtype;

/* Capabilities: the core level is implied (a C plugin has no mha level). */
#define HG_CAP_CAUSAL 0x01u        /* call->causal may be 1 */
#define HG_CAP_BOOL_MASK 0x02u     /* call->mask may be non-NULL */
#define HG_CAP_CROSS_LENGTHS 0x04u /* Tq != Tk */
#define HG_CAP_FLOAT32 0x08u
#define HG_CAP_FLOAT64 0x10u
#define HG_CAP_CAUSAL_BOTTOM_RIGHT 0x20u /* call->causal may be HG_CAUSAL_BOTTOM_RIGHT */
#define HG_CAP_GROUPED_KV 0x40u /* C ABI 2: k, v may have Hkv < H heads (dim -3); see the contract */
#define HG_CAP_WINDOW 0x80u   /* C ABI 3: call->window_flags may be nonzero */
#define HG_CAP_SOFTCAP 0x100u /* C ABI 3: call->softcap may be > 0 */
#define HG_CAP_SINKS 0x200u   /* C ABI 3: call->sinks may be non-NULL (and call->dsinks wanted) */

/* call->window_flags: which bounds of the window are set */
#define HG_WINDOW_LEFT 0x1
#define HG_WINDOW_RIGHT 0x2

/* call->causal. A plugin without HG_CAP_CAUSAL_BOTTOM_RIGHT never sees 2:
 * headgrad passes bottom-right as 1 when Tq == Tk (the same mask) and
 * otherwise as a bool mask (HG_CAP_BOOL_MASK), or refuses the call. */
#define HG_CAUSAL_NONE 0
#define HG_CAUSAL_TOP_LEFT 1     /* query i attends keys j <= i (PyTorch's is_causal) */
#define HG_CAUSAL_BOTTOM_RIGHT 2 /* j <= i + (Tk - Tq) (FlashAttention 2.1+) */

/* A strided view of a buffer. */
typedef struct hg_tensor {
  int32_t dtype;          /* hg_dtype */
  int32_t ndim;
  const int64_t* shape;   /* [ndim] */
  const int64_t* strides; /* [ndim], in elements */
  void* data;             /* the first element; NULL: not needed (gradients only) */
} hg_tensor;

/* One call's inputs and settings, the same for forward and backward. */
typedef struct hg_core_call {
  hg_tensor q;            /* [..., Tq, d] */
  hg_tensor k;            /* [..., Tk, d] */
  hg_tensor v;            /* [..., Tk, dv] */
  const hg_tensor* mask;  /* NULL, or HG_BOOL [..., Tq, Tk], 1 = attend */
  int32_t causal;         /* HG_CAUSAL_*: 0 none, 1 top-left, 2 bottom-right */
  double scale;           /* scores = q k^T * scale (headgrad resolves the 1/sqrt(d) default) */
  char* error;            /* message buffer for a failure */
  size_t error_size;
  /* C ABI 3 (the contract above); zero / NULL for a plugin that does not declare them */
  int32_t window_flags;    /* HG_WINDOW_LEFT | HG_WINDOW_RIGHT: the bounds that are set */
  int64_t window_left;     /* p_i - window_left <= j */
  int64_t window_right;    /* j <= p_i + window_right */
  int64_t window_offset;   /* p_i = i + window_offset */
  double softcap;          /* C > 0: s = C tanh(s / C); 0: off */
  const hg_tensor* sinks;  /* NULL, or [H]: one logit per query head */
  hg_tensor* dsinks;       /* backward: [H] zero-filled (data NULL: not needed); forward: NULL */
} hg_core_call;

/* out [..., Tq, dv]; stats [..., Tq, S] (data NULL when S == 0). */
typedef int (*hg_core_forward_fn)(const hg_core_call* call, hg_tensor* out, hg_tensor* stats);

/* dout [..., Tq, dv] (strided) -> dq [..., Tq, d], dk [..., Tk, d], dv [..., Tk, dv]. */
typedef int (*hg_core_backward_fn)(const hg_core_call* call, const hg_tensor* out,
                                   const hg_tensor* stats, const hg_tensor* dout, hg_tensor* dq,
                                   hg_tensor* dk, hg_tensor* dv);

/* What headgrad_c_plugin() returns: static data that lives as long as the library. */
typedef struct hg_c_plugin {
  const char* name;         /* unique; what suites write in `compare:` */
  const char* version;
  const char* description;  /* one line */
  uint32_t capabilities;    /* HG_CAP_* */
  int32_t stats_per_row;    /* S: values per query row kept for the backward (0: none) */
  hg_core_forward_fn core_forward;
  hg_core_backward_fn core_backward;  /* NULL: forward only (asking for a gradient is an error) */
} hg_c_plugin;

/* G = H / Hkv, the query heads per kv head of a call (1 without grouped KV
 * heads): q's leading index n reads k's and v's leading index n / G. */
static inline int64_t hg_kv_group(const hg_core_call* call) {
  if (call->q.ndim < 3 || call->k.ndim < 3) return 1;
  return call->q.shape[call->q.ndim - 3] / call->k.shape[call->k.ndim - 3];
}

/* The symbols a C plugin exports (declared here so their types are checked). */
HG_C_EXPORT_ATTR int headgrad_c_abi_version(void);
HG_C_EXPORT_ATTR const hg_c_plugin* headgrad_c_plugin(void);

#ifdef __cplusplus
}
#endif

#endif /* HEADGRAD_C_PLUGIN_H */
