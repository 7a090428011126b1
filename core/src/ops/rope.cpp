// Rotary position embeddings: the rope() op, forward and backward.
//
// Shape legend: [...] leading dims (N rows of [T, d] when flattened), T
// sequence, d last dim, r rotary width (even, r <= d), P rows of positions.
//
// Each pair (a, b) of the first r dims rotates by phi = p_t * w_k,
// w_k = theta^(-2k/r), k = 0 .. r/2 - 1:
//   forward   a' = a cos phi - b sin phi,   b' = a sin phi + b cos phi
//   backward  the transpose R^T, i.e. the same formulas with -phi.
// w, phi, cos and sin are float64 whatever the input's dtype: float32 tables
// cost ~1e-6 relative error at p ~ 1000, far above float64 rounding.
#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "headgrad/attention.hpp"
#include "headgrad/ops.hpp"
#include "headgrad/parallel.hpp"

namespace headgrad {

std::string_view rope_style_name(RopeStyle style) {
  switch (style) {
    case RopeStyle::interleaved: return "interleaved";
    case RopeStyle::half: return "half";
  }
  return "?";
}

Tensor positions_tensor(const std::vector<std::int64_t>& values, const Shape& shape) {
  constexpr std::int64_t exact = std::int64_t{1} << 53;
  std::vector<double> v;
  v.reserve(values.size());
  for (std::int64_t p : values) {
    if (p > exact || p < -exact)
      throw std::invalid_argument("positions_tensor: position " + std::to_string(p) +
                                  " is beyond 2^53, not exact in float64");
    v.push_back(static_cast<double>(p));
  }
  return Tensor::from_values(v, shape, DType::float64);
}

namespace {

// cos and sin of every (positions row, token, pair): [P, T, r/2], float64.
struct Angles {
  std::vector<double> cos, sin;
};

// The angles of one (positions, rotary width, theta), built once and shared:
// per_head rotates every head with the same ones, in its forward and again
// when a checkpointed head is recomputed (a few recent ones are kept).
std::shared_ptr<const Angles> angles_for(const std::vector<double>& pos, std::int64_t r, double theta) {
  struct Recent {
    std::vector<double> pos;
    std::int64_t r;
    double theta;
    std::shared_ptr<const Angles> angles;
  };
  static std::mutex mutex;
  static std::deque<Recent> recent;  // newest first
  {
    std::lock_guard lock(mutex);
    for (const Recent& e : recent)
      if (e.r == r && e.theta == theta && e.pos == pos) return e.angles;
  }
  const std::int64_t pairs = r / 2;
  std::vector<double> w(static_cast<std::size_t>(pairs));
  for (std::int64_t k = 0; k < pairs; ++k)
    w[k] = std::pow(theta, -2.0 * static_cast<double>(k) / static_cast<double>(r));
  auto a = std::make_shared<Angles>();
  a->cos.resize(pos.size() * static_cast<std::size_t>(pairs));
  a->sin.resize(a->cos.size());
  for (std::size_t i = 0; i < pos.size(); ++i)
    for (std::int64_t k = 0; k < pairs; ++k) {
      const double phi = pos[i] * w[k];
      a->cos[i * pairs + k] = std::cos(phi);
      a->sin[i * pairs + k] = std::sin(phi);
    }
  std::lock_guard lock(mutex);
  recent.push_front({pos, r, theta, a});
  if (recent.size() > 4) recent.pop_back();
  return a;
}

struct RopeTables {
  std::int64_t rows_per_position_row = 1;  // N / P: slabs [T, d] sharing a positions row
  std::int64_t t = 0, d = 0, r = 0;
  RopeStyle style = RopeStyle::interleaved;
  std::shared_ptr<const Angles> angles;
};

std::string where(const Variable& x, const RopeSpec& spec) {
  return "rope(x " + shape_str(x.shape()) + ", " + std::string(rope_style_name(spec.style)) +
         ", rotary_dim " + std::to_string(spec.rotary_dim) + ")";
}

// Checks x, the spec and the positions, and builds the tables.
std::shared_ptr<const RopeTables> make_tables(const Variable& x, const RopeSpec& spec) {
  if (x.dim() < 2)
    throw std::invalid_argument(where(x, spec) + ": x must be [..., T, d]");
  if (x.dtype() != DType::float32 && x.dtype() != DType::float64 && !is_16bit(x.dtype()))
    throw std::invalid_argument(where(x, spec) + ": x must be a float dtype, got " +
                                std::string(dtype_name(x.dtype())));
  auto tables = std::make_shared<RopeTables>();
  RopeTables& tb = *tables;
  tb.t = x.size(-2);
  tb.d = x.size(-1);
  tb.r = spec.rotary_dim == 0 ? tb.d : spec.rotary_dim;
  tb.style = spec.style;
  if (tb.r < 0 || tb.r % 2 != 0 || tb.r > tb.d || tb.r == 0)
    throw std::invalid_argument(where(x, spec) + ": rotary_dim " + std::to_string(tb.r) +
                                " must be even and in [2, d = " + std::to_string(tb.d) +
                                "] (0 means d)");
  if (!(spec.theta > 0.0) || !std::isfinite(spec.theta))
    throw std::invalid_argument(where(x, spec) + ": theta must be finite and > 0, got " +
                                std::to_string(spec.theta));

  // Positions: [..P, T] whose leading dims are the first leading dims of x.
  const std::int64_t n_rows = x.numel() / std::max<std::int64_t>(tb.t * tb.d, 1);
  std::vector<double> pos;
  std::int64_t p_rows = 1;
  if (spec.positions.defined()) {
    const Tensor& ps = spec.positions;
    if (spec.offset != 0)
      throw std::invalid_argument(where(x, spec) + ": give positions or an offset (" +
                                  std::to_string(spec.offset) + "), not both");
    if (ps.dtype() == DType::boolean)
      throw std::invalid_argument(where(x, spec) + ": positions must hold integers, got bool");
    bool fits = ps.dim() >= 1 && ps.dim() <= x.dim() - 1 && ps.size(-1) == tb.t;
    for (std::int64_t i = 0; fits && i + 1 < ps.dim(); ++i) fits = ps.size(i) == x.size(i);
    if (!fits)
      throw std::invalid_argument(where(x, spec) + ": positions " + shape_str(ps.shape()) +
                                  " must be [T = " + std::to_string(tb.t) +
                                  "] or [B, T] with B the first dim of x");
    pos = ps.to_vector();
    for (double p : pos)
      if (std::floor(p) != p || std::abs(p) > 9007199254740992.0)
        throw std::invalid_argument(where(x, spec) + ": position " + std::to_string(p) +
                                    " is not an integer");
    p_rows = ps.numel() / std::max<std::int64_t>(tb.t, 1);
  } else {
    for (std::int64_t t = 0; t < tb.t; ++t) pos.push_back(static_cast<double>(spec.offset + t));
  }
  tb.rows_per_position_row = p_rows > 0 ? n_rows / p_rows : 1;

  tb.angles = angles_for(pos, tb.r, spec.theta);
  return tables;
}

// out = R(sign * phi) x over x [N, T, d] (any strides: read contiguous).
Tensor rotate(const Tensor& x_any, const RopeTables& tb, double sign) {
  // 16-bit: rotated in float32, rounded once to the storage type (as every kernel).
  if (is_16bit(x_any.dtype())) return rotate(x_any.to(DType::float32), tb, sign).to(x_any.dtype());
  const Tensor x = x_any.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  dispatch_float(x.dtype(), "rope", [&]<class T>() {
    const T* src = x.data<T>();
    T* dst = out.mutable_data<T>();
    const std::int64_t pairs = tb.r / 2, slab = tb.t * tb.d;
    const std::int64_t n_rows = slab > 0 ? x.numel() / slab : 0;
    // pair k is dims (2k, 2k+1) interleaved, (k, k + r/2) half
    const std::int64_t step = tb.style == RopeStyle::interleaved ? 2 : 1;
    const std::int64_t other = tb.style == RopeStyle::interleaved ? 1 : pairs;
    // each token's vector on its own: split across the workers
    parallel_for(n_rows * tb.t, [&](std::int64_t begin, std::int64_t end, int) {
      for (std::int64_t row = begin; row < end; ++row) {
        const std::int64_t n = row / std::max<std::int64_t>(tb.t, 1), t = row - n * tb.t;
        const std::int64_t p_row = n / tb.rows_per_position_row;
        const T* a = src + n * slab + t * tb.d;
        T* o = dst + n * slab + t * tb.d;
        const double* c = tb.angles->cos.data() + (p_row * tb.t + t) * pairs;
        const double* s = tb.angles->sin.data() + (p_row * tb.t + t) * pairs;
        for (std::int64_t k = 0; k < pairs; ++k) {
          const std::int64_t i = k * step, j = i + other;
          const double xa = a[i], xb = a[j], sn = sign * s[k];
          o[i] = static_cast<T>(xa * c[k] - xb * sn);
          o[j] = static_cast<T>(xa * sn + xb * c[k]);
        }
        for (std::int64_t e = tb.r; e < tb.d; ++e) o[e] = a[e];  // pass-through, bitwise
      }
    }, /*min_per_worker=*/256);
  });
  return out;
}

}  // namespace

Variable rope(const Variable& x, const RopeSpec& spec) {
  std::shared_ptr<const RopeTables> tables = make_tables(x, spec);
  Tensor out = rotate(x.data(), *tables, 1.0);
  // The tables are not tensors of the graph: the closure owns them.
  return Variable::from_op("rope", std::move(out), {x}, {},
                           [tables](const Tensor& g, const BackwardContext&) {
                             // in the forward pass this was: out = R x; so dx = R^T dy
                             return std::vector<Tensor>{rotate(g, *tables, -1.0)};
                           });
}

}  // namespace headgrad
