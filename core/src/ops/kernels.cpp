#include "headgrad/kernels.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <type_traits>

#include "headgrad/blas.hpp"
#include "headgrad/half_convert.hpp"
#include "headgrad/ops.hpp"
#include "headgrad/parallel.hpp"
#include "headgrad/tile_gemm.hpp"
#include "ops/split_product.hpp"
#include "tensor/strided.hpp"

namespace headgrad {

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const std::size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      throw std::invalid_argument(std::string(op) + ": shapes " + shape_str(a) + " and " +
                                  shape_str(b) + " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace kernels {
namespace {

void require_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  if (a.dtype() != b.dtype())
    throw std::invalid_argument(std::string(op) + ": dtypes differ (" +
                                std::string(dtype_name(a.dtype())) + " and " +
                                std::string(dtype_name(b.dtype())) + ")");
}

// The start of t's storage (offsets are added by the caller); the mutable
// one counts as a write to t (see Storage::mutable_data).
// 16-bit tensors run every kernel in float32: the float32 kernel on exact
// upcasts, its result rounded once to the storage type (PyTorch's CPU rule),
// so a kernel's float32 body never sees bfloat16 or float16.
Tensor f32(const Tensor& t) { return is_16bit(t.dtype()) ? t.to(DType::float32) : t; }

// f<H>() with H the storage type of a 16-bit dtype (BFloat16 or Float16).
template <class F>
void dispatch_16bit(DType dtype, F&& f) {
  if (dtype == DType::bfloat16)
    f.template operator()<BFloat16>();
  else
    f.template operator()<Float16>();
}

// Elements a 16-bit kernel converts at a time into float32 buffers on the
// stack (16 KiB each): the float32 kernel then runs on tiles that stay in L1,
// where converting whole tensors (16-bit ops' default: f32() above, then
// to()) writes and reads a float32 copy of each input and of the output.
constexpr std::int64_t kHalfTile = 4096;

// A 16-bit view t [..., R, C] whose last two dims are swapped in storage
// (stride(-2) == 1: column j of t is storage row j) as a contiguous float32
// copy: blocks of 16 storage rows widened along their contiguous runs, then
// written out transposed, a cache line (16 floats) at a time. One pass, where
// widening in storage order and then copying transposed makes two.
Tensor widen_transposed(const Tensor& t) {
  constexpr std::int64_t kRows = 16, kRun = 256;  // storage rows x elements per block (16 KiB)
  const std::int64_t r = t.size(-2), c = t.size(-1), sc = t.stride(-1);
  Tensor out = Tensor::empty(t.shape(), DType::float32);
  const Shape batch(t.shape().begin(), t.shape().end() - 2);
  const Shape batch_strides(t.strides().begin(), t.strides().end() - 2);
  std::vector<std::int64_t> starts;  // each matrix's storage offset
  detail::for_each_offsets<1>(batch, {std::span<const std::int64_t>(batch_strides)}, {t.offset()},
                              [&](const std::array<std::int64_t, 1>& off) { starts.push_back(off[0]); });
  dispatch_16bit(t.dtype(), [&]<class H>() {
    const H* src = static_cast<const H*>(t.storage()->data());
    float* dst = out.template mutable_data<float>();
    parallel_for(static_cast<std::int64_t>(starts.size()), [&](std::int64_t m0, std::int64_t m1, int) {
      float block[kRows][kRun];
      for (std::int64_t m = m0; m < m1; ++m) {
        const H* a = src + starts[static_cast<std::size_t>(m)];
        float* o = dst + m * r * c;
        for (std::int64_t j0 = 0; j0 < c; j0 += kRows) {
          const std::int64_t jn = std::min(kRows, c - j0);
          for (std::int64_t i0 = 0; i0 < r; i0 += kRun) {
            const std::int64_t in = std::min(kRun, r - i0);
            for (std::int64_t jj = 0; jj < jn; ++jj)
              convert(a + (j0 + jj) * sc + i0, block[jj], static_cast<std::size_t>(in));
            for (std::int64_t ii = 0; ii < in; ++ii)
              for (std::int64_t jj = 0; jj < jn; ++jj) o[(i0 + ii) * c + j0 + jj] = block[jj][ii];
          }
        }
      }
    });
  });
  return out;
}

// matmul's operands in float32: a view whose last two dims are swapped (K^T,
// W^T, P^T) becomes a contiguous float32 copy (widen_transposed), so the BLAS
// sees the layout it saw before: the result does not depend on how a 16-bit
// operand happens to be strided (the small-matrix paths of a BLAS sum in an
// order that follows the layout, and a mutant must match its hypothesis bit
// for bit).
Tensor f32_operand(const Tensor& t) {
  const std::int64_t n = t.dim();
  if (is_16bit(t.dtype()) && n >= 2 && t.stride(-1) != 1 && t.size(-1) > 1 && t.stride(-2) == 1 && t.size(-2) > 1)
    return widen_transposed(t);
  return f32(t);
}

template <class T>
const T* base_ptr(const Tensor& t) {
  return static_cast<const T*>(t.storage()->data());
}
template <class T>
T* mutable_base_ptr(Tensor& t) {
  return static_cast<T*>(t.storage()->mutable_data());
}

// out[i] = f(a[i], b[i]) over a common shape, any strides (b may be stride-0).
template <class T, class F>
void zip_into(Tensor& out, const Tensor& a, const Tensor& b, F f) {
  T* o = mutable_base_ptr<T>(out);
  const T* pa = base_ptr<T>(a);
  const T* pb = base_ptr<T>(b);
  if (out.is_contiguous() && a.is_contiguous() && b.is_contiguous() && a.shape() == out.shape() &&
      b.shape() == out.shape()) {
    o += out.offset();
    pa += a.offset();
    pb += b.offset();
    detail::parallel_elements(out.numel(), [&](std::int64_t i) { o[i] = f(pa[i], pb[i]); });
    return;
  }
  detail::parallel_for_each_offsets<3>(out.shape(), {out.strides(), a.strides(), b.strides()},
                                       {out.offset(), a.offset(), b.offset()},
                                       [&](const std::array<std::int64_t, 3>& off) {
                                         o[off[0]] = f(pa[off[1]], pb[off[2]]);
                                       });
}

template <class T, class F>
void map_into(Tensor& out, const Tensor& x, F f) {
  T* o = mutable_base_ptr<T>(out);
  const T* px = base_ptr<T>(x);
  if (x.is_contiguous()) {
    o += out.offset();
    px += x.offset();
    detail::parallel_elements(out.numel(), [&](std::int64_t i) { o[i] = f(px[i]); });
    return;
  }
  detail::parallel_for_each_offsets<2>(out.shape(), {out.strides(), x.strides()},
                                       {out.offset(), x.offset()},
                                       [&](const std::array<std::int64_t, 2>& off) {
                                         o[off[0]] = f(px[off[1]]);
                                       });
}

// The softmax row kernels, shared by softmax and masked_softmax so that the
// two give the same bits. softmax_row: row[0..n) holds the (scaled, masked)
// scores and mx their max; it becomes the weights. A row with no attended key
// (mx = -inf) gives zeros, not NaN (PyTorch gives NaN), so the backward gives
// zeros too, since dx = y * (...).
template <class T>
void softmax_row(T* row, std::int64_t n, T mx) {
  if (mx == -std::numeric_limits<T>::infinity()) {
    std::fill(row, row + n, T(0));
    return;
  }
  const T inv = T(1) / exp_shift_row(row, n, mx);
  for (std::int64_t j = 0; j < n; ++j) row[j] *= inv;
}

template <class T>
[[gnu::always_inline]] inline T lane_max(const T* x, std::int64_t n) {  // inlined: row_max's clones vectorize it
  constexpr int kLanes = 16;
  T lane[kLanes];
  std::fill(lane, lane + kLanes, -std::numeric_limits<T>::infinity());
  std::int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] = lane[l] < x[c + l] ? x[c + l] : lane[l];
  for (; c < n; ++c) lane[0] = lane[0] < x[c] ? x[c] : lane[0];
  T m = lane[0];
  for (int l = 1; l < kLanes; ++l) m = std::max(m, lane[l]);
  return m;
}

// dx[j] = y[j] * (dy[j] - sum(dy * y)) * f for j < n.
template <class T>
void softmax_backward_row(const T* y, const T* dy, T* dx, std::int64_t n, T f) {
  T dot = 0;
  for (std::int64_t j = 0; j < n; ++j) dot += y[j] * dy[j];
  for (std::int64_t j = 0; j < n; ++j) dx[j] = y[j] * (dy[j] - dot) * f;
}

// Softmax rows a worker should get at least: waking a worker costs a few
// microseconds, about 4K exponentials.
std::int64_t rows_per_worker(std::int64_t row_length) {
  return std::max<std::int64_t>(16, 4096 / std::max<std::int64_t>(row_length, 1));
}

}  // namespace

