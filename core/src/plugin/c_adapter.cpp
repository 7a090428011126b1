// A C plugin seen as an Attention: core_forward is one custom op whose forward
// and backward call the plugin's C functions over raw strided buffers.
//
// Shape legend: [...] leading dims (broadcast over q, k, v), Tq/Tk query/key
// lengths, d query/key width, dv value width, S stats per query row; H query
// heads and Hkv kv heads (dim -3), G = H / Hkv.
#include "plugin/c_adapter.hpp"

#include <array>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "headgrad/kernels.hpp"

namespace headgrad::detail {

namespace {

hg_dtype to_c_dtype(DType dtype) {
  switch (dtype) {
    case DType::float32: return HG_FLOAT32;
    case DType::float64: return HG_FLOAT64;
    case DType::boolean: return HG_BOOL;
    case DType::bfloat16:
    case DType::float16: break;  // refused before any call (the C ABI has no 16-bit dtype)
  }
  throw std::logic_error("to_c_dtype: unknown dtype");
}

// An hg_tensor over a Tensor's buffer. It points into its own shape and
// strides, so it is neither copied nor moved; build it where it is used.
struct CView {
  Shape shape, strides;
  hg_tensor t{};

  explicit CView(const Tensor& x) {
    if (!x.defined()) {
      t.data = nullptr;
      return;
    }
    shape = x.shape();
    strides = x.strides();
    t.dtype = to_c_dtype(x.dtype());
    t.ndim = static_cast<std::int32_t>(shape.size());
    t.shape = shape.data();
    t.strides = strides.data();
    // hg_tensor has one (writable) pointer for inputs and outputs alike; the
    // outputs it is written through are fresh tensors made by this adapter.
    t.data = static_cast<char*>(const_cast<void*>(x.storage()->data())) +
             x.offset() * static_cast<std::int64_t>(dtype_size(x.dtype()));
  }
  CView(const CView&) = delete;
  CView& operator=(const CView&) = delete;
};

Shape lead_of(const Tensor& x) { return lead_dims(x.shape()); }

// What a call needs besides q, k, v: fixed when core_forward is called, and
// captured by the op's forward and backward.
struct CallSettings {
  Shape lead;   // [...] after broadcasting q, k, v (and the mask)
  Shape kv_lead;  // of k and v: lead with Hkv in place of H (= lead when G = 1)
  Tensor mask;  // bool [..., Tq, Tk] (a broadcast view), or undefined
  std::int32_t causal = HG_CAUSAL_NONE;  // HG_CAUSAL_*
  double scale = 1.0;
  // C ABI 3: the window (flags HG_WINDOW_*), the cap; sinks ride as the op's 4th input
  std::int32_t window_flags = 0;
  std::int64_t window_left = 0, window_right = 0, window_offset = 0;
  double softcap = 0;
};

class CAttention final : public Attention {
 public:
  CAttention(const hg_c_plugin* desc, std::shared_ptr<const void> library, int abi_version)
      : desc_(desc), library_(std::move(library)) {
    info_.name = desc->name;
    info_.version = desc->version;
    info_.description = desc->description;
    const std::uint32_t f = desc->capabilities;
    Capabilities& c = info_.capabilities;
    c.mha = false;
    c.core = true;
    c.causal = (f & HG_CAP_CAUSAL) != 0;
    c.bool_mask = (f & HG_CAP_BOOL_MASK) != 0;
    c.cross_lengths = (f & HG_CAP_CROSS_LENGTHS) != 0;
    c.float32 = (f & HG_CAP_FLOAT32) != 0;
    c.float64 = (f & HG_CAP_FLOAT64) != 0;
    bottom_right_ = (f & HG_CAP_CAUSAL_BOTTOM_RIGHT) != 0;
    // The bit means nothing to a plugin built against C ABI 1.
    c.grouped_kv = abi_version >= 2 && (f & HG_CAP_GROUPED_KV) != 0;
    // Nor these to one built against C ABI 1 or 2 (its call struct ends before them).
    c.window = abi_version >= 3 && (f & HG_CAP_WINDOW) != 0;
    c.softcap = abi_version >= 3 && (f & HG_CAP_SOFTCAP) != 0;
    c.sinks = abi_version >= 3 && (f & HG_CAP_SINKS) != 0;
    c.extra = {"c-abi"};
  }

  PluginInfo info() const override { return info_; }

