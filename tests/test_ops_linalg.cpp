// Matrix products: matmul (batched, broadcasting, transposed operands) and
// linear (PyTorch's layout, y = x W^T). For each: forward against a triple
// loop, gradcheck in float64 on contiguous, transposed and narrowed operands,
// and gradcheck with fan-out.
//
// Shape legend: a [..., M, K] @ b [..., K, N] -> [..., M, N]; x [..., in],
// w [out, in] -> [..., out].
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

namespace test_ops_linalg {  // this file's names: test files share unity builds (tests/meson.build)

namespace {

using namespace headgrad;
using namespace headgrad::test;

// ---------------------------------------------------------------- reference

// Row-major flat index of `idx` in `shape`, where idx is right-aligned to the
// shape and size-1 dims read index 0 (broadcasting).
std::int64_t broadcast_flat(const Shape& idx, const Shape& shape) {
  std::int64_t off = 0, stride = 1;
  for (std::size_t k = 0; k < shape.size(); ++k) {
    const std::size_t d = shape.size() - 1 - k;
    const std::int64_t i = shape[d] == 1 ? 0 : idx[idx.size() - 1 - k];
    off += i * stride;
    stride *= shape[d];
  }
  return off;
}

struct Ref {
  Shape shape;
  std::vector<double> values;
};

// out[batch][m][n] = sum_k a[batch'][m][k] * b[batch''][k][n], batch dims broadcast.
Ref matmul_ref(const std::vector<double>& a, const Shape& as, const std::vector<double>& b,
               const Shape& bs) {
  const std::int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
  const Shape ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  Shape batch(std::max(ab.size(), bb.size()), 1);
  for (std::size_t k = 0; k < batch.size(); ++k) {
    const std::int64_t da = k < ab.size() ? ab[ab.size() - 1 - k] : 1;
    const std::int64_t db = k < bb.size() ? bb[bb.size() - 1 - k] : 1;
    batch[batch.size() - 1 - k] = std::max(da, db);
  }
  const std::int64_t nb = shape_numel(batch);
  Ref r;
  r.shape = batch;
  r.shape.push_back(M);
  r.shape.push_back(N);
  r.values.assign(static_cast<std::size_t>(nb * M * N), 0.0);
  for (std::int64_t t = 0; t < nb; ++t) {
    Shape idx(batch.size());
    for (std::int64_t rem = t, d = static_cast<std::int64_t>(batch.size()) - 1; d >= 0; --d) {
      idx[static_cast<std::size_t>(d)] = rem % batch[static_cast<std::size_t>(d)];
      rem /= batch[static_cast<std::size_t>(d)];
    }
    const std::int64_t ta = broadcast_flat(idx, ab), tb = broadcast_flat(idx, bb);
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t n = 0; n < N; ++n) {
        double s = 0.0;
        for (std::int64_t k = 0; k < K; ++k)
          s += a[static_cast<std::size_t>((ta * M + m) * K + k)] *
               b[static_cast<std::size_t>((tb * K + k) * N + n)];
        r.values[static_cast<std::size_t>((t * M + m) * N + n)] = s;
      }
  }
  return r;
}

// ---------------------------------------------------------------- matmul sweep

struct MatmulCase {
  const char* name;
  Shape a, b;
};
void PrintTo(const MatmulCase& c, std::ostream* os) { *os << c.name; }

const MatmulCase kMatmulCases[] = {
    {"3x4_at_4x5", {3, 4}, {4, 5}},
    {"2x3x4_at_4x5", {2, 3, 4}, {4, 5}},           // a's batch folds into rows
    {"2x3x4_at_2x4x5", {2, 3, 4}, {2, 4, 5}},
    {"1x3x4_at_2x4x5", {1, 3, 4}, {2, 4, 5}},      // a broadcasts over batch
    {"3x4_at_2x4x5", {3, 4}, {2, 4, 5}},           // a has no batch
    {"2x1x3x4_at_3x4x2", {2, 1, 3, 4}, {3, 4, 2}}, // both broadcast
    {"1x4_at_4x1", {1, 4}, {4, 1}},                // row times column
    {"2x3x1_at_1x5", {2, 3, 1}, {1, 5}},           // K = 1: an outer product
};

using MatmulParam = std::tuple<MatmulCase, Layout, Layout>;
class MatmulTest : public ::testing::TestWithParam<MatmulParam> {
 protected:
  const MatmulCase& mcase() const { return std::get<0>(GetParam()); }
  std::vector<Tensor> inputs() const {
    return {make(mcase().a, std::get<1>(GetParam()), 1), make(mcase().b, std::get<2>(GetParam()), 2)};
  }
};

TEST_P(MatmulTest, ForwardMatchesLoop) {
  const auto in = inputs();
  const Ref want = matmul_ref(in[0].to_vector(), mcase().a, in[1].to_vector(), mcase().b);
  const Variable out = matmul(Variable(in[0]), Variable(in[1]));
  expect_values(out.data(), want.shape, want.values);
  EXPECT_TRUE(out.data().is_contiguous());
}

TEST_P(MatmulTest, SameAsContiguousCopies) {
  const auto in = inputs();
  const Tensor views = matmul(Variable(in[0]), Variable(in[1])).data();
  const Tensor copies = matmul(Variable(in[0].contiguous()), Variable(in[1].contiguous())).data();
  expect_values(views, copies.shape(), copies.to_vector(), 1e-13);
}

TEST_P(MatmulTest, Gradcheck) {
  expect_gradcheck([](const std::vector<Variable>& v) { return matmul(v[0], v[1]); }, inputs());
}

TEST_P(MatmulTest, GradcheckFanOut) {
  // f(a, b) = matmul(a, b) * mean(a) + mean(b): each operand feeds two ops.
  expect_gradcheck(
      [](const std::vector<Variable>& v) { return add(mul(matmul(v[0], v[1]), mean(v[0])), mean(v[1])); },
      inputs());
}

TEST_P(MatmulTest, Float32MatchesFloat64) {
  const auto in = inputs();
  const Tensor d = matmul(Variable(in[0]), Variable(in[1])).data();
  const Tensor f = matmul(Variable(in[0].to(DType::float32)), Variable(in[1].to(DType::float32))).data();
  EXPECT_EQ(f.dtype(), DType::float32);
  expect_values(f, d.shape(), d.to_vector(), 1e-5);
}

// e.g. "2x3x4_at_4x5_a_transposed_b_narrowed"
std::string matmul_param_name(const ::testing::TestParamInfo<MatmulParam>& info) {
  const auto& [c, la, lb] = info.param;
  return std::string(c.name) + "_a_" + layout_name(la) + "_b_" + layout_name(lb);
}

INSTANTIATE_TEST_SUITE_P(
    Sweep, MatmulTest,
    ::testing::Combine(::testing::ValuesIn(kMatmulCases),
                       ::testing::Values(Layout::contiguous, Layout::transposed, Layout::narrowed),
                       ::testing::Values(Layout::contiguous, Layout::transposed, Layout::narrowed)),
    matmul_param_name);

TEST(Matmul, HandWorkedValues) {
  // [[1, 2], [3, 4]] @ [[5, 6], [7, 8]] = [[19, 22], [43, 50]]
  const Variable a(Tensor::from_values(std::vector<double>{1, 2, 3, 4}, {2, 2}, DType::float64));
  const Variable b(Tensor::from_values(std::vector<double>{5, 6, 7, 8}, {2, 2}, DType::float64));
  expect_values(matmul(a, b).data(), {2, 2}, {19, 22, 43, 50});
  // a^T @ b = [[1, 3], [2, 4]] @ b = [[26, 30], [38, 44]], through the transposed view.
  expect_values(matmul(transpose(a, 0, 1), b).data(), {2, 2}, {26, 30, 38, 44});
  // a @ b^T = [[17, 23], [39, 53]]
  expect_values(matmul(a, transpose(b, 0, 1)).data(), {2, 2}, {17, 23, 39, 53});
}

TEST(Matmul, HandWorkedGradients) {
  // loss = sum(a @ b): da[m][k] = sum_n b[k][n], db[k][n] = sum_m a[m][k].
  Variable a(Tensor::from_values(std::vector<double>{1, 2, 3, 4}, {2, 2}, DType::float64), true);
  Variable b(Tensor::from_values(std::vector<double>{5, 6, 7, 8}, {2, 2}, DType::float64), true);
  sum(matmul(a, b)).backward();
  expect_values(a.grad(), {2, 2}, {11, 15, 11, 15});
  expect_values(b.grad(), {2, 2}, {4, 4, 6, 6});
  // a [1, 2, 2] broadcast over b's batch of 3 copies of b: da sums 3 times.
  Variable a3(Tensor::from_values(std::vector<double>{1, 2, 3, 4}, {1, 2, 2}, DType::float64), true);
  Variable b3(Tensor::from_values(std::vector<double>{5, 6, 7, 8}, {1, 2, 2}, DType::float64).expand({3, 2, 2}).contiguous(),
              true);
  sum(matmul(a3, b3)).backward();
  expect_values(a3.grad(), {1, 2, 2}, {33, 45, 33, 45});
  expect_values(b3.grad(), {3, 2, 2}, {4, 4, 6, 6, 4, 4, 6, 6, 4, 4, 6, 6});
}

TEST(Matmul, TransposedViewGivesSameValuesAsItsContiguousCopy) {
  Generator gen(11);
  const Tensor base = randn({3, 6, 5}, DType::float64, gen);
  const Tensor at = base.transpose(-2, -1);  // [3, 5, 6]
  const Tensor b = randn({6, 4}, DType::float64, gen);
  const Tensor bt = randn({4, 6}, DType::float64, gen).transpose(0, 1);  // [6, 4]
  const Tensor v1 = matmul(Variable(at), Variable(b)).data();
  const Tensor c1 = matmul(Variable(at.contiguous()), Variable(b)).data();
  expect_values(v1, {3, 5, 4}, c1.to_vector(), 1e-13);
  const Tensor v2 = matmul(Variable(at), Variable(bt)).data();
  const Tensor c2 = matmul(Variable(at.contiguous()), Variable(bt.contiguous())).data();
  expect_values(v2, {3, 5, 4}, c2.to_vector(), 1e-13);
  // The batch dim transposed away from the front (a permuted [B, T, H, d] -> [B, H, T, d]).
  const Tensor q = randn({2, 3, 2, 4}, DType::float64, gen).transpose(1, 2);  // [2, 2, 3, 4]
  const Tensor k = randn({2, 3, 2, 4}, DType::float64, gen).transpose(1, 2);
  const Tensor s = matmul(Variable(q), transpose(Variable(k), -2, -1)).data();
  const Ref want = matmul_ref(q.to_vector(), q.shape(), k.transpose(-2, -1).to_vector(), {2, 2, 4, 3});
  expect_values(s, want.shape, want.values);
}

TEST(Matmul, Float32LargerKStaysWithinTolerance) {
  Generator gen(12);
  const Tensor a = randn({4, 64}, DType::float64, gen), b = randn({64, 3}, DType::float64, gen);
  const Tensor d = matmul(Variable(a), Variable(b)).data();
  const Tensor f = matmul(Variable(a.to(DType::float32)), Variable(b.to(DType::float32))).data();
  // sqrt(64) * 2^-24 * typical |a||b| ~ 1e-6 relative; 1e-4 absolute leaves room.
  const auto dv = d.to_vector(), fv = f.to_vector();
  double worst = 0.0;
  for (std::size_t i = 0; i < dv.size(); ++i) worst = std::max(worst, std::abs(dv[i] - fv[i]));
  EXPECT_LT(worst, 1e-4);
  EXPECT_GT(worst, 0.0);  // really computed in float32
}

TEST(Matmul, ShapeErrorsNameOpAndShapes) {
  const Variable a(Tensor::zeros({2, 3}, DType::float64));
  const Variable b(Tensor::zeros({4, 5}, DType::float64));
  expect_invalid([&] { matmul(a, b); }, {"matmul", "[2, 3]", "[4, 5]"});
  const Variable a3(Tensor::zeros({2, 3, 4}, DType::float64));
  const Variable b3(Tensor::zeros({3, 4, 5}, DType::float64));
  expect_invalid([&] { matmul(a3, b3); }, {"matmul", "[2, 3, 4]", "[3, 4, 5]"});
  const Variable v(Tensor::zeros({3}, DType::float64));
  expect_invalid([&] { matmul(v, b); }, {"matmul", "[3]", "[4, 5]"});
  expect_invalid([&] { matmul(a, Variable(Tensor::zeros({3, 2}, DType::float32))); },
                 {"matmul", "float64", "float32"});
}

// ---------------------------------------------------------------- linear

// y[r][o] = sum_i x[r][i] w[o][i] over the rows r of x's leading dims.
std::vector<double> linear_ref(const std::vector<double>& x, const std::vector<double>& w,
                               std::int64_t in, std::int64_t out) {
  const std::int64_t rows = static_cast<std::int64_t>(x.size()) / in;
  std::vector<double> y(static_cast<std::size_t>(rows * out), 0.0);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t o = 0; o < out; ++o)
      for (std::int64_t i = 0; i < in; ++i)
        y[static_cast<std::size_t>(r * out + o)] +=
            x[static_cast<std::size_t>(r * in + i)] * w[static_cast<std::size_t>(o * in + i)];
  return y;
}