// built for AVX-512, AVX2 and baseline x86-64 like exp_shift_row: the baseline
// build compares 4 lanes at a time (2% of fused_sdpa's f+b at (1,2048,512,8))
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
float row_max(const float* x, std::int64_t n) { return lane_max(x, n); }
double row_max(const double* x, std::int64_t n) { return lane_max(x, n); }

namespace {

// Whether every element of p[0, n) is +0 (all bits clear).
template <class H>
bool all_plus_zero(const H* p, std::size_t n) {
  std::uint16_t any = 0;
  for (std::size_t i = 0; i < n; ++i) any = static_cast<std::uint16_t>(any | p[i].bits);
  return any == 0;
}

// dst = round(src + (+0)) for 16-bit src: src itself, except that the
// float32 add turns -0 into +0 and quiets a signalling NaN: -0 is written
// as +0, and NaNs (exponent bits all set, mantissa not 0) take the float32
// add.
template <class H>
void add_plus_zero(const H* src, H* dst, std::size_t n) {
  constexpr std::uint16_t exponent = std::is_same_v<H, BFloat16> ? 0x7f80 : 0x7c00;
  bool nan = false;
  for (std::size_t i = 0; i < n; ++i) {  // branch-free, so that it vectorizes
    const std::uint16_t bits = src[i].bits;
    dst[i].bits = bits == 0x8000 ? std::uint16_t{0} : bits;
    nan |= (bits & 0x7fff) > exponent;
  }
  if (!nan) return;
  for (std::size_t i = 0; i < n; ++i)
    if ((src[i].bits & 0x7fff) > exponent) {
      float f;
      convert(src + i, &f, 1);
      f = f + 0.0f;
      convert(&f, dst + i, 1);
    }
}

// x[i] = op(x[i], y[i]) in float32.
void combine_tile(BinaryOp op, float* x, const float* y, std::size_t len) {
  const auto combine = [&](auto f) {
    for (std::size_t i = 0; i < len; ++i) x[i] = f(x[i], y[i]);
  };
  switch (op) {
    case BinaryOp::add: combine([](float u, float v) { return u + v; }); break;
    case BinaryOp::sub: combine([](float u, float v) { return u - v; }); break;
    case BinaryOp::mul: combine([](float u, float v) { return u * v; }); break;
    case BinaryOp::div: combine([](float u, float v) { return u / v; }); break;
  }
}

// Storage offset of each row (every dim but the last) of t, in row-major order.
std::vector<std::int64_t> start_of_rows(const Tensor& t) {
  const Shape lead(t.shape().begin(), t.shape().end() - 1);
  const Shape strides(t.strides().begin(), t.strides().end() - 1);
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(shape_numel(lead)));
  detail::for_each_offsets<1>(lead, {std::span<const std::int64_t>(strides)}, {t.offset()},
                              [&](const std::array<std::int64_t, 1>& o) { out.push_back(o[0]); });
  return out;
}

