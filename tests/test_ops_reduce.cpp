// Reductions: sum and mean, over everything and over one dim (keepdim both).
// For each: forward against plain loops, gradcheck in float64 on contiguous,
// transposed and narrowed inputs, and gradcheck with fan-out.
//
// Shape legend: x is [2, 3, 4] unless a case says otherwise.
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

namespace test_ops_reduce {  // this file's names: test files share unity builds (tests/meson.build)

namespace {

using namespace headgrad;
using namespace headgrad::test;

// ---------------------------------------------------------------- over one dim

enum class Red { sum, mean };
const char* red_name(Red op) { return op == Red::sum ? "sum" : "mean"; }
Variable apply(Red op, const Variable& x, std::int64_t dim, bool keepdim) {
  return op == Red::sum ? sum(x, dim, keepdim) : mean(x, dim, keepdim);
}
Variable apply(Red op, const Variable& x) { return op == Red::sum ? sum(x) : mean(x); }

// Reference for x [2, 3, 4]: loops over i, j, k, accumulating into the slot
// whose index drops (or zeroes) the reduced dim.
std::vector<double> reduce_ref(Red op, const std::vector<double>& x, std::int64_t dim) {
  const std::int64_t n[3] = {2, 3, 4};
  const std::int64_t d = dim < 0 ? dim + 3 : dim;
  std::int64_t m[3] = {2, 3, 4};
  m[d] = 1;
  std::vector<double> out(static_cast<std::size_t>(m[0] * m[1] * m[2]), 0.0);
  for (std::int64_t i = 0; i < 2; ++i)
    for (std::int64_t j = 0; j < 3; ++j)
      for (std::int64_t k = 0; k < 4; ++k) {
        const std::int64_t o[3] = {d == 0 ? 0 : i, d == 1 ? 0 : j, d == 2 ? 0 : k};
        out[static_cast<std::size_t>((o[0] * m[1] + o[1]) * m[2] + o[2])] +=
            x[static_cast<std::size_t>((i * 3 + j) * 4 + k)];
      }
  if (op == Red::mean)
    for (double& v : out) v /= static_cast<double>(n[d]);
  return out;
}

Shape reduced_shape(std::int64_t dim, bool keepdim) {
  Shape s = {2, 3, 4};
  const std::int64_t d = dim < 0 ? dim + 3 : dim;
  if (keepdim) {
    s[static_cast<std::size_t>(d)] = 1;
  } else {
    s.erase(s.begin() + d);
  }
  return s;
}

using DimParam = std::tuple<Red, std::int64_t, bool, Layout>;
class ReduceDimTest : public ::testing::TestWithParam<DimParam> {
 protected:
  Red op() const { return std::get<0>(GetParam()); }
  std::int64_t dim() const { return std::get<1>(GetParam()); }
  bool keepdim() const { return std::get<2>(GetParam()); }
  Tensor input(std::uint64_t seed = 1) const { return make({2, 3, 4}, std::get<3>(GetParam()), seed); }
};

TEST_P(ReduceDimTest, ForwardMatchesLoop) {
  const Tensor x = input();
  const Variable out = apply(op(), Variable(x), dim(), keepdim());
  expect_values(out.data(), reduced_shape(dim(), keepdim()), reduce_ref(op(), x.to_vector(), dim()));
}

TEST_P(ReduceDimTest, Gradcheck) {
  const Red o = op();
  const std::int64_t d = dim();
  const bool k = keepdim();
  expect_gradcheck([=](const std::vector<Variable>& v) { return apply(o, v[0], d, k); }, {input()});
}

TEST_P(ReduceDimTest, GradcheckFanOut) {
  // f(x) = op(x) * op(exp(x)): x feeds the reduction and exp.
  const Red o = op();
  const std::int64_t d = dim();
  const bool k = keepdim();
  expect_gradcheck(
      [=](const std::vector<Variable>& v) { return mul(apply(o, v[0], d, k), apply(o, exp(v[0]), d, k)); },
      {input()});
}

TEST_P(ReduceDimTest, GradcheckBroadcastBack) {
  // f(x) = x - op(x, keepdim) style centering (as in layernorm), which needs
  // the reduced value to broadcast back over x.
  const Red o = op();
  const std::int64_t d = dim();
  expect_gradcheck([=](const std::vector<Variable>& v) {
    const Variable c = sub(v[0], apply(o, v[0], d, true));
    return mul(c, c);
  }, {input()});
}

// e.g. "mean_dimm1_keep_transposed"
std::string dim_param_name(const ::testing::TestParamInfo<DimParam>& info) {
  const auto& [op, dim, keepdim, layout] = info.param;
  std::string name = red_name(op);
  name += dim < 0 ? "_dimm" : "_dim";
  name += std::to_string(dim < 0 ? -dim : dim);
  name += keepdim ? "_keep_" : "_drop_";
  name += layout_name(layout);
  return name;
}

INSTANTIATE_TEST_SUITE_P(
    Sweep, ReduceDimTest,
    ::testing::Combine(::testing::Values(Red::sum, Red::mean),
                       ::testing::Values<std::int64_t>(0, 1, 2, -1, -3),
                       ::testing::Bool(),
                       ::testing::Values(Layout::contiguous, Layout::transposed, Layout::narrowed)),
    dim_param_name);

// ---------------------------------------------------------------- over everything

using AllParam = std::tuple<Red, Shape, Layout>;
class ReduceAllTest : public ::testing::TestWithParam<AllParam> {
 protected:
  Red op() const { return std::get<0>(GetParam()); }
  Tensor input(std::uint64_t seed = 1) const {
    return make(std::get<1>(GetParam()), std::get<2>(GetParam()), seed);
  }
};

TEST_P(ReduceAllTest, ForwardMatchesLoop) {
  const Tensor x = input();
  double s = 0.0;
  for (double v : x.to_vector()) s += v;
  if (op() == Red::mean) s /= static_cast<double>(x.numel());
  expect_values(apply(op(), Variable(x)).data(), {}, {s});
}

TEST_P(ReduceAllTest, Gradcheck) {
  const Red o = op();
  expect_gradcheck([o](const std::vector<Variable>& v) { return apply(o, v[0]); }, {input()});
}

TEST_P(ReduceAllTest, GradcheckFanOut) {
  // f(x) = x * op(x): x feeds both, and the scalar broadcasts back.
  const Red o = op();
  expect_gradcheck([o](const std::vector<Variable>& v) { return mul(v[0], apply(o, v[0])); }, {input()});
}

// e.g. "sum_2x3x4_narrowed"
std::string all_param_name(const ::testing::TestParamInfo<AllParam>& info) {
  const auto& [op, shape, layout] = info.param;
  return std::string(red_name(op)) + "_" + shape_name(shape) + "_" + layout_name(layout);
}

INSTANTIATE_TEST_SUITE_P(
    Sweep, ReduceAllTest,
    ::testing::Combine(::testing::Values(Red::sum, Red::mean),
                       ::testing::Values(Shape{2, 3, 4}, Shape{7}, Shape{}),
                       ::testing::Values(Layout::contiguous, Layout::transposed, Layout::narrowed)),
    all_param_name);

// ---------------------------------------------------------------- by hand

TEST(Reduce, HandWorkedValues) {
  // x = [[1, 2, 3], [4, 5, 6]]
  const Variable x(Tensor::from_values(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, DType::float64));
  expect_values(sum(x).data(), {}, {21});
  expect_values(mean(x).data(), {}, {3.5});
  expect_values(sum(x, 0).data(), {3}, {5, 7, 9});
  expect_values(sum(x, 1, true).data(), {2, 1}, {6, 15});
  expect_values(mean(x, -1).data(), {2}, {2, 5});
  expect_values(mean(x, 0, true).data(), {1, 3}, {2.5, 3.5, 4.5});
  // A size-1 dim reduces to a copy, not an alias.
  const Variable col(Tensor::from_values(std::vector<double>{1, 2}, {2, 1}, DType::float64));
  const Variable s = sum(col, 1);
  expect_values(s.data(), {2}, {1, 2});
  EXPECT_FALSE(s.data().shares_storage(col.data()));
}

TEST(Reduce, HandWorkedGradients) {
  Variable x(Tensor::from_values(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, DType::float64), true);
  // loss = sum_j w_j * mean_i x[i][j] with w = [1, 2, 3]: dx[i][j] = w_j / 2.
  const Variable w(Tensor::from_values(std::vector<double>{1, 2, 3}, {3}, DType::float64));
  sum(mul(mean(x, 0), w)).backward();
  expect_values(x.grad(), {2, 3}, {0.5, 1, 1.5, 0.5, 1, 1.5});
  x.zero_grad();
  mean(x).backward();  // 1 / 6 everywhere
  expect_values(x.grad(), {2, 3}, std::vector<double>(6, 1.0 / 6.0));
}

TEST(Reduce, Float32SumsAccurately) {
  // 100000 values of 0.1f: a float32 running sum drifts by ~1e-3 relative; core
  // accumulates in double.
  const Tensor x = Tensor::full({100000}, 0.1, DType::float32);
  const double got = sum(Variable(x)).data().item();
  EXPECT_NEAR(got, 100000.0 * static_cast<double>(0.1f), 1e-2);
  EXPECT_EQ(sum(Variable(x)).data().dtype(), DType::float32);
}

TEST(Reduce, DimOutOfRangeThrows) {
  const Variable x(Tensor::zeros({2, 3}, DType::float64));
  expect_invalid([&] { sum(x, 2); }, {"sum", "2", "[2, 3]"});
  expect_invalid([&] { sum(x, -3); }, {"sum", "-3", "[2, 3]"});
  expect_invalid([&] { mean(x, 5, true); }, {"mean", "5", "[2, 3]"});
}

}  // namespace

}  // namespace test_ops_reduce
