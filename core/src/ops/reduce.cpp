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
  return Variable::from_op("sum", kernels::sum_all(x.data()), {x}, {},
                           [](const Tensor& g, const BackwardContext& c) {
                             return std::vector<Tensor>{g.expand(c.input_shapes[0])};
                           });
}

Variable sum(const Variable& x, std::int64_t dim, bool keepdim) {
  const std::int64_t d = checked_dim(x, dim, "sum");
  return Variable::from_op("sum", kernels::sum_dim(x.data(), d, keepdim), {x}, {},
                           [d, keepdim](const Tensor& g, const BackwardContext& c) {
                             const Tensor gk = keepdim ? g : g.unsqueeze(d);
                             return std::vector<Tensor>{gk.expand(c.input_shapes[0])};
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
