// The custom-op example of docs/plugin-guide.md ("Raw data in a custom op"),
// compiled and tested by tests/test_doc_examples.cpp, which also checks that
// the guide shows exactly the lines between the two [softcap] markers.
#pragma once

// [softcap]
#include <cmath>
#include <headgrad/plugin.hpp>

namespace myattn {
using namespace headgrad;

// Logit soft-capping, as Gemma 2 applies it to attention scores:
// y = cap * tanh(x / cap), elementwise.  x [...] -> [...]
inline Variable softcap(const Variable& x, double cap) {
  return custom_op("softcap", {x},
      [cap](CustomOpContext& ctx, const std::vector<Tensor>& in) {
        const Tensor x = in[0].contiguous();             // a view may be strided: make it dense first
        Tensor y = Tensor::empty(x.shape(), x.dtype());  // a fresh tensor: ours to write
        dispatch_float(x.dtype(), "softcap", [&]<class T>() {  // T = float or double
          const T* src = x.data<T>();                    // read-only: the version stays
          T* dst = y.mutable_data<T>();                  // a write: bumps y's version, once
          for (std::int64_t i = 0; i < x.numel(); ++i)
            dst[i] = static_cast<T>(cap * std::tanh(src[i] / cap));
        });
        ctx.saved = {y};  // saved after the last write: the version recorded is final
        ctx.scalars = {cap};
        return y;
      },
      [](const CustomOpContext& ctx, const Tensor& dout) {
        // in the forward pass this was: y = cap tanh(x / cap), so dy/dx = 1 - (y / cap)^2
        const Tensor& y = ctx.saved[0];
        const double cap = ctx.scalars[0];
        const Tensor g = dout.contiguous();
        Tensor dx = Tensor::empty(y.shape(), y.dtype());
        dispatch_float(y.dtype(), "softcap backward", [&]<class T>() {
          const T* yv = y.data<T>();
          const T* gv = g.data<T>();
          T* out = dx.mutable_data<T>();
          for (std::int64_t i = 0; i < y.numel(); ++i) {
            const double t = static_cast<double>(yv[i]) / cap;
            out[i] = static_cast<T>(static_cast<double>(gv[i]) * (1.0 - t * t));
          }
        });
        return std::vector<Tensor>{dx};
      });
}

}  // namespace myattn
// [softcap]