// binary() of two contiguous 16-bit tensors of one shape: each tile widened,
// combined in float32 and rounded once, as the float32 kernel on the whole
// upcasts would, bit for bit. An add whose tile is +0 on one side (a
// gradient slice placed in zeros, as narrow's backward makes, accumulated)
// copies the other side instead (add_plus_zero).
Tensor binary_16bit_tiles(BinaryOp op, const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty(a.shape(), a.dtype());
  dispatch_16bit(a.dtype(), [&]<class H>() {
    const H* pa = a.template data<H>();
    const H* pb = b.template data<H>();
    H* po = out.template mutable_data<H>();
    const std::int64_t n = out.numel();
    parallel_for((n + kHalfTile - 1) / kHalfTile, [&](std::int64_t t0, std::int64_t t1, int) {
      float x[kHalfTile], y[kHalfTile];
      for (std::int64_t t = t0; t < t1; ++t) {
        const std::int64_t i0 = t * kHalfTile;
        const auto len = static_cast<std::size_t>(std::min(kHalfTile, n - i0));
        if (op == BinaryOp::add) {
          const H* other = all_plus_zero(pb + i0, len)   ? pa + i0
                           : all_plus_zero(pa + i0, len) ? pb + i0
                                                         : nullptr;
          if (other) {
            add_plus_zero(other, po + i0, len);
            continue;
          }
        }
        convert(pa + i0, x, len);
        convert(pb + i0, y, len);
        combine_tile(op, x, y, len);
        convert(x, po + i0, len);
      }
    }, 8);
  });
  return out;
}

// binary() of two 16-bit views of one shape whose rows (the last dim) are
// contiguous runs, e.g. a slice of a gradient and the slice's own gradient
// (narrow's backward adds a row block's gradient into its slice): each row
// widened, combined and rounded in tiles into a contiguous result, the bits
// of the float32 kernel on whole upcasts, without the float32 copies.
Tensor binary_16bit_rows(BinaryOp op, const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty(a.shape(), a.dtype());
  const std::int64_t n = a.size(-1);
  const std::vector<std::int64_t> ra = start_of_rows(a), rb = start_of_rows(b);
  dispatch_16bit(a.dtype(), [&]<class H>() {
    const H* pa = base_ptr<H>(a);
    const H* pb = base_ptr<H>(b);
    H* po = out.template mutable_data<H>();
    parallel_for(static_cast<std::int64_t>(ra.size()), [&](std::int64_t r0, std::int64_t r1, int) {
      float x[kHalfTile], y[kHalfTile];
      for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t i0 = 0; i0 < n; i0 += kHalfTile) {
          const auto len = static_cast<std::size_t>(std::min(kHalfTile, n - i0));
          convert(pa + ra[static_cast<std::size_t>(r)] + i0, x, len);
          convert(pb + rb[static_cast<std::size_t>(r)] + i0, y, len);
          combine_tile(op, x, y, len);
          convert(x, po + r * n + i0, len);
        }
    }, std::max<std::int64_t>(1, kHalfTile / std::max<std::int64_t>(n, 1)));
  });
  return out;
}

}  // namespace

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  static constexpr const char* names[] = {"add", "sub", "mul", "div"};
  const char* name = names[static_cast<int>(op)];
  require_same_dtype(a, b, name);
  if (is_16bit(a.dtype())) {
    // gradients accumulating (add of two same-shape tensors): tile by tile
    if (a.shape() == b.shape() && a.is_contiguous() && b.is_contiguous()) return binary_16bit_tiles(op, a, b);
    // same-shape views with contiguous rows (a slice of a gradient): row by row
    if (a.shape() == b.shape() && a.dim() >= 1 && a.size(-1) >= 16 && a.stride(-1) == 1 && b.stride(-1) == 1)
      return binary_16bit_rows(op, a, b);
    return binary(op, f32(a), f32(b)).to(a.dtype());
  }
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = Tensor::empty(shape, a.dtype());
  const Tensor ea = a.expand(shape), eb = b.expand(shape);
  dispatch_float(a.dtype(), name, [&]<class T>() {
    switch (op) {
      case BinaryOp::add: zip_into<T>(out, ea, eb, [](T x, T y) { return x + y; }); break;
      case BinaryOp::sub: zip_into<T>(out, ea, eb, [](T x, T y) { return x - y; }); break;
      case BinaryOp::mul: zip_into<T>(out, ea, eb, [](T x, T y) { return x * y; }); break;
      case BinaryOp::div: zip_into<T>(out, ea, eb, [](T x, T y) { return x / y; }); break;
    }
  });
  return out;
}

Tensor unary(UnaryOp op, const Tensor& x) {
  static constexpr const char* names[] = {"neg", "exp", "log"};
  const char* name = names[static_cast<int>(op)];
  if (is_16bit(x.dtype())) return unary(op, f32(x)).to(x.dtype());
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  dispatch_float(x.dtype(), name, [&]<class T>() {
    switch (op) {
      case UnaryOp::neg: map_into<T>(out, x, [](T v) { return -v; }); break;
      case UnaryOp::exp: map_into<T>(out, x, [](T v) { return std::exp(v); }); break;
      case UnaryOp::log: map_into<T>(out, x, [](T v) { return std::log(v); }); break;
    }
  });
  return out;
}

