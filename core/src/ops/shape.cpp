// Shape ops: views where strides allow, copies where they must; and their
// backward, which routes each gradient element back to where it came from.
#include <numeric>

#include "headgrad/kernels.hpp"
#include "headgrad/ops.hpp"

namespace headgrad {

namespace {
std::int64_t checked_dim(std::int64_t dim, std::int64_t ndim, const Shape& shape, const char* op) {
  return normalize_dim(dim, ndim, shape, op);
}

// The gradient of any reshape is the upstream gradient in the input's shape.
BackwardFn reshape_back() {
  return [](const Tensor& g, const BackwardContext& c) {
    return std::vector<Tensor>{g.reshape(c.input_shapes[0])};
  };
}

// Whether `requested` (at most one -1) names x's own shape: then view and
// reshape return x itself, since a graph node costs more than a small op's
// arithmetic (docs/performance.md: the engine overhead at (2,3,8,2)).
bool names_own_shape(const Shape& requested, const Shape& own) {
  if (requested.size() != own.size()) return false;
  int free_dims = 0;
  for (std::size_t i = 0; i < own.size(); ++i) {
    if (own[i] == 0) return false;  // -1 would be ambiguous: leave it to the checks
    if (requested[i] == -1) ++free_dims;
    else if (requested[i] != own[i]) return false;
  }
  return free_dims <= 1;  // the other dims match, so a single -1 infers its own size
}
}  // namespace

Variable view(const Variable& x, const Shape& shape) {
  if (names_own_shape(shape, x.shape())) return x;
  return Variable::from_op("view", x.data().view(shape), {x}, {}, reshape_back());
}

Variable reshape(const Variable& x, const Shape& shape) {
  if (names_own_shape(shape, x.shape())) return x;
  return Variable::from_op("reshape", x.data().reshape(shape), {x}, {}, reshape_back());
}

Variable contiguous(const Variable& x) {
  return Variable::from_op("contiguous", x.data().contiguous(), {x}, {},
                           [](const Tensor& g, const BackwardContext&) { return std::vector<Tensor>{g}; });
}

Variable transpose(const Variable& x, std::int64_t d0, std::int64_t d1) {
  return Variable::from_op("transpose", x.data().transpose(d0, d1), {x}, {},
                           [d0, d1](const Tensor& g, const BackwardContext&) {
                             return std::vector<Tensor>{g.transpose(d0, d1)};
                           });
}

Variable permute(const Variable& x, const Shape& dims) {
  Tensor out = x.data().permute(dims);  // validates dims
  Shape inverse(dims.size());
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const std::int64_t d = dims[i] < 0 ? dims[i] + x.dim() : dims[i];
    inverse[d] = static_cast<std::int64_t>(i);
  }
  return Variable::from_op("permute", std::move(out), {x}, {},
                           [inverse](const Tensor& g, const BackwardContext&) {
                             return std::vector<Tensor>{g.permute(inverse)};
                           });
}

Variable narrow(const Variable& x, std::int64_t dim, std::int64_t start, std::int64_t length) {
  Tensor out = x.data().narrow(dim, start, length);
  const std::int64_t d = checked_dim(dim, x.dim(), x.shape(), "narrow");
  // backward: g goes into the slice of x's gradient (the engine's own, in place)
  return Variable::from_slice("narrow", std::move(out), x, d, start);
}

Variable cat(const std::vector<Variable>& xs, std::int64_t dim) {
  if (xs.empty()) throw std::invalid_argument("cat: no tensors");
  const Shape& first = xs[0].shape();
  const std::int64_t d = checked_dim(dim, static_cast<std::int64_t>(first.size()), first, "cat");
  Shape out_shape = first;
  out_shape[d] = 0;
  for (const auto& x : xs) {
    Shape a = x.shape(), b = first;
    if (a.size() == b.size()) a[d] = b[d] = 0;
    if (a != b || x.dtype() != xs[0].dtype())
      throw std::invalid_argument("cat: tensor " + shape_str(x.shape()) + " (" +
                                  std::string(dtype_name(x.dtype())) + ") does not fit " +
                                  shape_str(first) + " (" + std::string(dtype_name(xs[0].dtype())) +
                                  ") along dim " + std::to_string(dim));
    out_shape[d] += x.size(d);
  }
  Tensor out = Tensor::empty(out_shape, xs[0].dtype());
  std::vector<std::int64_t> starts;
  std::int64_t at = 0;
  for (const auto& x : xs) {
    starts.push_back(at);
    out.narrow(d, at, x.size(d)).copy_(x.data());
    at += x.size(d);
  }
  return Variable::from_op("cat", std::move(out), xs, {},
                           [d, starts](const Tensor& g, const BackwardContext& c) {
                             std::vector<Tensor> grads(starts.size());
                             for (std::size_t i = 0; i < grads.size(); ++i)
                               if (c.needs_input_grad[i])
                                 grads[i] = g.narrow(d, starts[i], c.input_shapes[i][d]);
                             return grads;
                           });
}

Variable stack(const std::vector<Variable>& xs, std::int64_t dim) {
  if (xs.empty()) throw std::invalid_argument("stack: no tensors");
  const std::int64_t d = checked_dim(dim, xs[0].dim() + 1, xs[0].shape(), "stack");
  std::vector<Variable> parts;
  for (const auto& x : xs) {
    if (x.shape() != xs[0].shape())
      throw std::invalid_argument("stack: shapes " + shape_str(xs[0].shape()) + " and " +
                                  shape_str(x.shape()) + " differ");
    Shape s = x.shape();
    s.insert(s.begin() + d, 1);
    parts.push_back(reshape(x, s));
  }
  return cat(parts, d);
}

Variable expand(const Variable& x, const Shape& shape) {
  return Variable::from_op("expand", x.data().expand(shape), {x}, {},
                           [](const Tensor& g, const BackwardContext& c) {
                             return std::vector<Tensor>{kernels::sum_to(g, c.input_shapes[0])};
                           });
}

Variable repeat_interleave(const Variable& x, std::int64_t repeats, std::int64_t dim) {
  if (repeats < 1)
    throw std::invalid_argument("repeat_interleave: repeats must be >= 1, got " +
                                std::to_string(repeats));
  const std::int64_t d = checked_dim(dim, x.dim(), x.shape(), "repeat_interleave");
  // [.., n, ..] -> unsqueeze -> [.., n, 1, ..] -> expand [.., n, r, ..] -> [.., n*r, ..]
  Shape wide = x.shape();
  wide.insert(wide.begin() + d + 1, repeats);
  Shape out_shape = x.shape();
  out_shape[d] *= repeats;
  Tensor out = x.data().unsqueeze(d + 1).expand(wide).reshape(out_shape);
  return Variable::from_op("repeat_interleave", std::move(out), {x}, {},
                           [d, wide](const Tensor& g, const BackwardContext&) {
                             return std::vector<Tensor>{kernels::sum_dim(g.reshape(wide), d + 1, false)};
                           });
}

}  // namespace headgrad
