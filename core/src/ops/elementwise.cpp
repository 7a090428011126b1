// Elementwise ops with broadcasting, and their backward.
#include <cmath>
#include <stdexcept>
#include <string>

#include "headgrad/kernels.hpp"
#include "headgrad/ops.hpp"

namespace headgrad {

using kernels::BinaryOp;
using kernels::UnaryOp;

Variable add(const Variable& a, const Variable& b) {
  return Variable::from_op(
      "add", kernels::binary(BinaryOp::add, a.data(), b.data()), {a, b}, {},
      [](const Tensor& g, const BackwardContext& c) {
        return std::vector<Tensor>{
            c.needs_input_grad[0] ? kernels::sum_to(g, c.input_shapes[0]) : Tensor(),
            c.needs_input_grad[1] ? kernels::sum_to(g, c.input_shapes[1]) : Tensor()};
      });
}

Variable sub(const Variable& a, const Variable& b) {
  return Variable::from_op(
      "sub", kernels::binary(BinaryOp::sub, a.data(), b.data()), {a, b}, {},
      [](const Tensor& g, const BackwardContext& c) {
        return std::vector<Tensor>{
            c.needs_input_grad[0] ? kernels::sum_to(g, c.input_shapes[0]) : Tensor(),
            c.needs_input_grad[1] ? kernels::sum_to(kernels::scale(g, -1.0), c.input_shapes[1])
                                  : Tensor()};
      });
}

Variable mul(const Variable& a, const Variable& b) {
  // forward: c = a * b, so da = g * b and db = g * a: each saves the other operand.
  return Variable::from_op(
      "mul", kernels::binary(BinaryOp::mul, a.data(), b.data()), {a, b},
      {b.requires_grad() ? a.data() : Tensor(), a.requires_grad() ? b.data() : Tensor()},
      [](const Tensor& g, const BackwardContext& c) {
        const Tensor &a = c.saved[0], &b = c.saved[1];
        return std::vector<Tensor>{
            c.needs_input_grad[0]
                ? kernels::sum_to(kernels::binary(BinaryOp::mul, g, b), c.input_shapes[0])
                : Tensor(),
            c.needs_input_grad[1]
                ? kernels::sum_to(kernels::binary(BinaryOp::mul, g, a), c.input_shapes[1])
                : Tensor()};
      });
}

Variable div(const Variable& a, const Variable& b) {
  Tensor out = kernels::binary(BinaryOp::div, a.data(), b.data());
  // forward: c = a / b, so da = g / b and db = -g * c / b
  return Variable::from_op(
      "div", out, {a, b}, {b.data(), b.requires_grad() ? out : Tensor()},
      [](const Tensor& g, const BackwardContext& c) {
        const Tensor &b = c.saved[0], &out = c.saved[1];
        const Tensor g_over_b = kernels::binary(BinaryOp::div, g, b);
        return std::vector<Tensor>{
            c.needs_input_grad[0] ? kernels::sum_to(g_over_b, c.input_shapes[0]) : Tensor(),
            c.needs_input_grad[1]
                ? kernels::sum_to(kernels::scale(kernels::binary(BinaryOp::mul, g_over_b, out), -1.0),
                                  c.input_shapes[1])
                : Tensor()};
      });
}

Variable scale(const Variable& x, double factor) {
  return Variable::from_op("scale", kernels::scale(x.data(), factor), {x}, {},
                           [factor](const Tensor& g, const BackwardContext&) {
                             return std::vector<Tensor>{kernels::scale(g, factor)};
                           });
}

Variable neg(const Variable& x) {
  return Variable::from_op("neg", kernels::unary(UnaryOp::neg, x.data()), {x}, {},
                           [](const Tensor& g, const BackwardContext&) {
                             return std::vector<Tensor>{kernels::unary(UnaryOp::neg, g)};
                           });
}

Variable exp(const Variable& x) {
  Tensor out = kernels::unary(UnaryOp::exp, x.data());
  return Variable::from_op("exp", out, {x}, {out}, [](const Tensor& g, const BackwardContext& c) {
    return std::vector<Tensor>{kernels::binary(BinaryOp::mul, g, c.saved[0])};  // d exp(x) = exp(x) dx
  });
}

Variable log(const Variable& x) {
  return Variable::from_op("log", kernels::unary(UnaryOp::log, x.data()), {x}, {x.data()},
                           [](const Tensor& g, const BackwardContext& c) {
                             return std::vector<Tensor>{kernels::binary(BinaryOp::div, g, c.saved[0])};
                           });
}

Variable softcap(const Variable& x, double cap) {
  if (!(cap > 0.0) || !std::isfinite(cap))
    throw std::invalid_argument("softcap: the cap must be a finite number > 0, got " + std::to_string(cap));
  Tensor out = kernels::softcap(x.data(), cap);
  return Variable::from_op("softcap", out, {x}, {out}, [cap](const Tensor& g, const BackwardContext& c) {
    return std::vector<Tensor>{kernels::softcap_backward(g, c.saved[0], cap)};  // d tanh = 1 - tanh^2
  });
}

Variable cast(const Variable& x, DType dtype) {
  if (dtype == DType::boolean || x.dtype() == DType::boolean)
    throw std::invalid_argument(std::string("cast: float dtypes only, got ") +
                                std::string(dtype_name(x.dtype())) + " -> " +
                                std::string(dtype_name(dtype)));
  if (dtype == x.dtype()) return x;
  const DType from = x.dtype();
  return Variable::from_op("cast", x.data().to(dtype), {x}, {},
                           [from](const Tensor& g, const BackwardContext&) {
                             // forward: y = x in dtype; so dx = dy in x's dtype
                             return std::vector<Tensor>{g.to(from)};
                           });
}

}  // namespace headgrad
