// Elementwise ops with broadcasting, and their backward.
#include "headgrad/kernels.hpp"
#include "headgrad/ops.hpp"

namespace headgrad {

using kernels::BinaryOp;
using kernels::UnaryOp;

Variable add(const Variable& a, const Variable& b) {
  return Variable::from_op("add", kernels::binary(BinaryOp::add, a.data(), b.data()), {a, b},
                           [](const Tensor& g, std::vector<Variable>& in) {
                             in[0].accumulate_grad(kernels::sum_to(g, in[0].shape()));
                             in[1].accumulate_grad(kernels::sum_to(g, in[1].shape()));
                           });
}

Variable sub(const Variable& a, const Variable& b) {
  return Variable::from_op("sub", kernels::binary(BinaryOp::sub, a.data(), b.data()), {a, b},
                           [](const Tensor& g, std::vector<Variable>& in) {
                             in[0].accumulate_grad(kernels::sum_to(g, in[0].shape()));
                             if (in[1].requires_grad())
                               in[1].accumulate_grad(kernels::sum_to(kernels::scale(g, -1.0), in[1].shape()));
                           });
}

Variable mul(const Variable& a, const Variable& b) {
  return Variable::from_op(
      "mul", kernels::binary(BinaryOp::mul, a.data(), b.data()), {a, b},
      [](const Tensor& g, std::vector<Variable>& in) {
        // forward: c = a * b
        if (in[0].requires_grad())
          in[0].accumulate_grad(kernels::sum_to(kernels::binary(BinaryOp::mul, g, in[1].data()), in[0].shape()));
        if (in[1].requires_grad())
          in[1].accumulate_grad(kernels::sum_to(kernels::binary(BinaryOp::mul, g, in[0].data()), in[1].shape()));
      });
}

Variable div(const Variable& a, const Variable& b) {
  Tensor out = kernels::binary(BinaryOp::div, a.data(), b.data());
  return Variable::from_op(
      "div", out, {a, b}, [out](const Tensor& g, std::vector<Variable>& in) {
        // forward: c = a / b, so da = g / b and db = -g * c / b
        const Tensor g_over_b = kernels::binary(BinaryOp::div, g, in[1].data());
        if (in[0].requires_grad()) in[0].accumulate_grad(kernels::sum_to(g_over_b, in[0].shape()));
        if (in[1].requires_grad())
          in[1].accumulate_grad(kernels::sum_to(
              kernels::scale(kernels::binary(BinaryOp::mul, g_over_b, out), -1.0), in[1].shape()));
      });
}

Variable scale(const Variable& x, double factor) {
  return Variable::from_op("scale", kernels::scale(x.data(), factor), {x},
                           [factor](const Tensor& g, std::vector<Variable>& in) {
                             in[0].accumulate_grad(kernels::scale(g, factor));
                           });
}

Variable neg(const Variable& x) {
  return Variable::from_op("neg", kernels::unary(UnaryOp::neg, x.data()), {x},
                           [](const Tensor& g, std::vector<Variable>& in) {
                             in[0].accumulate_grad(kernels::unary(UnaryOp::neg, g));
                           });
}

Variable exp(const Variable& x) {
  Tensor out = kernels::unary(UnaryOp::exp, x.data());
  return Variable::from_op("exp", out, {x}, [out](const Tensor& g, std::vector<Variable>& in) {
    in[0].accumulate_grad(kernels::binary(BinaryOp::mul, g, out));  // d exp(x) = exp(x) dx
  });
}

Variable log(const Variable& x) {
  return Variable::from_op("log", kernels::unary(UnaryOp::log, x.data()), {x},
                           [](const Tensor& g, std::vector<Variable>& in) {
                             in[0].accumulate_grad(kernels::binary(BinaryOp::div, g, in[0].data()));
                           });
}

}  // namespace headgrad