  // q [..., Tq, d], k [..., Tk, d], v [..., Tk, dv] -> [..., Tq, dv]
  Variable core_forward(const Variable& q, const Variable& k, const Variable& v,
                        const AttentionSpec& spec) const override {
    const CallSettings settings = settings_for(q.data(), k.data(), v.data(), spec);
    // The op's closures hold the library: a graph may outlive the registry.
    const hg_c_plugin* desc = desc_;
    const std::shared_ptr<const void> library = library_;
    const std::string name = info_.name;
    std::vector<Variable> inputs = {q, k, v};
    if (spec.sinks.defined()) {  // [H] with q's dtype, a 4th input: dsinks flows back to it
      const std::int64_t heads = q.dim() >= 3 ? settings.lead.back() : 1;
      if (spec.sinks.dim() != 1 || spec.sinks.numel() != heads)
        throw std::invalid_argument("plugin '" + name + "' (C ABI): sinks " + shape_str(spec.sinks.shape()) +
                                    ", expected [" + std::to_string(heads) + "]: one logit per query head");
      inputs.push_back(spec.sinks.dtype() == q.dtype() ? spec.sinks : cast(spec.sinks, q.dtype()));
    }
    return custom_op(
        name + ".core", inputs,
        [desc, library, name, settings](CustomOpContext& ctx, const std::vector<Tensor>& in) {
          const Tensor qx = expand_lead(in[0], settings.lead), kx = expand_lead(in[1], settings.kv_lead),
                       vx = expand_lead(in[2], settings.kv_lead);
          const std::int64_t tq = qx.size(-2), dv = vx.size(-1);
          Tensor out = Tensor::empty(with_last2(settings.lead, tq, dv), qx.dtype());
          Tensor stats;
          if (desc->stats_per_row > 0)
            stats = Tensor::empty(with_last2(settings.lead, tq, desc->stats_per_row), qx.dtype());
          const CView cq(qx), ck(kx), cv(vx), cmask(settings.mask);
          const Tensor sinks = in.size() > 3 ? in[3].contiguous() : Tensor();
          const CView csinks(sinks);
          CView cout_(out), cstats(stats);
          std::array<char, 1024> error{};
          hg_core_call call = make_call(cq, ck, cv, cmask, settings, error);
          call.sinks = sinks.defined() ? &csinks.t : nullptr;
          const int rc = desc->core_forward(&call, &cout_.t, &cstats.t);
          if (rc != 0) throw_failure(name, "core_forward", rc, error);
          ctx.saved = {in[0], in[1], in[2], out, stats, sinks};
          return out;
        },
        [desc, library, name, settings](const CustomOpContext& ctx, const Tensor& dout) {
          if (!desc->core_backward)
            throw std::runtime_error("plugin '" + name +
                                     "' (C ABI) has no core_backward: it cannot give gradients");
          const Tensor &q0 = ctx.saved[0], &k0 = ctx.saved[1], &v0 = ctx.saved[2];
          const Tensor qx = expand_lead(q0, settings.lead), kx = expand_lead(k0, settings.kv_lead),
                       vx = expand_lead(v0, settings.kv_lead);
          auto grad_for = [&](std::size_t i, const Tensor& x) {
            return ctx.needs_input_grad[i] ? Tensor::zeros(x.shape(), x.dtype()) : Tensor();
          };
          Tensor dq = grad_for(0, qx), dk = grad_for(1, kx), dv = grad_for(2, vx);
          const Tensor& sinks = ctx.saved[5];
          Tensor dsinks = sinks.defined() ? grad_for(3, sinks) : Tensor();
          const CView cq(qx), ck(kx), cv(vx), cmask(settings.mask), csinks(sinks);
          const CView cout_(ctx.saved[3]), cstats(ctx.saved[4]), cdout(dout);
          CView cdq(dq), cdk(dk), cdv(dv), cdsinks(dsinks);
          std::array<char, 1024> error{};
          hg_core_call call = make_call(cq, ck, cv, cmask, settings, error);
          call.sinks = sinks.defined() ? &csinks.t : nullptr;
          if (sinks.defined()) {
            if (!dsinks.defined()) cdsinks.t = csinks.t, cdsinks.t.data = nullptr;  // its shape, no data: not needed
            call.dsinks = &cdsinks.t;
          }
          const int rc = desc->core_backward(&call, &cout_.t, &cstats.t, &cdout.t, &cdq.t, &cdk.t, &cdv.t);
          if (rc != 0) throw_failure(name, "core_backward", rc, error);
          // Gradients of broadcast leading dims are summed back to each input's shape
          // (the plugin has summed dk, dv over each kv head's group).
          auto reduce = [](const Tensor& g, const Tensor& x) {
            return !g.defined() || g.shape() == x.shape() ? g : kernels::sum_to(g, x.shape());
          };
          std::vector<Tensor> grads{reduce(dq, q0), reduce(dk, k0), reduce(dv, v0)};
          if (sinks.defined()) grads.push_back(dsinks);
          return grads;
        });
  }