Tensor scale(const Tensor& x, double factor) {
  if (is_16bit(x.dtype())) return scale(f32(x), factor).to(x.dtype());
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  dispatch_float(x.dtype(), "scale", [&]<class T>() {
    const T f = static_cast<T>(factor);
    map_into<T>(out, x, [f](T v) { return v * f; });
  });
  return out;
}

// ---- logit soft-capping (attention: after the scale, before the masks)

Tensor softcap(const Tensor& x, double cap) {
  if (is_16bit(x.dtype())) return softcap(f32(x), cap).to(x.dtype());
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  dispatch_float(x.dtype(), "softcap", [&]<class T>() {
    const T c = static_cast<T>(cap);
    map_into<T>(out, x, [c](T v) { return c * std::tanh(v / c); });
  });
  return out;
}

Tensor softcap_backward(const Tensor& g, const Tensor& y, double cap) {
  if (is_16bit(g.dtype())) return softcap_backward(f32(g), f32(y), cap).to(g.dtype());
  Tensor out = Tensor::empty(g.shape(), g.dtype());  // g and y: the op output's shape
  dispatch_float(g.dtype(), "softcap_backward", [&]<class T>() {
    const T c = static_cast<T>(cap);
    zip_into<T>(out, g, y, [c](T gv, T yv) {
      const T t = yv / c;  // tanh(x / cap)
      return gv * (T(1) - t * t);
    });
  });
  return out;
}

// Accumulate g into a zero tensor of the reduced shape, expanded (stride 0) over
// the summed dims: one pass over g, whatever dims are reduced.
Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  if (shape.size() > g.shape().size())
    throw std::invalid_argument("sum_to: cannot reduce " + shape_str(g.shape()) + " to " +
                                shape_str(shape));
  if (is_16bit(g.dtype())) return sum_to(f32(g), shape).to(g.dtype());
  Tensor out = Tensor::zeros(shape, g.dtype());
  Tensor acc = out.expand(g.shape());
  dispatch_float(g.dtype(), "sum_to", [&]<class T>() {
    T* o = mutable_base_ptr<T>(acc);
    const T* pg = base_ptr<T>(g);
    detail::for_each_offsets<2>(g.shape(), {acc.strides(), g.strides()},
                                {acc.offset(), g.offset()},
                                [&](const std::array<std::int64_t, 2>& off) {
                                  o[off[0]] += pg[off[1]];
                                });
  });
  return out;
}

Tensor sum_dim(const Tensor& x, std::int64_t dim, bool keepdim) {
  const std::int64_t d = normalize_dim(dim, x.dim(), x.shape(), "sum");
  Shape kept = x.shape();
  kept[d] = 1;
  Tensor out = sum_to(x, kept);
  if (out.shares_storage(x)) out = out.clone();  // size-1 dim: sum_to returned x itself
  return keepdim ? out : out.squeeze(d);
}

Tensor sum_all(const Tensor& x) {
  if (is_16bit(x.dtype())) return sum_all(f32(x)).to(x.dtype());
  Tensor out = Tensor::zeros({}, x.dtype());
  dispatch_float(x.dtype(), "sum", [&]<class T>() {
    // Accumulate in double so float32 sums of long tensors stay accurate.
    double s = 0.0;
    const T* p = base_ptr<T>(x);
    detail::for_each_offsets<1>(x.shape(), {x.strides()}, {x.offset()},
                                [&](const std::array<std::int64_t, 1>& o) { s += p[o[0]]; });
    *out.mutable_data<T>() = static_cast<T>(s);
  });
  return out;
}

// ---------------------------------------------------------------- matmul

