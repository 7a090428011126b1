// matmul and linear, with their backward.
#include "headgrad/kernels.hpp"
#include "headgrad/ops.hpp"

namespace headgrad {

Variable matmul(const Variable& a, const Variable& b) {
  Tensor out = kernels::matmul(a.data(), b.data());
  return Variable::from_op(
      "matmul", std::move(out), {a, b}, [](const Tensor& dc, std::vector<Variable>& in) {
        const Tensor& a = in[0].data();
        const Tensor& b = in[1].data();
        // forward: c = a @ b, so da = dc @ b^T and db = a^T @ dc, each summed
        // over the batch dims its operand was broadcast along.
        if (in[0].requires_grad())
          in[0].accumulate_grad(kernels::sum_to(kernels::matmul(dc, b.transpose(-2, -1)), a.shape()));
        if (in[1].requires_grad()) {
          if (b.dim() == 2 && a.dim() > 2) {
            // One GEMM over the folded rows: db = a2^T @ dc2 with a2 [N, K], dc2 [N, N'].
            const Tensor a2 = a.reshape({-1, a.size(-1)});
            const Tensor dc2 = dc.reshape({-1, dc.size(-1)});
            in[1].accumulate_grad(kernels::matmul(a2.transpose(0, 1), dc2));
          } else {
            in[1].accumulate_grad(kernels::sum_to(kernels::matmul(a.transpose(-2, -1), dc), b.shape()));
          }
        }
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
