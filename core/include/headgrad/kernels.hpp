// Tensor-level kernels: the arithmetic under the ops, with no graph. Ops use
// them for forward and backward; fused plugins use them inside custom ops.
//
// Inputs may be any strided views; outputs are fresh contiguous tensors
// (except sum_to, which returns g itself when there is nothing to sum).
// Both operands of a binary kernel must share a float dtype.
#pragma once

#include <cstdint>

#include "headgrad/tensor.hpp"

namespace headgrad::kernels {

enum class BinaryOp { add, sub, mul, div };
enum class UnaryOp { neg, exp, log };

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);  // broadcasting
Tensor unary(UnaryOp op, const Tensor& x);
Tensor scale(const Tensor& x, double factor);

// Logit soft-capping: cap * tanh(x / cap) (cap > 0), and its backward
// g * (1 - (y / cap)^2) from the capped y (what the softcap op saves).
Tensor softcap(const Tensor& x, double cap);
Tensor softcap_backward(const Tensor& g, const Tensor& y, double cap);

// Sum g over the dims it was broadcast along, down to `shape`.
Tensor sum_to(const Tensor& g, const Shape& shape);
Tensor sum_dim(const Tensor& x, std::int64_t dim, bool keepdim);
Tensor sum_all(const Tensor& x);  // -> []

// a [..., M, K] @ b [..., K, N] -> [..., M, N] through sgemm/dgemm.
Tensor matmul(const Tensor& a, const Tensor& b);

// x[j] := exp(x[j] - shift) for j < n; returns their sum: the exponential of
// every softmax kernel (and of fused plugins, so that they agree with them).
// float32 runs a vectorized polynomial within 2 ulp of std::exp that gives
// exactly 0 below -87 (so for -inf) and inf above float's exp range
// (ln(FLT_MAX) = 88.72, so for +inf), on AVX-512 with its own 2^k
// (vscalefps) where the CPU has it, else exp_shift_row_portable; float64 runs
// fdlibm's exp as a vectorized polynomial, within 1 ulp of std::exp. The sum
// is taken in 16 lanes (j mod 16), so trailing zeros never change it.
float exp_shift_row(float* x, std::int64_t n, float shift);
double exp_shift_row(double* x, std::int64_t n, double shift);
// The float32 loop for CPUs without AVX-512 (AVX2 or baseline x86-64), the
// same contract: tests hold both paths to std::exp.
float exp_shift_row_portable(float* x, std::int64_t n, float shift);

// max(x[0..n)), -inf for n = 0: the row max of every softmax kernel, taken in
// 16 independent lanes so that it vectorizes (one running std::max is a chain
// of dependent instructions). A maximum is the same in any order; NaNs are
// skipped as by std::max(running, x[j]).
float row_max(const float* x, std::int64_t n);
double row_max(const double* x, std::int64_t n);

// Stable softmax over dim, and its backward: dx = y * (dy - sum(dy * y, dim)).
// A row that is all -inf (every key masked) gives zeros rather than NaN.
Tensor softmax(const Tensor& x, std::int64_t dim);
Tensor softmax_backward(const Tensor& y, const Tensor& dy, std::int64_t dim);

// Where mask (bool, broadcast to x) is true, `value`; elsewhere x.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

// Attention weights in one pass over [..., Tq, Tk]: softmax over the last dim of
// x * scale, where keys are masked out when `attend` (bool, broadcast to x;
// undefined = all) is false or, with causal, when key j > query i + shift
// (shift 0: top-left aligned; Tk - Tq: bottom-right). Equals
// softmax(masked_fill(scale(x), !attend, -inf)) exactly; a row with no
// attended key gives zeros.
Tensor masked_softmax(const Tensor& x, double scale, const Tensor& attend, bool causal,
                      std::int64_t causal_shift = 0);
// Its backward: dx = scale * y * (dy - sum(dy * y)); masked entries get 0.
Tensor masked_softmax_backward(const Tensor& y, const Tensor& dy, double scale, bool causal,
                               std::int64_t causal_shift = 0);

}  // namespace headgrad::kernels
