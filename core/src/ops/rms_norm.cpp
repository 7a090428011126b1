// RMSNorm, the QK-norm of current models: y = x / rms(x) * g over the last
// dim, rms(x) = sqrt(mean(x^2) + eps), g = w or 1 + w.
//
// One op with a hand-written backward rather than a chain of engine ops: the
// row statistics are taken in float64 whatever the dtype, so a 16-bit or
// float32 input is rounded once (on the way out), not after each of mean,
// +eps, sqrt and the two products. With x^ = x / rms and gy = dy * g:
//   dx = (gy - x^ mean(gy x^)) / rms       (mean over the same row)
//   dw = sum over every row of dy x^       (1 + w changes g, not dw)
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "headgrad/ops.hpp"

namespace headgrad {

namespace {

struct Rows {
  std::int64_t rows = 0, n = 0;
};

Rows rows_of(const Tensor& x) {
  Rows r;
  r.n = x.size(-1);
  r.rows = r.n == 0 ? 0 : x.numel() / r.n;
  return r;
}

// x and w as contiguous float64, and the gain g (w or 1 + w).
std::vector<double> gains(const Tensor& w, bool one_plus_w) {
  std::vector<double> g = w.to_vector();
  if (one_plus_w)
    for (double& v : g) v += 1.0;
  return g;
}

}  // namespace

Variable rms_norm(const Variable& x, const Variable& w, double eps, bool one_plus_w) {
  if (x.dim() < 1 || w.dim() != 1 || w.size(0) != x.size(-1))
    throw std::invalid_argument("rms_norm: x " + shape_str(x.shape()) + " and gain " + shape_str(w.shape()) +
                                " are not [..., n] and [n]");
  if (!(eps >= 0.0) || !std::isfinite(eps))
    throw std::invalid_argument("rms_norm: eps must be finite and >= 0, got " + std::to_string(eps));
  const Tensor x64 = x.data().to(DType::float64).contiguous();
  const std::vector<double> g = gains(w.data(), one_plus_w);
  const Rows r = rows_of(x64);
  Tensor y = Tensor::empty(x64.shape(), DType::float64);
  Tensor inv = Tensor::empty({r.rows}, DType::float64);  // 1 / rms per row, for the backward
  const double* xs = x64.data<double>();
  double* ys = y.mutable_data<double>();
  double* is = inv.mutable_data<double>();
  for (std::int64_t i = 0; i < r.rows; ++i) {
    const double* row = xs + i * r.n;
    double ss = 0.0;
    for (std::int64_t j = 0; j < r.n; ++j) ss += row[j] * row[j];
    const double rinv = 1.0 / std::sqrt(ss / static_cast<double>(r.n) + eps);
    is[i] = rinv;
    for (std::int64_t j = 0; j < r.n; ++j) ys[i * r.n + j] = row[j] * rinv * g[static_cast<std::size_t>(j)];
  }
  const DType x_dtype = x.dtype(), w_dtype = w.dtype();
  return Variable::from_op(
      "rms_norm", y.to(x_dtype), {x, w}, {x64, inv, w.data()},
      [one_plus_w, x_dtype, w_dtype](const Tensor& dy_in, const BackwardContext& c) {
        const Tensor& xs_t = c.saved[0];
        const double* xs = xs_t.data<double>();
        const double* is = c.saved[1].data<double>();
        const std::vector<double> g = gains(c.saved[2], one_plus_w);
        const Tensor dy64 = dy_in.to(DType::float64).contiguous();
        const double* dy = dy64.data<double>();
        const Rows r = rows_of(xs_t);
        Tensor dx = Tensor::empty(xs_t.shape(), DType::float64);
        std::vector<double> dw(static_cast<std::size_t>(r.n), 0.0);
        double* dxs = dx.mutable_data<double>();
        for (std::int64_t i = 0; i < r.rows; ++i) {
          const double rinv = is[i];
          double m = 0.0;  // mean(gy x^)
          for (std::int64_t j = 0; j < r.n; ++j) {
            const double xh = xs[i * r.n + j] * rinv, d = dy[i * r.n + j];
            m += d * g[static_cast<std::size_t>(j)] * xh;
            dw[static_cast<std::size_t>(j)] += d * xh;
          }
          m /= static_cast<double>(r.n);
          for (std::int64_t j = 0; j < r.n; ++j) {
            const double xh = xs[i * r.n + j] * rinv;
            dxs[i * r.n + j] = (dy[i * r.n + j] * g[static_cast<std::size_t>(j)] - xh * m) * rinv;
          }
        }
        return std::vector<Tensor>{dx.to(x_dtype), Tensor::from_values(dw, {r.n}, DType::float64).to(w_dtype)};
      });
}

}  // namespace headgrad
