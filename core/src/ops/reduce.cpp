// sum and mean, over everything or one dim, and their backward.
#include "headgrad/kernels.hpp"
#include "headgrad/ops.hpp"

namespace headgrad {

namespace {
std::int64_t checked_dim(const Variable& x, std::int64_t dim, const char* op) {
  return normalize_dim(dim, x.dim(), x.shape(), op);
}
}  // namespace

Variable sum(const Variable& x) {
  return Variable::from_op("sum", kernels::sum_all(x.data()), {x},
                           [](const Tensor& g, std::vector<Variable>& in) {
                             in[0].accumulate_grad(g.expand(in[0].shape()));
                           });
}

Variable sum(const Variable& x, std::int64_t dim, bool keepdim) {
  const std::int64_t d = checked_dim(x, dim, "sum");
  return Variable::from_op("sum", kernels::sum_dim(x.data(), d, keepdim), {x},
                           [d, keepdim](const Tensor& g, std::vector<Variable>& in) {
                             const Tensor gk = keepdim ? g : g.unsqueeze(d);
                             in[0].accumulate_grad(gk.expand(in[0].shape()));
                           });
}

Variable mean(const Variable& x) {
  return scale(sum(x), 1.0 / static_cast<double>(x.numel()));
}

Variable mean(const Variable& x, std::int64_t dim, bool keepdim) {
  const std::int64_t d = checked_dim(x, dim, "mean");
  return scale(sum(x, d, keepdim), 1.0 / static_cast<double>(x.size(d)));
}

}  // namespace headgrad
