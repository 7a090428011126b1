// matmul and linear, with their backward.
#include "headgrad/kernels.hpp"
#include "headgrad/ops.hpp"

namespace headgrad {

Variable matmul(const Variable& a, const Variable& b) {
  Tensor out = kernels::matmul(a.data(), b.data());
  // forward: c = a @ b, so da = dc @ b^T and db = a^T @ dc, each summed over
  // the batch dims its operand was broadcast along: each saves the other operand.
  return Variable::from_op(
      "matmul", std::move(out), {a, b},
      {b.requires_grad() ? a.data() : Tensor(), a.requires_grad() ? b.data() : Tensor()},
      [](const Tensor& dc, const BackwardContext& c) {
        const Tensor &a = c.saved[0], &b = c.saved[1];
        const Shape &a_shape = c.input_shapes[0], &b_shape = c.input_shapes[1];
        std::vector<Tensor> grads(2);
        if (c.needs_input_grad[0])
          grads[0] = kernels::sum_to(kernels::matmul(dc, b.transpose(-2, -1)), a_shape);
        if (c.needs_input_grad[1]) {
          if (b_shape.size() == 2 && a_shape.size() > 2) {
            // One GEMM over the folded rows: db = a2^T @ dc2 with a2 [N, K], dc2 [N, N'].
            const Tensor a2 = a.reshape({-1, a.size(-1)});
            const Tensor dc2 = dc.reshape({-1, dc.size(-1)});
            grads[1] = kernels::matmul(a2.transpose(0, 1), dc2);
          } else {
            grads[1] = kernels::sum_to(kernels::matmul(a.transpose(-2, -1), dc), b_shape);
          }
        }
        return grads;
      });
}

Variable linear(const Variable& x, const Variable& w) {
  if (w.dim() != 2 || x.dim() < 1 || x.size(-1) != w.size(1))
    throw std::invalid_argument("linear: input " + shape_str(x.shape()) +
                                " and weight " + shape_str(w.shape()) +
                                " do not fit (weight is [out, in] and in must equal the input's last dim)");
  if (x.dim() == 1) return view(matmul(view(x, {1, x.size(0)}), transpose(w, 0, 1)), {w.size(0)});
  return matmul(x, transpose(w, 0, 1));
}

}  // namespace headgrad