 private:
  CallSettings settings_for(const Tensor& q, const Tensor& k, const Tensor& v,
                            const AttentionSpec& spec) const {
    const std::string who = "plugin '" + info_.name + "' (C ABI)";
    const Capabilities& caps = info_.capabilities;
    if (q.dim() < 2 || k.dim() < 2 || v.dim() < 2 || q.size(-1) != k.size(-1) ||
        k.size(-2) != v.size(-2))
      throw std::invalid_argument(who + ": q " + shape_str(q.shape()) + ", k " + shape_str(k.shape()) +
                                  ", v " + shape_str(v.shape()) +
                                  " are not [..., Tq, d], [..., Tk, d], [..., Tk, dv]");
    if (q.dtype() != k.dtype() || q.dtype() != v.dtype())
      throw std::invalid_argument(who + ": q, k, v have dtypes " + std::string(dtype_name(q.dtype())) +
                                  ", " + std::string(dtype_name(k.dtype())) + ", " +
                                  std::string(dtype_name(v.dtype())) + "; they must share one");
    if ((q.dtype() == DType::float32 && !caps.float32) || (q.dtype() == DType::float64 && !caps.float64) ||
        q.dtype() == DType::boolean || is_16bit(q.dtype()))  // the C ABI has no 16-bit dtype
      throw UnsupportedError(who + " does not support " + std::string(dtype_name(q.dtype())));
    if (spec.causal && !caps.causal) throw UnsupportedError(who + " does not support causal masking");
    if (spec.mask.defined() && !caps.bool_mask) throw UnsupportedError(who + " does not support a bool mask");
    if (q.size(-2) != k.size(-2) && !caps.cross_lengths)
      throw UnsupportedError(who + " does not support Tq != Tk");
    if (spec.dropout_p != 0.0) throw UnsupportedError(who + " does not support dropout");
    // windows, caps, sinks (C ABI 3): refused rather than silently left out
    if (spec.window.enabled() && !caps.window)
      throw UnsupportedError(who + " does not support a sliding window (HG_CAP_WINDOW, C ABI 3)");
    if (spec.softcap > 0 && !caps.softcap)
      throw UnsupportedError(who + " does not support soft-capping (HG_CAP_SOFTCAP, C ABI 3)");
    if (spec.sinks.defined() && !caps.sinks)
      throw UnsupportedError(who + " does not support attention sinks (HG_CAP_SINKS, C ABI 3)");

    CallSettings s;
    // Grouped KV heads: k and v agree on Hkv heads at dim -3, fewer than q's H
    // (the rule fused_sdpa's kernel reads). Broadcast then sees Hkv as H.
    Shape lead_k = lead_of(k), lead_v = lead_of(v);
    std::int64_t group = 1;
    if (q.dim() >= 3 && k.dim() >= 3 && v.dim() >= 3 && k.size(-3) == v.size(-3) && k.size(-3) < q.size(-3)) {
      const std::int64_t h = q.size(-3), hkv = k.size(-3);
      if (h % hkv != 0)
        throw std::invalid_argument(who + ": q has H = " + std::to_string(h) + " heads (dim -3) and k, v have Hkv = " +
                                    std::to_string(hkv) + "; grouped KV heads need H to be a multiple of Hkv");
      // Before C ABI 2 one kv head was plain broadcasting (stride 0), which an
      // old plugin reads correctly; more than one needs the capability.
      if (!caps.grouped_kv && hkv > 1)
        throw UnsupportedError(who + " does not support grouped KV heads (HG_CAP_GROUPED_KV, C ABI 2): k and v have Hkv = " +
                               std::to_string(hkv) + " heads where q has H = " + std::to_string(h));
      if (caps.grouped_kv) {
        group = h / hkv;
        lead_k.back() = h;
        lead_v.back() = h;
      }
    }
    s.lead = broadcast_shapes(lead_of(q), broadcast_shapes(lead_k, lead_v, "c plugin core"), "c plugin core");
    s.scale = spec.scale_for(q.size(-1));
    const std::int64_t tq = q.size(-2), tk = k.size(-2);
    if (spec.mask.defined() && spec.mask.dtype() != DType::boolean)
      throw std::invalid_argument(who + ": the attention mask must be bool (True = attend), got " +
                                  std::string(dtype_name(spec.mask.dtype())));
    // A plugin that does not declare bottom-right never sees it: with Tq = Tk
    // it is top-left, otherwise it goes as the bool mask attention_mask builds.
    AttentionSpec as_given = spec;
    if (spec.causal) {
      const bool bottom_right = spec.causal_shift(tq, tk) != 0;
      if (!bottom_right) {
        s.causal = HG_CAUSAL_TOP_LEFT;
      } else if (bottom_right_) {
        s.causal = HG_CAUSAL_BOTTOM_RIGHT;
      } else if (caps.bool_mask) {
        as_given.mask = attention_mask(spec, tq, tk);
        as_given.causal = false;
      } else {
        throw UnsupportedError(who + " does not support a bottom-right causal mask with Tq != Tk "
                               "(neither HG_CAP_CAUSAL_BOTTOM_RIGHT nor HG_CAP_BOOL_MASK)");
      }
    }
    if (as_given.mask.defined()) {
      const Shape mask_shape = with_last2(s.lead, q.size(-2), k.size(-2));
      // The mask may add leading dims of its own: they join the broadcast.
      const Shape full = broadcast_shapes(as_given.mask.shape(), mask_shape, "c plugin mask");
      s.lead = Shape(full.begin(), full.end() - 2);
      s.mask = as_given.mask.expand(full);
    }
    s.kv_lead = s.lead;
    if (group > 1) s.kv_lead.back() /= group;  // heads are lead's last dim (dim -3 of q)
    if (spec.window.enabled()) {
      check_window(spec.window, who);
      s.window_flags = (spec.window.left ? HG_WINDOW_LEFT : 0) | (spec.window.right ? HG_WINDOW_RIGHT : 0);
      s.window_left = spec.window.left.value_or(0);
      s.window_right = spec.window.right.value_or(0);
      s.window_offset = window_offset(spec, tq, tk);
    }
    s.softcap = spec.softcap;
    return s;
  }

