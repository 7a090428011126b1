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
  // One node for y = x W^T rather than a transpose and a matmul: at small
  // shapes each graph node costs more than its arithmetic.
  // forward: y [..., out] = x [..., in] @ W^T, W [out, in]; so dx = dy @ W
  // and dW = dy2^T @ x2 over the folded rows (x2 [N, in], dy2 [N, out]).
  Tensor out = kernels::matmul(x.data(), w.data().transpose(0, 1));
  // Built in place: a braced list would copy each tensor twice (shape and
  // strides are heap vectors), and linear is the hottest op of a small model.
  std::vector<Tensor> saved(2);
  if (w.requires_grad()) saved[0] = x.data();
  if (x.requires_grad()) saved[1] = w.data();
  return Variable::from_op(
      "linear", std::move(out), {x, w}, std::move(saved),
      [](const Tensor& dy, const BackwardContext& c) {
        const Tensor &x = c.saved[0], &w = c.saved[1];
        std::vector<Tensor> grads(2);
        if (c.needs_input_grad[0]) grads[0] = kernels::matmul(dy, w);
        if (c.needs_input_grad[1]) {
          const Tensor x2 = x.reshape({-1, x.size(-1)});
          const Tensor dy2 = dy.reshape({-1, dy.size(-1)});
          grads[1] = kernels::matmul(dy2.transpose(0, 1), x2);
        }
        return grads;
      });
}

}  // namespace headgrad