struct LinearCase {
  const char* name;
  Shape x, w;
};
void PrintTo(const LinearCase& c, std::ostream* os) { *os << c.name; }

const LinearCase kLinearCases[] = {
    {"x2x3x4_w5x4", {2, 3, 4}, {5, 4}},
    {"x3x4_w2x4", {3, 4}, {2, 4}},
    {"x4_w3x4", {4}, {3, 4}},  // a single vector
    {"x2x1x3x4_w4x4", {2, 1, 3, 4}, {4, 4}},
};

using LinearParam = std::tuple<LinearCase, Layout, Layout>;
class LinearTest : public ::testing::TestWithParam<LinearParam> {
 protected:
  const LinearCase& lcase() const { return std::get<0>(GetParam()); }
  std::vector<Tensor> inputs() const {
    return {make(lcase().x, std::get<1>(GetParam()), 3), make(lcase().w, std::get<2>(GetParam()), 4)};
  }
};

TEST_P(LinearTest, ForwardMatchesLoop) {
  const auto in = inputs();
  const std::int64_t n_in = lcase().w[1], n_out = lcase().w[0];
  Shape out_shape = lcase().x;
  out_shape.back() = n_out;
  const Variable y = linear(Variable(in[0]), Variable(in[1]));
  expect_values(y.data(), out_shape, linear_ref(in[0].to_vector(), in[1].to_vector(), n_in, n_out));
}

