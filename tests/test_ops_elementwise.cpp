// Elementwise ops: add, sub, mul, div (broadcasting) and scale, neg, exp, log.
// For each: forward against a plain loop over std::vector<double>, gradcheck in
// float64 on contiguous, transposed and narrowed inputs, and gradcheck with
// fan-out (an input feeding two ops).
//
// Shape legend: shapes outermost first; broadcasting is numpy's (right-aligned,
// size-1 and missing leading dims stretch).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "headgrad/gradcheck.hpp"
#include "headgrad/ops.hpp"
#include "op_test_util.hpp"

namespace test_ops_elementwise {  // this file's names: test files share unity builds (tests/meson.build)

namespace {

using namespace headgrad;
using namespace headgrad::test;

// ---------------------------------------------------------------- helpers

// The element of v (row-major, shape vs) that broadcasts to flat index i of `out`.
double broadcast_at(const std::vector<double>& v, const Shape& vs, const Shape& out, std::int64_t i) {
  std::int64_t off = 0, stride = 1;
  for (std::size_t k = 0; k < out.size(); ++k) {
    const std::size_t d = out.size() - 1 - k;  // out dim, from the last
    const std::int64_t idx = i % out[d];
    i /= out[d];
    if (k < vs.size()) {
      const std::size_t vd = vs.size() - 1 - k;
      if (vs[vd] != 1) off += idx * stride;
      stride *= vs[vd];
    }
  }
  return v[static_cast<std::size_t>(off)];
}

// ---------------------------------------------------------------- binary ops

enum class Bin { add, sub, mul, div };
const char* bin_name(Bin op) {
  switch (op) {
    case Bin::add: return "add";
    case Bin::sub: return "sub";
    case Bin::mul: return "mul";
    case Bin::div: return "div";
  }
  return "?";
}
Variable apply(Bin op, const Variable& a, const Variable& b) {
  switch (op) {
    case Bin::add: return add(a, b);
    case Bin::sub: return sub(a, b);
    case Bin::mul: return mul(a, b);
    case Bin::div: return div(a, b);
  }
  throw std::logic_error("unknown op");
}
double apply_ref(Bin op, double a, double b) {
  switch (op) {
    case Bin::add: return a + b;
    case Bin::sub: return a - b;
    case Bin::mul: return a * b;
    case Bin::div: return a / b;
  }
  return 0.0;
}

struct ShapePair {
  Shape a, b, out;
};
void PrintTo(const ShapePair& p, std::ostream* os) {
  *os << shape_str(p.a) << " with " << shape_str(p.b);
}

const ShapePair kPairs[] = {
    {{2, 3, 4}, {2, 3, 4}, {2, 3, 4}},
    {{2, 3, 4}, {4}, {2, 3, 4}},
    {{2, 3, 4}, {3, 1}, {2, 3, 4}},
    {{2, 3, 4}, {1, 3, 4}, {2, 3, 4}},
    {{4}, {2, 3, 4}, {2, 3, 4}},       // the left operand broadcasts
    {{3, 1}, {1, 4}, {3, 4}},          // both broadcast
    {{}, {2, 3}, {2, 3}},              // scalar
    {{2, 1, 4}, {3, 1}, {2, 3, 4}},    // both broadcast, different ranks
};

using BinaryParam = std::tuple<Bin, ShapePair, Layout>;
class BinaryOpTest : public ::testing::TestWithParam<BinaryParam> {
 protected:
  Bin op() const { return std::get<0>(GetParam()); }
  const ShapePair& shapes() const { return std::get<1>(GetParam()); }
  Layout layout() const { return std::get<2>(GetParam()); }
  // a and b; div keeps both away from 0.
  std::vector<Tensor> inputs() const {
    const bool positive = op() == Bin::div;
    return {make(shapes().a, layout(), 1, positive), make(shapes().b, layout(), 2, positive)};
  }
};

TEST_P(BinaryOpTest, ForwardMatchesLoop) {
  const auto in = inputs();
  const Variable out = apply(op(), Variable(in[0]), Variable(in[1]));
  const std::vector<double> a = in[0].to_vector(), b = in[1].to_vector();
  const Shape& os = shapes().out;
  std::vector<double> want(static_cast<std::size_t>(shape_numel(os)));
  for (std::int64_t i = 0; i < shape_numel(os); ++i)
    want[static_cast<std::size_t>(i)] = apply_ref(op(), broadcast_at(a, shapes().a, os, i),
                                                  broadcast_at(b, shapes().b, os, i));
  expect_values(out.data(), os, want);
  EXPECT_EQ(out.data().dtype(), DType::float64);
}

TEST_P(BinaryOpTest, Gradcheck) {
  const Bin o = op();
  expect_gradcheck([o](const std::vector<Variable>& v) { return apply(o, v[0], v[1]); }, inputs());
}

TEST_P(BinaryOpTest, GradcheckFanOut) {
  // f(a, b) = op(a, b) * a + exp(b): a and b each feed two ops.
  const Bin o = op();
  expect_gradcheck(
      [o](const std::vector<Variable>& v) { return add(mul(apply(o, v[0], v[1]), v[0]), exp(v[1])); },
      inputs());
}

TEST_P(BinaryOpTest, GradcheckSameInputTwice) {
  // op(x, x) with x of the broadcast-free shape: both operand gradients land on x.
  const Bin o = op();
  const bool positive = o == Bin::div;
  expect_gradcheck([o](const std::vector<Variable>& v) { return mul(apply(o, v[0], v[0]), v[0]); },
                   {make(shapes().a, layout(), 3, positive)});
}

// e.g. "div_2x3x4_with_3x1_transposed"
std::string binary_param_name(const ::testing::TestParamInfo<BinaryParam>& info) {
  const auto& [op, p, layout] = info.param;
  return std::string(bin_name(op)) + "_" + shape_name(p.a) + "_with_" + shape_name(p.b) + "_" +
         layout_name(layout);
}

INSTANTIATE_TEST_SUITE_P(
    Sweep, BinaryOpTest,
    ::testing::Combine(::testing::Values(Bin::add, Bin::sub, Bin::mul, Bin::div),
                       ::testing::ValuesIn(kPairs),
                       ::testing::Values(Layout::contiguous, Layout::transposed, Layout::narrowed)),
    binary_param_name);

TEST(BinaryOps, HandWorkedValues) {
  const Variable a(Tensor::from_values(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, DType::float64));
  const Variable b(Tensor::from_values(std::vector<double>{10, 20, 30}, {3}, DType::float64));
  const Variable c(Tensor::from_values(std::vector<double>{2, 4}, {2, 1}, DType::float64));
  expect_values(add(a, b).data(), {2, 3}, {11, 22, 33, 14, 25, 36});
  expect_values(sub(a, b).data(), {2, 3}, {-9, -18, -27, -6, -15, -24});
  expect_values(mul(a, c).data(), {2, 3}, {2, 4, 6, 16, 20, 24});
  expect_values(div(a, c).data(), {2, 3}, {0.5, 1, 1.5, 1, 1.25, 1.5});
  expect_values(add(b, c).data(), {2, 3}, {12, 22, 32, 14, 24, 34});
}

TEST(BinaryOps, BroadcastGradientsAreSummedByHand) {
  // out = a [2, 3] * b [3]; loss = sum(out): da = b broadcast, db[j] = sum_i a[i][j].
  Variable a(Tensor::from_values(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, DType::float64), true);
  Variable b(Tensor::from_values(std::vector<double>{10, 20, 30}, {3}, DType::float64), true);
  sum(mul(a, b)).backward();
  expect_values(a.grad(), {2, 3}, {10, 20, 30, 10, 20, 30});
  expect_values(b.grad(), {3}, {5, 7, 9});
  // sub: d(a - b)/db = -1 per use: db[j] = -2.
  Variable a2(Tensor::ones({2, 3}, DType::float64), true);
  Variable b2(Tensor::ones({3}, DType::float64), true);
  sum(sub(a2, b2)).backward();
  expect_values(b2.grad(), {3}, {-2, -2, -2});
  // div: c = a / b, dc/db = -a / b^2: a = 6, b = 2 -> -1.5, twice.
  Variable a3(Tensor::full({2, 1}, 6.0, DType::float64), true);
  Variable b3(Tensor::full({1}, 2.0, DType::float64), true);
  sum(div(a3, b3)).backward();
  expect_values(a3.grad(), {2, 1}, {0.5, 0.5});
  expect_values(b3.grad(), {1}, {-3.0});
}

TEST(BinaryOps, NonBroadcastableShapesThrowNamingOpAndShapes) {
  const Variable a(Tensor::zeros({2, 3}, DType::float64));
  const Variable b(Tensor::zeros({4}, DType::float64));
  expect_invalid([&] { add(a, b); }, {"add", "[2, 3]", "[4]"});
  expect_invalid([&] { sub(a, b); }, {"sub", "[2, 3]", "[4]"});
  expect_invalid([&] { mul(b, a); }, {"mul", "[4]", "[2, 3]"});
  expect_invalid([&] { div(a, Variable(Tensor::zeros({3, 3}, DType::float64))); },
                 {"div", "[2, 3]", "[3, 3]"});
  expect_invalid([&] { add(a, Variable(Tensor::zeros({2, 3}, DType::float32))); },
                 {"add", "float64", "float32"});
}

TEST(BinaryOps, Float32MatchesFloat64) {
  const Tensor a = make({2, 3, 4}, Layout::transposed, 5, true);
  const Tensor b = make({3, 1}, Layout::contiguous, 6, true);
  for (Bin op : {Bin::add, Bin::sub, Bin::mul, Bin::div}) {
    const Tensor d = apply(op, Variable(a), Variable(b)).data();
    const Tensor f = apply(op, Variable(a.to(DType::float32)), Variable(b.to(DType::float32))).data();
    EXPECT_EQ(f.dtype(), DType::float32);
    expect_values(f, d.shape(), d.to_vector(), 1e-6);
  }
}

// ---------------------------------------------------------------- unary ops

enum class Un { scale, neg, exp, log };
const char* un_name(Un op) {
  switch (op) {
    case Un::scale: return "scale";
    case Un::neg: return "neg";
    case Un::exp: return "exp";
    case Un::log: return "log";
  }
  return "?";
}
Variable apply(Un op, const Variable& x) {
  switch (op) {
    case Un::scale: return scale(x, -0.75);
    case Un::neg: return neg(x);
    case Un::exp: return exp(x);
    case Un::log: return log(x);
  }
  throw std::logic_error("unknown op");
}
double apply_ref(Un op, double x) {
  switch (op) {
    case Un::scale: return -0.75 * x;
    case Un::neg: return -x;
    case Un::exp: return std::exp(x);
    case Un::log: return std::log(x);
  }
  return 0.0;
}

using UnaryParam = std::tuple<Un, Shape, Layout>;
class UnaryOpTest : public ::testing::TestWithParam<UnaryParam> {
 protected:
  Un op() const { return std::get<0>(GetParam()); }
  Tensor input(std::uint64_t seed = 1) const {
    return make(std::get<1>(GetParam()), std::get<2>(GetParam()), seed, op() == Un::log);
  }
};

TEST_P(UnaryOpTest, ForwardMatchesLoop) {
  const Tensor x = input();
  const Variable out = apply(op(), Variable(x));
  std::vector<double> want;
  for (double v : x.to_vector()) want.push_back(apply_ref(op(), v));
  expect_values(out.data(), x.shape(), want);
}

TEST_P(UnaryOpTest, Gradcheck) {
  const Un o = op();
  expect_gradcheck([o](const std::vector<Variable>& v) { return apply(o, v[0]); }, {input()});
}

TEST_P(UnaryOpTest, GradcheckFanOut) {
  // f(x) = op(x) * x
  const Un o = op();
  expect_gradcheck([o](const std::vector<Variable>& v) { return mul(apply(o, v[0]), v[0]); }, {input()});
}

// e.g. "log_5_narrowed"
std::string unary_param_name(const ::testing::TestParamInfo<UnaryParam>& info) {
  const auto& [op, shape, layout] = info.param;
  return std::string(un_name(op)) + "_" + shape_name(shape) + "_" + layout_name(layout);
}

INSTANTIATE_TEST_SUITE_P(
    Sweep, UnaryOpTest,
    ::testing::Combine(::testing::Values(Un::scale, Un::neg, Un::exp, Un::log),
                       ::testing::Values(Shape{2, 3, 4}, Shape{5}, Shape{}),
                       ::testing::Values(Layout::contiguous, Layout::transposed, Layout::narrowed)),
    unary_param_name);

TEST(UnaryOps, HandWorkedValuesAndGradients) {
  Variable x(Tensor::from_values(std::vector<double>{1.0, 2.0, 4.0}, {3}, DType::float64), true);
  expect_values(neg(x).data(), {3}, {-1, -2, -4});
  expect_values(scale(x, 0.5).data(), {3}, {0.5, 1, 2});
  expect_values(log(x).data(), {3}, {0.0, std::log(2.0), 2 * std::log(2.0)});
  expect_values(exp(log(x)).data(), {3}, {1, 2, 4});
  sum(log(x)).backward();  // d log x = 1 / x
  expect_values(x.grad(), {3}, {1.0, 0.5, 0.25});
  x.zero_grad();
  sum(exp(scale(x, 0.0))).backward();  // exp(0 x) = 1, d/dx = 0 * 1
  expect_values(x.grad(), {3}, {0, 0, 0});
}

TEST(UnaryOps, Float32) {
  const Tensor x = make({2, 3}, Layout::transposed, 9, true);
  for (Un op : {Un::scale, Un::neg, Un::exp, Un::log}) {
    const Tensor f = apply(op, Variable(x.to(DType::float32))).data();
    EXPECT_EQ(f.dtype(), DType::float32);
    expect_values(f, x.shape(), apply(op, Variable(x)).data().to_vector(), 1e-6);
  }
}

TEST(UnaryOps, BoolInputIsRejected) {
  const Variable m(Tensor::zeros({2}, DType::boolean));
  expect_invalid([&] { exp(m); }, {"exp", "bool"});
  expect_invalid([&] { scale(m, 2.0); }, {"scale", "bool"});
}

}  // namespace

}  // namespace test_ops_elementwise
