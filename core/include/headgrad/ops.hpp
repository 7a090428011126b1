// headgrad ops: free functions over Variables, each with its backward.
//
// Shape legend: B batch, H heads, T sequence, Tq/Tk query/key lengths,
// D model width (D = H * d), d head width, [...] any leading dims.
//
//   Variable q = linear(x, wq);                        // x [B, T, D], wq [D, D] -> [B, T, D]
//   Variable qh = transpose(view(q, {B, T, H, d}), 1, 2);   // [B, H, T, d]
//   Variable s = scale(matmul(qh, transpose(kh, -2, -1)), 1 / sqrt(d));   // [B, H, T, T]
//   Variable p = softmax(masked_fill(s, causal_mask(T, T), -inf), -1);
//
// Every shape mismatch throws std::invalid_argument naming the op and the shapes.
// Binary elementwise ops broadcast as numpy does (right-aligned, size-1 dims and
// missing leading dims stretch); their backward sums over the broadcast dims.
#pragma once

#include <cstdint>
#include <vector>

#include "headgrad/variable.hpp"

namespace headgrad {

// ---- matrix products (the BLAS's sgemm/dgemm: BLIS by default, OpenBLAS with -Dblas=openblas) ----
// a [..., M, K] @ b [..., K, N] -> [..., M, N]; leading dims broadcast.
// Transposed views go to the GEMM as transposition flags, not copies.
Variable matmul(const Variable& a, const Variable& b);
// x [..., in] and w [out, in] (PyTorch's layout) -> x w^T [..., out]
Variable linear(const Variable& x, const Variable& w);

// ---- elementwise ----
Variable add(const Variable& a, const Variable& b);
Variable sub(const Variable& a, const Variable& b);
Variable mul(const Variable& a, const Variable& b);
Variable div(const Variable& a, const Variable& b);
Variable scale(const Variable& x, double factor);
Variable neg(const Variable& x);
Variable exp(const Variable& x);
Variable log(const Variable& x);
// x converted to `dtype` (float dtypes): the gradient is converted back to x's
// dtype. Rounds when narrowing (to bfloat16 or float16: nearest even); how a
// 16-bit kernel runs in float32 and stores its result in 16 bits.
Variable cast(const Variable& x, DType dtype);

// ---- reductions ----
Variable sum(const Variable& x);                                     // -> []
Variable sum(const Variable& x, std::int64_t dim, bool keepdim = false);
Variable mean(const Variable& x);
Variable mean(const Variable& x, std::int64_t dim, bool keepdim = false);

// ---- shape ----
Variable view(const Variable& x, const Shape& shape);     // throws if strides forbid it
Variable reshape(const Variable& x, const Shape& shape);  // copies only when it must
Variable transpose(const Variable& x, std::int64_t d0, std::int64_t d1);
Variable permute(const Variable& x, const Shape& dims);
Variable contiguous(const Variable& x);
Variable narrow(const Variable& x, std::int64_t dim, std::int64_t start, std::int64_t length);
Variable cat(const std::vector<Variable>& xs, std::int64_t dim);
Variable stack(const std::vector<Variable>& xs, std::int64_t dim);
Variable expand(const Variable& x, const Shape& shape);
// Each slice along dim repeated `repeats` times in place: [a, b] -> [a, a, b, b]
// (how grouped KV heads are widened to the query heads).
Variable repeat_interleave(const Variable& x, std::int64_t repeats, std::int64_t dim);

// ---- attention pieces ----
// A row that is all -inf (every key masked) gives zeros rather than PyTorch's NaN.
Variable softmax(const Variable& x, std::int64_t dim);
// Where mask is true the output holds `value` (PyTorch's masked_fill); mask
// (bool) broadcasts to x. !! Attention masks say True = attend, so masking
// scores is masked_fill(s, logical_not(attend), -inf). !!
Variable masked_fill(const Variable& x, const Tensor& mask, double value);
// [Tq, Tk] bool, True where query i may attend key j: j <= i + shift. Shift 0
// aligns top-left when Tq != Tk (PyTorch's is_causal); shift Tk - Tq aligns
// bottom-right (FlashAttention 2.1+, causal_lower_right), and then with
// Tq > Tk the first Tq - Tk rows attend nothing.
Tensor causal_mask(std::int64_t tq, std::int64_t tk, std::int64_t shift = 0);
// softmax(masked_fill(scale(x, s), !attend, -inf), -1) as ONE op with one
// backward: a single pass over [..., Tq, Tk] each way instead of three, no
// mask tensor when causal (key j > query i + causal_shift is masked from the
// indices), and exactly the same values. attend: bool broadcast to x, or undefined.
Variable masked_softmax(const Variable& x, double scale, const Tensor& attend, bool causal,
                        std::int64_t causal_shift = 0);
Tensor logical_not(const Tensor& mask);
// Logit soft-capping (Gemma 2): cap * tanh(x / cap), cap > 0; backward
// dx = dy * (1 - tanh^2(x / cap)). Attention caps the scaled scores before
// any mask (a masked score stays -inf).
Variable softcap(const Variable& x, double cap);
// a && b on their broadcast shape (bool): two masks combined, a key attended
// where both allow it.
Tensor logical_and(const Tensor& a, const Tensor& b);

// ---- normalization ----
// RMSNorm over the last dim (QK-norm): x [..., n], w [n] ->
// x / sqrt(mean(x^2) + eps) * g with g = w, or g = 1 + w when one_plus_w
// (Gemma's unit offset; dw is the same either way). Statistics in float64,
// one rounding to x's dtype; a hand-written backward (core/src/ops/rms_norm.cpp).
Variable rms_norm(const Variable& x, const Variable& w, double eps, bool one_plus_w = false);

// ---- rotary position embeddings (RoPE) ----
struct RopeSpec;  // style, theta, rotary width, positions: headgrad/attention.hpp
// x [..., T, d] -> [..., T, d]: pair k of the first r dims rotates by
// phi = p_t * theta^(-2k/r) (angles and tables in float64); dims [r, d) pass
// through bitwise unchanged. Backward: dx = R^T dy (rotation by -phi).
// Positions [T] or [B, T] align with the FIRST dims of x: for x [B, H, T, d]
// a [B, T] positions tensor is shared by the heads of each batch row.
// !! Right-aligned broadcasting would put B on the head axis. !!
Variable rope(const Variable& x, const RopeSpec& spec);
// int64 token positions as the float64 tensor rope() reads (the tensor type
// has no integer dtype; float64 holds every integer up to 2^53 exactly).
Tensor positions_tensor(const std::vector<std::int64_t>& values, const Shape& shape);

// The dims two shapes broadcast to; throws naming `op` when they cannot.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace headgrad
