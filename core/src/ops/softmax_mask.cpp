// The pieces attention is built from: softmax, masked_fill, causal masks.
#include "headgrad/kernels.hpp"
#include "headgrad/ops.hpp"

namespace headgrad {

Variable softmax(const Variable& x, std::int64_t dim) {
  Tensor y = kernels::softmax(x.data(), dim);
  return Variable::from_op("softmax", y, {x}, {y}, [dim](const Tensor& g, const BackwardContext& c) {
    return std::vector<Tensor>{kernels::softmax_backward(c.saved[0], g, dim)};
  });
}

Variable masked_fill(const Variable& x, const Tensor& mask, double value) {
  Tensor out = kernels::masked_fill(x.data(), mask, value);
  return Variable::from_op("masked_fill", std::move(out), {x}, {mask},
                           [](const Tensor& g, const BackwardContext& c) {
                             // filled elements are constants: no gradient flows to them
                             return std::vector<Tensor>{kernels::masked_fill(g, c.saved[0], 0.0)};
                           });
}

Variable masked_softmax(const Variable& x, double scale, const Tensor& attend, bool causal,
                        std::int64_t causal_shift) {
  Tensor y = kernels::masked_softmax(x.data(), scale, attend, causal, causal_shift);
  // The backward needs the weights y only: the scores x are not kept.
  return Variable::from_op(
      "masked_softmax", y, {x}, {y},
      [scale, causal, causal_shift](const Tensor& g, const BackwardContext& c) {
        return std::vector<Tensor>{
            kernels::masked_softmax_backward(c.saved[0], g, scale, causal, causal_shift)};
      });
}

Tensor causal_mask(std::int64_t tq, std::int64_t tk, std::int64_t shift) {
  if (tq < 0 || tk < 0)
    throw std::invalid_argument("causal_mask: negative length (" + std::to_string(tq) + ", " +
                                std::to_string(tk) + ")");
  Tensor m = Tensor::empty({tq, tk}, DType::boolean);
  bool* p = m.mutable_data<bool>();
  for (std::int64_t i = 0; i < tq; ++i)
    for (std::int64_t j = 0; j < tk; ++j) p[i * tk + j] = j <= i + shift;
  return m;
}

Tensor logical_not(const Tensor& mask) {
  if (mask.dtype() != DType::boolean)
    throw std::invalid_argument("logical_not: expected a bool tensor, got " +
                                std::string(dtype_name(mask.dtype())));
  Tensor src = mask.contiguous();
  Tensor out = Tensor::empty(mask.shape(), DType::boolean);
  const bool* s = src.data<bool>();
  bool* o = out.mutable_data<bool>();
  const std::int64_t n = out.numel();  // once: numel() walks the shape
  for (std::int64_t i = 0; i < n; ++i) o[i] = !s[i];
  return out;
}

Tensor logical_and(const Tensor& a, const Tensor& b) {
  if (a.dtype() != DType::boolean || b.dtype() != DType::boolean)
    throw std::invalid_argument("logical_and: expected bool tensors, got " + std::string(dtype_name(a.dtype())) +
                                " and " + std::string(dtype_name(b.dtype())));
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), "logical_and");
  Tensor both = Tensor::empty(shape, DType::boolean);
  const Tensor ea = a.expand(shape), eb = b.expand(shape);
  for (std::int64_t i = 0; i < both.numel(); ++i) both.set_flat(i, ea.flat(i) != 0 && eb.flat(i) != 0);
  return both;
}

}  // namespace headgrad