namespace {

// How a [rows, cols] matrix view is handed to a row-major GEMM: as is (ld =
// row stride) or transposed (ld = column stride). Size-1 dims have free strides.
struct GemmOperand {
  bool ok = false;
  bool trans = false;
  std::int64_t ld = 0;
};

GemmOperand gemm_operand(std::int64_t rows, std::int64_t cols, std::int64_t s_row,
                         std::int64_t s_col) {
  const std::int64_t sc = cols == 1 ? 1 : s_col;
  const std::int64_t sr = rows == 1 ? std::max<std::int64_t>(cols, 1) : s_row;
  if (sc == 1 && sr >= std::max<std::int64_t>(cols, 1)) return {true, false, sr};
  const std::int64_t tr = rows == 1 ? 1 : s_row;
  const std::int64_t tc = cols == 1 ? std::max<std::int64_t>(rows, 1) : s_col;
  if (tr == 1 && tc >= std::max<std::int64_t>(rows, 1)) return {true, true, tc};
  return {};
}

template <class T>
void gemm(const GemmOperand& a, const GemmOperand& b, std::int64_t m, std::int64_t n,
          std::int64_t k, const T* pa, const T* pb, T* pc) {
  if constexpr (std::is_same_v<T, BFloat16>)
    blas::gemm_bf16(a.trans, b.trans, m, n, k, pa, a.ld, pb, b.ld, pc, n);
  else
    blas::gemm(a.trans, b.trans, m, n, k, T{1}, pa, a.ld, pb, b.ld, T{0}, pc, n);
}

// Makes the last two dims of t GEMM-readable, copying only when they are not.
Tensor gemm_ready(const Tensor& t) {
  const std::int64_t nd = t.dim();
  if (gemm_operand(t.size(-2), t.size(-1), t.stride(nd - 2), t.stride(nd - 1)).ok) return t;
  return t.contiguous();
}

// The storage offsets of a, b and out of each product of a batched matmul:
// the broadcast batch dims walked with each operand's batch strides (its
// own, right-aligned, and 0 where it has size 1 or lacks the dim: what
// expand() gives, without building a tensor per product).
std::vector<std::array<std::int64_t, 3>> product_offsets(const Shape& batch, const Tensor& a,
                                                         const Tensor& b, const Tensor& out) {
  auto batch_strides = [&](const Tensor& t) {
    const std::size_t own = static_cast<std::size_t>(t.dim()) - 2;
    const std::size_t lead = batch.size() - own;
    Shape st(batch.size(), 0);
    for (std::size_t i = 0; i < own; ++i)
      if (t.shape()[i] == batch[lead + i]) st[lead + i] = t.strides()[i];
    return st;
  };
  const Shape sa = batch_strides(a), sb = batch_strides(b);
  const Shape so(out.strides().begin(), out.strides().end() - 2);
  std::vector<std::array<std::int64_t, 3>> offsets;
  offsets.reserve(static_cast<std::size_t>(shape_numel(batch)));
  detail::for_each_offsets<3>(batch, {std::span<const std::int64_t>(sa),
                                      std::span<const std::int64_t>(sb),
                                      std::span<const std::int64_t>(so)},
                              {a.offset(), b.offset(), out.offset()},
                              [&](const std::array<std::int64_t, 3>& off) { offsets.push_back(off); });
  return offsets;
}

// bfloat16 products at least this large go to blas::gemm_bf16 when it is
// there: below it oneDNN's call costs more than the upcasts save (a product
// of 64 x 64 x 64 takes a few microseconds either way).
constexpr std::int64_t kBf16ProductsMinMacs = std::int64_t{1} << 18;

bool on_bf16_products(DType dtype, std::int64_t m, std::int64_t n, std::int64_t k) {
  return dtype == DType::bfloat16 && blas::bf16_products() && blas::macs(m, n, k) >= kBf16ProductsMinMacs;
}

// The element types kernels::matmul multiplies in place: float32, float64,
// and bfloat16 when on_bf16_products (the other 16-bit products widen first).
template <class F>
void dispatch_gemm(DType dtype, F&& f) {
  if (dtype == DType::bfloat16) return f.template operator()<BFloat16>();
  dispatch_float(dtype, "matmul", std::forward<F>(f));
}

// A 16-bit matmul whose float32 upcasts would run every product on the
// packed micro-kernel (blas::float32_on_tiles, asked as each product would
// ask it: under SerialBlasScope when the products are spread over workers):
// the same products on the 16-bit operands (tile::gemm_16bit widens while
// packing and rounds each block of rows), so the same bits without whole
// float32 copies of a, b and the result. Returns an undefined tensor when
// the products would not go there (the caller then upcasts whole, as before):
// a single b with a batch of a (the float32 path folds a into one product of
// all its rows), empty sizes, shapes that do not fit.
Tensor matmul_16bit_tiles(const Tensor& a_in, const Tensor& b_in) {
  if (!tile::available()) return Tensor();
  const std::int64_t m = a_in.size(-2), k = a_in.size(-1), n = b_in.size(-1);
  if (b_in.size(-2) != k || m == 0 || n == 0 || k == 0) return Tensor();
  const Shape a_batch(a_in.shape().begin(), a_in.shape().end() - 2);
  const Shape b_batch(b_in.shape().begin(), b_in.shape().end() - 2);
  if (b_batch.empty() && !a_batch.empty()) return Tensor();
  Shape batch;
  try {
    batch = broadcast_shapes(a_batch, b_batch, "matmul");
  } catch (const std::invalid_argument&) {
    return Tensor();
  }
  const std::int64_t count = shape_numel(batch);
  const bool spread = num_threads() > 1 && count >= num_threads();  // as the float32 path decides
  const bool tiles = [&] {
    if (!spread) return blas::float32_on_tiles(m, n, k);
    const SerialBlasScope serial_blas;
    return blas::float32_on_tiles(m, n, k);
  }();
  if (!tiles || count == 0) return Tensor();
  Shape out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  Tensor out = Tensor::empty(out_shape, a_in.dtype());
  const Tensor a = gemm_ready(a_in), b = gemm_ready(b_in);
  const auto ga = gemm_operand(m, k, a.stride(-2), a.stride(-1));
  const auto gb = gemm_operand(k, n, b.stride(-2), b.stride(-1));
  const std::vector<std::array<std::int64_t, 3>> offsets = product_offsets(batch, a, b, out);
  dispatch_16bit(a.dtype(), [&]<class H>() {
    const H* pa = base_ptr<H>(a);
    const H* pb = base_ptr<H>(b);
    H* pc = mutable_base_ptr<H>(out);
    auto run = [&](std::int64_t i0, std::int64_t i1, int) {
      for (std::int64_t i = i0; i < i1; ++i) {
        const auto& off = offsets[static_cast<std::size_t>(i)];
        tile::gemm_16bit(ga.trans, gb.trans, m, n, k, pa + off[0], ga.ld, pb + off[1], gb.ld,
                         pc + off[2], n);
      }
    };
    if (spread) {
      const SerialBlasScope serial_blas;
      parallel_for(count, run);
    } else {
      run(0, count, 0);
    }
  });
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  if (a_in.dim() < 2 || b_in.dim() < 2)
    throw std::invalid_argument("matmul: operands need at least 2 dims, got " +
                                shape_str(a_in.shape()) + " and " + shape_str(b_in.shape()));
  require_same_dtype(a_in, b_in, "matmul");
  const std::int64_t m = a_in.size(-2), k = a_in.size(-1), n = b_in.size(-1);
  if (is_16bit(a_in.dtype()) && !on_bf16_products(a_in.dtype(), m, n, k)) {
    if (Tensor out = matmul_16bit_tiles(a_in, b_in); out.defined()) return out;
    return matmul(f32_operand(a_in), f32_operand(b_in)).to(a_in.dtype());  // float32 upcasts, rounded once
  }
  if (b_in.size(-2) != k)
    throw std::invalid_argument("matmul: inner dims differ: " + shape_str(a_in.shape()) + " @ " +
                                shape_str(b_in.shape()));
  const Shape a_batch(a_in.shape().begin(), a_in.shape().end() - 2);
  const Shape b_batch(b_in.shape().begin(), b_in.shape().end() - 2);
  Shape batch;
  try {
    batch = broadcast_shapes(a_batch, b_batch, "matmul");
  } catch (const std::invalid_argument&) {  // name both operands, not only their batch dims
    throw std::invalid_argument("matmul: batch dims do not broadcast: " + shape_str(a_in.shape()) +
                                " @ " + shape_str(b_in.shape()));
  }
  Shape out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  Tensor out = Tensor::empty(out_shape, a_in.dtype());
  if (out.numel() == 0) return out;
  if (k == 0) {
    out.fill_(0.0);
    return out;
  }

  dispatch_gemm(a_in.dtype(), [&]<class T>() {
    // One GEMM when b is a single matrix and a's batch folds into its rows
    // (linear layers: [B, T, D] @ [D, D] is one [B*T, D] @ [D, D]).
    if (b_batch.empty() && !a_batch.empty()) {
      if (a_in.is_contiguous()) {  // the common case, without building a view
        const Tensor b = gemm_ready(b_in);
        const std::int64_t rows = a_in.numel() / k;
        gemm<T>(gemm_operand(rows, k, k, 1), gemm_operand(k, n, b.stride(0), b.stride(1)), rows, n,
                k, a_in.template data<T>(), b.template data<T>(), out.template mutable_data<T>());
        return;
      }
      if (auto a2 = a_in.try_view({-1, k})) {
        const auto ga = gemm_operand(a2->size(0), k, a2->stride(0), a2->stride(1));
        const Tensor b = gemm_ready(b_in);
        const auto gb = gemm_operand(k, n, b.stride(0), b.stride(1));
        if (ga.ok && !ga.trans) {
          gemm<T>(ga, gb, a2->size(0), n, k, a2->template data<T>(), b.template data<T>(),
                  out.template mutable_data<T>());
          return;
        }
      }
    }
    const Tensor a = gemm_ready(a_in), b = gemm_ready(b_in);
    const auto ga = gemm_operand(m, k, a.stride(-2), a.stride(-1));
    const auto gb = gemm_operand(k, n, b.stride(-2), b.stride(-1));
    const T* pa = base_ptr<T>(a);
    const T* pb = base_ptr<T>(b);
    T* pc = mutable_base_ptr<T>(out);
    const std::vector<std::array<std::int64_t, 3>> offsets = product_offsets(batch, a, b, out);
    const auto count = static_cast<std::int64_t>(offsets.size());
    auto run = [&](std::int64_t i0, std::int64_t i1, int) {
      for (std::int64_t i = i0; i < i1; ++i) {
        const auto& off = offsets[static_cast<std::size_t>(i)];
        gemm<T>(ga, gb, m, n, k, pa + off[0], pb + off[1], pc + off[2]);
      }
    };
    // Many small products (batch x heads): one per worker, each on one BLAS
    // thread, scale better than every product split over all BLAS threads.
    if (num_threads() > 1 && count >= num_threads()) {
      const SerialBlasScope serial_blas;
      parallel_for(count, run);
    } else {
      run(0, count, 0);
    }
  });
  return out;
}

// ---------------------------------------------------------------- softmax

namespace {
// Moves `dim` last and makes rows contiguous, so row kernels see [rows, n].
Tensor dim_last(const Tensor& x, std::int64_t d) {
  if (d == x.dim() - 1) return x.contiguous();
  return x.transpose(d, -1).contiguous();
}
Tensor dim_back(const Tensor& rows, std::int64_t d, std::int64_t nd) {
  if (d == nd - 1) return rows;
  return rows.transpose(d, -1).contiguous();
}
std::int64_t norm_dim(const Tensor& x, std::int64_t dim, const char* op) {
  return normalize_dim(dim, x.dim(), x.shape(), op);
}
}  // namespace

Tensor softmax(const Tensor& x, std::int64_t dim) {
  const std::int64_t d = norm_dim(x, dim, "softmax");
  if (is_16bit(x.dtype())) return softmax(f32(x), dim).to(x.dtype());
  const Tensor rows = dim_last(x, d);
  Tensor out = Tensor::empty(rows.shape(), x.dtype());
  dispatch_float(x.dtype(), "softmax", [&]<class T>() {
    const std::int64_t n = rows.size(-1);
    const std::int64_t r = n == 0 ? 0 : rows.numel() / n;
    const T* in = rows.template data<T>();
    T* o = out.template mutable_data<T>();
    parallel_for(r, [&](std::int64_t r0, std::int64_t r1, int) {
      for (std::int64_t i = r0; i < r1; ++i) {
        const T* row = in + i * n;
        T* orow = o + i * n;
        const T mx = lane_max(row, n);  // vectorized; the same max as a running std::max
        std::copy(row, row + n, orow);
        softmax_row(orow, n, mx);
      }
    }, rows_per_worker(n));
  });
  return dim_back(out, d, x.dim());
}

Tensor softmax_backward(const Tensor& y_in, const Tensor& dy_in, std::int64_t dim) {
  const std::int64_t d = norm_dim(y_in, dim, "softmax_backward");
  require_same_dtype(y_in, dy_in, "softmax_backward");
  if (is_16bit(y_in.dtype())) return softmax_backward(f32(y_in), f32(dy_in), dim).to(y_in.dtype());
  const Tensor y = dim_last(y_in, d), dy = dim_last(dy_in, d);
  Tensor dx = Tensor::empty(y.shape(), y.dtype());
  dispatch_float(y.dtype(), "softmax_backward", [&]<class T>() {
    const std::int64_t n = y.size(-1);
    const std::int64_t r = n == 0 ? 0 : y.numel() / n;
    const T* py = y.template data<T>();
    const T* pdy = dy.template data<T>();
    T* pdx = dx.template mutable_data<T>();
    parallel_for(r, [&](std::int64_t r0, std::int64_t r1, int) {
      for (std::int64_t i = r0; i < r1; ++i)
        softmax_backward_row(py + i * n, pdy + i * n, pdx + i * n, n, T(1));
    }, rows_per_worker(n));
  });
  return dim_back(dx, d, y_in.dim());
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  if (mask.dtype() != DType::boolean)
    throw std::invalid_argument("masked_fill: mask must be bool, got " +
                                std::string(dtype_name(mask.dtype())));
  const Shape shape = broadcast_shapes(x.shape(), mask.shape(), "masked_fill");
  if (shape != x.shape())
    throw std::invalid_argument("masked_fill: mask " + shape_str(mask.shape()) +
                                " does not broadcast to input " + shape_str(x.shape()));
  if (is_16bit(x.dtype())) return masked_fill(f32(x), mask, value).to(x.dtype());
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  if (out.numel() == 0) return out;
  // x contiguous and the mask a contiguous block of x's trailing dims (a
  // [Tq, Tk] mask on [.., Tq, Tk] scores): row by row against the mask's row,
  // the same select as the strided walk below, without its offsets.
  Shape own(mask.shape());
  while (!own.empty() && own.front() == 1) own.erase(own.begin());
  if (x.is_contiguous() && mask.is_contiguous() && !own.empty() &&
      std::equal(own.begin(), own.end(), shape.end() - static_cast<std::ptrdiff_t>(own.size()))) {
    dispatch_float(x.dtype(), "masked_fill", [&]<class T>() {
      const std::int64_t n = shape.back(), rows = out.numel() / n, mask_rows = mask.numel() / n;
      T* o = out.template mutable_data<T>();
      const T* px = x.template data<T>();
      const bool* pm = mask.template data<bool>();
      const T v = static_cast<T>(value);
      parallel_for(rows, [&](std::int64_t r0, std::int64_t r1, int) {
        for (std::int64_t r = r0; r < r1; ++r) {
          const bool* mr = pm + (r % mask_rows) * n;
          const T* xr = px + r * n;
          T* orow = o + r * n;
          for (std::int64_t j = 0; j < n; ++j) orow[j] = mr[j] ? v : xr[j];
        }
      }, std::max<std::int64_t>(1, detail::kParallelMinElements / n));
    });
    return out;
  }
  const Tensor m = mask.expand(shape);
  dispatch_float(x.dtype(), "masked_fill", [&]<class T>() {
    T* o = mutable_base_ptr<T>(out);
    const T* px = base_ptr<T>(x);
    const bool* pm = static_cast<const bool*>(m.storage()->data());
    const T v = static_cast<T>(value);
    detail::parallel_for_each_offsets<3>(shape, {out.strides(), x.strides(), m.strides()},
                                         {out.offset(), x.offset(), m.offset()},
                                         [&](const std::array<std::int64_t, 3>& off) {
                                           o[off[0]] = pm[off[2]] ? v : px[off[1]];
                                         });
  });
  return out;
}

// ---------------------------------------------------------------- masked softmax

namespace {

void check_masked_softmax(const Tensor& x, const Tensor& attend, bool causal, const char* op) {
  if (x.dim() < 1 || (causal && x.dim() < 2))
    throw std::invalid_argument(std::string(op) + ": input " + shape_str(x.shape()) +
                                " is not [..., Tq, Tk]");
  if (!attend.defined()) return;
  if (attend.dtype() != DType::boolean)
    throw std::invalid_argument(std::string(op) + ": mask must be bool (True = attend), got " +
                                std::string(dtype_name(attend.dtype())));
  if (broadcast_shapes(x.shape(), attend.shape(), op) != x.shape())
    throw std::invalid_argument(std::string(op) + ": mask " + shape_str(attend.shape()) +
                                " does not broadcast to input " + shape_str(x.shape()));
}

// The keys [0, end) that row r (query r mod Tq) of [..., Tq, n] may attend:
// all n, or under causal those with j <= i + shift.
std::int64_t attended_end(std::int64_t r, std::int64_t tq, std::int64_t n, bool causal,
                          std::int64_t shift) {
  if (!causal) return n;
  return std::clamp<std::int64_t>(r % tq + 1 + shift, 0, n);
}

}  // namespace

namespace {

// The row loop of the masked softmax kernels, [rows, n] contiguous inputs
// (all of out's shape) to out. body.template operator()<T>(r, in, o) reads
// in[i][0, end(r)) and writes o[0, n) for row r. float32 and float64 run on
// the tensors' own rows; a 16-bit dtype runs the float32 body on buffers, a
// row at a time: the attended part of each input row widened, the output row
// rounded once. The same float32 values as converting whole tensors, without
// the float32 copies of [..., Tq, Tk] (the kernels' largest buffers).
template <std::size_t NIn, class End, class Body>
void for_each_row(const std::array<const Tensor*, NIn>& in, Tensor& out, std::int64_t rows,
                  std::int64_t n, End end, Body body, const char* op) {
  if (!is_16bit(out.dtype())) {
    dispatch_float(out.dtype(), op, [&]<class T>() {
      std::array<const T*, NIn> p;
      for (std::size_t i = 0; i < NIn; ++i) p[i] = in[i]->template data<T>();
      T* o = out.template mutable_data<T>();
      parallel_for(rows, [&](std::int64_t r0, std::int64_t r1, int) {
        std::array<const T*, NIn> row;
        for (std::int64_t r = r0; r < r1; ++r) {
          for (std::size_t i = 0; i < NIn; ++i) row[i] = p[i] + r * n;
          body.template operator()<T>(r, row, o + r * n);
        }
      }, rows_per_worker(n));
    });
    return;
  }
  dispatch_16bit(out.dtype(), [&]<class H>() {
    std::array<const H*, NIn> p;
    for (std::size_t i = 0; i < NIn; ++i) p[i] = in[i]->template data<H>();
    H* o = out.template mutable_data<H>();
    parallel_for(rows, [&](std::int64_t r0, std::int64_t r1, int) {
      std::vector<float> buffers((NIn + 1) * static_cast<std::size_t>(n));
      std::array<const float*, NIn> row;
      float* orow = buffers.data() + NIn * static_cast<std::size_t>(n);
      for (std::int64_t r = r0; r < r1; ++r) {
        const auto e = static_cast<std::size_t>(end(r));
        for (std::size_t i = 0; i < NIn; ++i) {
          float* widened = buffers.data() + i * static_cast<std::size_t>(n);
          convert(p[i] + r * n, widened, e);
          row[i] = widened;
        }
        body.template operator()<float>(r, row, orow);
        convert(orow, o + r * n, static_cast<std::size_t>(n));
      }
    }, rows_per_worker(n));
  });
}

}  // namespace

Tensor masked_softmax(const Tensor& x_in, double scale, const Tensor& attend, bool causal,
                      std::int64_t causal_shift) {
  check_masked_softmax(x_in, attend, causal, "masked_softmax");
  const Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  const std::int64_t n = x.dim() == 0 ? 1 : x.size(-1);
  const std::int64_t rows = n == 0 ? 0 : x.numel() / n;
  const std::int64_t tq = x.dim() >= 2 ? x.size(-2) : 1;
  Tensor m;
  std::vector<std::int64_t> mask_rows;
  if (attend.defined()) {
    m = attend.expand(x.shape());
    mask_rows = start_of_rows(m);
  }
  const bool* pm = m.defined() ? static_cast<const bool*>(m.storage()->data()) : nullptr;
  const std::int64_t sj = m.defined() ? m.stride(-1) : 0;
  // Keys at or past `end` are causally masked: their weight is exactly 0.
  const auto end = [&](std::int64_t r) { return attended_end(r, tq, n, causal, causal_shift); };
  for_each_row<1>({&x}, out, rows, n, end, [&]<class T>(std::int64_t r, const std::array<const T*, 1>& in, T* orow) {
    constexpr T neg_inf = -std::numeric_limits<T>::infinity();
    const T f = static_cast<T>(scale);
    const T* row = in[0];
    const std::int64_t e = end(r);
    const bool* mrow = pm ? pm + mask_rows[static_cast<std::size_t>(r)] : nullptr;
    T mx = neg_inf;
    if (mrow) {
      for (std::int64_t j = 0; j < e; ++j) {
        const T v = mrow[j * sj] ? row[j] * f : neg_inf;
        orow[j] = v;
        mx = std::max(mx, v);
      }
    } else {  // scaled in one pass, the max in lanes (it took 5% of batched at (4,512,512,8))
      for (std::int64_t j = 0; j < e; ++j) orow[j] = row[j] * f;
      mx = lane_max(orow, e);
    }
    std::fill(orow + e, orow + n, T(0));
    softmax_row(orow, e, mx);
  }, "masked_softmax");
  return out;
}

Tensor masked_softmax_backward(const Tensor& y_in, const Tensor& dy_in, double scale, bool causal,
                               std::int64_t causal_shift) {
  if (y_in.shape() != dy_in.shape())
    throw std::invalid_argument("masked_softmax_backward: y " + shape_str(y_in.shape()) +
                                " and dy " + shape_str(dy_in.shape()) + " differ");
  require_same_dtype(y_in, dy_in, "masked_softmax_backward");
  check_masked_softmax(y_in, Tensor(), causal, "masked_softmax_backward");
  const Tensor y = y_in.contiguous(), dy = dy_in.contiguous();
  Tensor dx = Tensor::empty(y.shape(), y.dtype());
  const std::int64_t n = y.dim() == 0 ? 1 : y.size(-1);
  const std::int64_t rows = n == 0 ? 0 : y.numel() / n;
  const std::int64_t tq = y.dim() >= 2 ? y.size(-2) : 1;
  const auto end = [&](std::int64_t r) { return attended_end(r, tq, n, causal, causal_shift); };
  for_each_row<2>({&y, &dy}, dx, rows, n, end, [&]<class T>(std::int64_t r, const std::array<const T*, 2>& in, T* dr) {
    // y = softmax(x * scale) with masked y = 0: dx = scale * softmax's dx
    const std::int64_t e = end(r);
    softmax_backward_row(in[0], in[1], dr, e, static_cast<T>(scale));
    std::fill(dr + e, dr + n, T(0));
  }, "masked_softmax_backward");
  return dx;
}

}  // namespace kernels
}  // namespace headgrad
