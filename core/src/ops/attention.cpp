// The pieces attention is built from: softmax, masked_fill, causal masks.
#include "headgrad/kernels.hpp"
#include "headgrad/ops.hpp"

namespace headgrad {

Variable softmax(const Variable& x, std::int64_t dim) {
  Tensor y = kernels::softmax(x.data(), dim);
  return Variable::from_op("softmax", y, {x}, [y, dim](const Tensor& g, std::vector<Variable>& in) {
    in[0].accumulate_grad(kernels::softmax_backward(y, g, dim));
  });
}

Variable masked_fill(const Variable& x, const Tensor& mask, double value) {
  Tensor out = kernels::masked_fill(x.data(), mask, value);
  return Variable::from_op("masked_fill", std::move(out), {x},
                           [mask](const Tensor& g, std::vector<Variable>& in) {
                             // filled elements are constants: no gradient flows to them
                             in[0].accumulate_grad(kernels::masked_fill(g, mask, 0.0));
                           });
}

Variable masked_softmax(const Variable& x, double scale, const Tensor& attend, bool causal,
                        std::int64_t causal_shift) {
  Tensor y = kernels::masked_softmax(x.data(), scale, attend, causal, causal_shift);
  return Variable::from_op(
      "masked_softmax", y, {x}, [y, scale, causal, causal_shift](const Tensor& g, std::vector<Variable>& in) {
        in[0].accumulate_grad(kernels::masked_softmax_backward(y, g, scale, causal, causal_shift));
      });
}

Tensor causal_mask(std::int64_t tq, std::int64_t tk, std::int64_t shift) {
  if (tq < 0 || tk < 0)
    throw std::invalid_argument("causal_mask: negative length (" + std::to_string(tq) + ", " +
                                std::to_string(tk) + ")");
  Tensor m = Tensor::empty({tq, tk}, DType::boolean);
  bool* p = m.data<bool>();
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
  bool* o = out.data<bool>();
  for (std::int64_t i = 0; i < out.numel(); ++i) o[i] = !s[i];
  return out;
}

}  // namespace headgrad