TEST_P(LinearTest, Gradcheck) {
  expect_gradcheck([](const std::vector<Variable>& v) { return linear(v[0], v[1]); }, inputs());
}

TEST_P(LinearTest, GradcheckFanOut) {
  // f(x, w) = linear(x, w) * sum(w) + exp(x) summed to a scalar per row.
  expect_gradcheck(
      [](const std::vector<Variable>& v) {
        return add(mul(linear(v[0], v[1]), sum(v[1])), sum(exp(v[0]), -1, true));
      },
      inputs());
}

// e.g. "x2x3x4_w5x4_x_narrowed_w_transposed"
std::string linear_param_name(const ::testing::TestParamInfo<LinearParam>& info) {
  const auto& [c, lx, lw] = info.param;
  return std::string(c.name) + "_x_" + layout_name(lx) + "_w_" + layout_name(lw);
}

INSTANTIATE_TEST_SUITE_P(
    Sweep, LinearTest,
    ::testing::Combine(::testing::ValuesIn(kLinearCases),
                       ::testing::Values(Layout::contiguous, Layout::transposed, Layout::narrowed),
                       ::testing::Values(Layout::contiguous, Layout::transposed, Layout::narrowed)),
    linear_param_name);

TEST(Linear, HandWorkedValuesFollowPyTorchLayout) {
  // w is [out, in]: y = x w^T. x = [1, 2], w = [[1, 0], [0, 1], [1, 1]] -> [1, 2, 3].
  const Variable x(Tensor::from_values(std::vector<double>{1, 2}, {1, 2}, DType::float64));
  const Variable w(Tensor::from_values(std::vector<double>{1, 0, 0, 1, 1, 1}, {3, 2}, DType::float64));
  expect_values(linear(x, w).data(), {1, 3}, {1, 2, 3});
  expect_values(linear(view(x, {2}), w).data(), {3}, {1, 2, 3});
}

TEST(Linear, ShapeErrorsNameOpAndShapes) {
  const Variable x(Tensor::zeros({2, 3}, DType::float64));
  expect_invalid([&] { linear(x, Variable(Tensor::zeros({5, 4}, DType::float64))); },
                 {"linear", "[2, 3]", "[5, 4]"});
  expect_invalid([&] { linear(x, Variable(Tensor::zeros({3}, DType::float64))); },
                 {"linear", "[2, 3]", "[3]"});
  expect_invalid([&] { linear(x, Variable(Tensor::zeros({3, 5}, DType::float64))); },  // w not transposed
                 {"linear", "[2, 3]", "[3, 5]"});
}

}  // namespace

}  // namespace test_ops_linalg