  static Tensor expand_lead(const Tensor& x, const Shape& lead) {
    const Shape want = with_last2(lead, x.size(-2), x.size(-1));
    return x.shape() == want ? x : x.expand(want);
  }

  static hg_core_call make_call(const CView& q, const CView& k, const CView& v, const CView& mask,
                                const CallSettings& s, std::array<char, 1024>& error) {
    hg_core_call call{};
    call.q = q.t;
    call.k = k.t;
    call.v = v.t;
    call.mask = s.mask.defined() ? &mask.t : nullptr;
    call.causal = s.causal;
    call.scale = s.scale;
    call.error = error.data();
    call.error_size = error.size();
    call.window_flags = s.window_flags;
    call.window_left = s.window_left;
    call.window_right = s.window_right;
    call.window_offset = s.window_offset;
    call.softcap = s.softcap;
    return call;
  }

  [[noreturn]] static void throw_failure(const std::string& name, const char* fn, int rc,
                                         const std::array<char, 1024>& error) {
    const std::size_t n = ::strnlen(error.data(), error.size());
    const std::string message = n ? std::string(error.data(), n) : "(no message)";
    throw std::runtime_error("plugin '" + name + "': " + fn + " failed with code " + std::to_string(rc) +
                             ": " + message);
  }

  const hg_c_plugin* desc_;
  std::shared_ptr<const void> library_;
  PluginInfo info_;
  bool bottom_right_ = false;  // HG_CAP_CAUSAL_BOTTOM_RIGHT: call->causal may be 2
};

}  // namespace

std::shared_ptr<Attention> make_c_attention(const hg_c_plugin* desc, std::shared_ptr<const void> library,
                                            int abi_version) {
  if (!desc) throw std::invalid_argument("headgrad_c_plugin() returned NULL");
  if (!desc->name || !*desc->name) throw std::invalid_argument("the C plugin declares an empty name");
  const std::string who = std::string("C plugin '") + desc->name + "'";
  if (!desc->version || !desc->description)
    throw std::invalid_argument(who + ": version and description must not be NULL");
  if (!desc->core_forward) throw std::invalid_argument(who + ": core_forward is NULL");
  if (desc->stats_per_row < 0)
    throw std::invalid_argument(who + ": stats_per_row is negative (" + std::to_string(desc->stats_per_row) + ")");
  if (!(desc->capabilities & (HG_CAP_FLOAT32 | HG_CAP_FLOAT64)))
    throw std::invalid_argument(who + ": declares neither HG_CAP_FLOAT32 nor HG_CAP_FLOAT64");
  return std::make_shared<CAttention>(desc, std::move(library), abi_version);
}

}  // namespace headgrad::detail
