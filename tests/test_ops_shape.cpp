// Shape ops: view, reshape (view and copy paths), transpose, permute,
// contiguous, narrow, cat, stack, expand, repeat_interleave. For each: forward
// against an index loop written plainly, gradcheck in float64 on contiguous,
// transposed and narrowed inputs, and gradcheck with fan-out.
//
// Shape legend: x is [2, 3, 4] unless a case says otherwise; references work on
// row-major std::vector<double> with explicit (un)ravelled indices.
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

namespace test_ops_shape {  // this file's names: test files share unity builds (tests/meson.build)

namespace {

using namespace headgrad;
using namespace headgrad::test;

// ---------------------------------------------------------------- helpers

std::size_t ravel(const Shape& idx, const Shape& shape) {
  std::int64_t off = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) off = off * shape[d] + idx[d];
  return static_cast<std::size_t>(off);
}
std::int64_t norm(std::int64_t d, std::size_t rank) { return d < 0 ? d + static_cast<std::int64_t>(rank) : d; }

// ---------------------------------------------------------------- references

using Values = std::vector<double>;

// out[i0, .., in] = x[j] where j[perm[i]] = i-th out index
Values permute_ref(const Values& x, const Shape& s, const Shape& perm, const Shape& out) {
  Values y;
  for (std::int64_t f = 0; f < shape_numel(out); ++f) {
    const Shape o = unravel_index(f, out);
    Shape i(s.size());
    for (std::size_t k = 0; k < perm.size(); ++k) i[static_cast<std::size_t>(norm(perm[k], s.size()))] = o[k];
    y.push_back(x[ravel(i, s)]);
  }
  return y;
}

Values narrow_ref(const Values& x, const Shape& s, std::int64_t dim, std::int64_t start, const Shape& out) {
  Values y;
  const auto d = static_cast<std::size_t>(norm(dim, s.size()));
  for (std::int64_t f = 0; f < shape_numel(out); ++f) {
    Shape i = unravel_index(f, out);
    i[d] += start;
    y.push_back(x[ravel(i, s)]);
  }
  return y;
}

Values cat_ref(const std::vector<Values>& xs, const std::vector<Shape>& ss, std::int64_t dim, const Shape& out) {
  Values y;
  const auto d = static_cast<std::size_t>(norm(dim, out.size()));
  for (std::int64_t f = 0; f < shape_numel(out); ++f) {
    Shape i = unravel_index(f, out);
    std::size_t t = 0;
    while (i[d] >= ss[t][d]) i[d] -= ss[t++][d];  // which input, and where in it
    y.push_back(xs[t][ravel(i, ss[t])]);
  }
  return y;
}

Values stack_ref(const std::vector<Values>& xs, const Shape& s, std::int64_t dim, const Shape& out) {
  Values y;
  const auto d = static_cast<std::size_t>(norm(dim, out.size()));
  for (std::int64_t f = 0; f < shape_numel(out); ++f) {
    Shape i = unravel_index(f, out);
    const auto t = static_cast<std::size_t>(i[d]);
    i.erase(i.begin() + static_cast<std::ptrdiff_t>(d));
    y.push_back(xs[t][ravel(i, s)]);
  }
  return y;
}

Values expand_ref(const Values& x, const Shape& s, const Shape& out) {
  Values y;
  for (std::int64_t f = 0; f < shape_numel(out); ++f) {
    const Shape o = unravel_index(f, out);
    Shape i(s.size());
    for (std::size_t k = 0; k < s.size(); ++k) {
      const std::size_t od = out.size() - s.size() + k;
      i[k] = s[k] == 1 ? 0 : o[od];
    }
    y.push_back(x[ravel(i, s)]);
  }
  return y;
}

Values repeat_ref(const Values& x, const Shape& s, std::int64_t repeats, std::int64_t dim, const Shape& out) {
  Values y;
  const auto d = static_cast<std::size_t>(norm(dim, s.size()));
  for (std::int64_t f = 0; f < shape_numel(out); ++f) {
    Shape i = unravel_index(f, out);
    i[d] /= repeats;  // [a, b] -> [a, a, b, b]
    y.push_back(x[ravel(i, s)]);
  }
  return y;
}

// ---------------------------------------------------------------- the sweep

using OpFn = std::function<Variable(const std::vector<Variable>&)>;
using RefFn = std::function<Values(const std::vector<Values>&)>;

struct ShapeCase {
  std::string name;
  std::vector<Shape> inputs;
  Shape out;
  OpFn op;
  RefFn ref;
};
void PrintTo(const ShapeCase& c, std::ostream* os) { *os << c.name; }

ShapeCase unary(std::string name, Shape in, Shape out, std::function<Variable(const Variable&)> op,
                std::function<Values(const Values&)> ref) {
  return {std::move(name), {std::move(in)}, std::move(out),
          [op](const std::vector<Variable>& v) { return op(v[0]); },
          [ref](const std::vector<Values>& v) { return ref(v[0]); }};
}

ShapeCase transpose_case(std::string name, std::int64_t d0, std::int64_t d1, Shape out) {
  Shape perm = {0, 1, 2};
  std::swap(perm[static_cast<std::size_t>(norm(d0, 3))], perm[static_cast<std::size_t>(norm(d1, 3))]);
  return unary(std::move(name), {2, 3, 4}, out, [=](const Variable& x) { return transpose(x, d0, d1); },
               [=](const Values& x) { return permute_ref(x, {2, 3, 4}, perm, out); });
}

ShapeCase permute_case(std::string name, Shape perm, Shape out) {
  return unary(std::move(name), {2, 3, 4}, out, [=](const Variable& x) { return permute(x, perm); },
               [=](const Values& x) { return permute_ref(x, {2, 3, 4}, perm, out); });
}

ShapeCase narrow_case(std::string name, std::int64_t dim, std::int64_t start, std::int64_t len, Shape out) {
  return unary(std::move(name), {2, 3, 4}, out, [=](const Variable& x) { return narrow(x, dim, start, len); },
               [=](const Values& x) { return narrow_ref(x, {2, 3, 4}, dim, start, out); });
}

ShapeCase cat_case(std::string name, std::vector<Shape> ins, std::int64_t dim, Shape out) {
  return {std::move(name), ins, out, [=](const std::vector<Variable>& v) { return cat(v, dim); },
          [=](const std::vector<Values>& v) { return cat_ref(v, ins, dim, out); }};
}

ShapeCase stack_case(std::string name, std::size_t n, std::int64_t dim, Shape out) {
  const Shape s = {2, 3, 2};
  return {std::move(name), std::vector<Shape>(n, s), out,
          [=](const std::vector<Variable>& v) { return stack(v, dim); },
          [=](const std::vector<Values>& v) { return stack_ref(v, s, dim, out); }};
}

ShapeCase expand_case(std::string name, Shape in, Shape out) {
  return unary(std::move(name), in, out, [=](const Variable& x) { return expand(x, out); },
               [=](const Values& x) { return expand_ref(x, in, out); });
}

ShapeCase repeat_case(std::string name, std::int64_t repeats, std::int64_t dim, Shape out) {
  return unary(std::move(name), {2, 3, 4}, out,
               [=](const Variable& x) { return repeat_interleave(x, repeats, dim); },
               [=](const Values& x) { return repeat_ref(x, {2, 3, 4}, repeats, dim, out); });
}

Values same(const Values& x) { return x; }

std::vector<ShapeCase> shape_cases() {
  return {
      // view: splitting dims is legal whatever the layouts below make of the strides
      unary("view_split_last", {2, 3, 4}, {2, 3, 2, 2}, [](const Variable& x) { return view(x, {2, 3, 2, 2}); }, same),
      unary("view_infer", {2, 3, 4}, {2, 3, 1, 4}, [](const Variable& x) { return view(x, {2, 3, -1, 4}); }, same),
      // reshape: a view when contiguous, a copy for the transposed and narrowed layouts
      unary("reshape_4x6", {2, 3, 4}, {4, 6}, [](const Variable& x) { return reshape(x, {4, 6}); }, same),
      unary("reshape_flat", {2, 3, 4}, {24}, [](const Variable& x) { return reshape(x, {-1}); }, same),
      unary("contiguous", {2, 3, 4}, {2, 3, 4}, [](const Variable& x) { return contiguous(x); }, same),
      transpose_case("transpose_0_1", 0, 1, {3, 2, 4}),
      transpose_case("transpose_1_2", 1, 2, {2, 4, 3}),
      transpose_case("transpose_m1_m3", -1, -3, {4, 3, 2}),
      permute_case("permute_2_0_1", {2, 0, 1}, {4, 2, 3}),
      permute_case("permute_1_2_0", {1, 2, 0}, {3, 4, 2}),
      permute_case("permute_m1_1_0", {-1, 1, 0}, {4, 3, 2}),
      narrow_case("narrow_d0", 0, 1, 1, {1, 3, 4}),
      narrow_case("narrow_d1", 1, 1, 2, {2, 2, 4}),
      narrow_case("narrow_dm1", -1, 0, 3, {2, 3, 3}),
      cat_case("cat_d0", {{2, 3, 4}, {1, 3, 4}}, 0, {3, 3, 4}),
      cat_case("cat_d1_three", {{2, 3, 4}, {2, 1, 4}, {2, 2, 4}}, 1, {2, 6, 4}),
      cat_case("cat_dm1", {{2, 3, 4}, {2, 3, 2}}, -1, {2, 3, 6}),
      stack_case("stack_d0", 2, 0, {2, 2, 3, 2}),
      stack_case("stack_d1_three", 3, 1, {2, 3, 3, 2}),
      stack_case("stack_d3_last", 2, 3, {2, 3, 2, 2}),
      stack_case("stack_dm1", 2, -1, {2, 3, 2, 2}),
      expand_case("expand_3x1_to_2x3x4", {3, 1}, {2, 3, 4}),
      expand_case("expand_4_to_3x4", {4}, {3, 4}),
      expand_case("expand_1x3x1_to_2x3x4", {1, 3, 1}, {2, 3, 4}),
      expand_case("expand_same", {2, 3}, {2, 3}),
      repeat_case("repeat_interleave_d0_x2", 2, 0, {4, 3, 4}),
      repeat_case("repeat_interleave_d1_x3", 3, 1, {2, 9, 4}),
      repeat_case("repeat_interleave_dm1_x2", 2, -1, {2, 3, 8}),
      repeat_case("repeat_interleave_d1_x1", 1, 1, {2, 3, 4}),
  };
}

using ShapeParam = std::tuple<ShapeCase, Layout>;
class ShapeOpTest : public ::testing::TestWithParam<ShapeParam> {
 protected:
  const ShapeCase& scase() const { return std::get<0>(GetParam()); }
  std::vector<Tensor> inputs() const {
    std::vector<Tensor> in;
    std::uint64_t seed = 1;
    for (const auto& s : scase().inputs) in.push_back(make(s, std::get<1>(GetParam()), seed++));
    return in;
  }
};

TEST_P(ShapeOpTest, ForwardMatchesIndexLoop) {
  const auto in = inputs();
  std::vector<Variable> vars;
  std::vector<Values> vals;
  for (const auto& t : in) {
    vars.emplace_back(t);
    vals.push_back(t.to_vector());
  }
  const Variable out = scase().op(vars);
  expect_exact_values(out.data(), scase().out, scase().ref(vals));
}

TEST_P(ShapeOpTest, Gradcheck) { expect_gradcheck(scase().op, inputs()); }

TEST_P(ShapeOpTest, GradcheckFanOut) {
  // f(x..) = op(x..) * op(exp(x)..): every input feeds op and exp.
  const OpFn op = scase().op;
  expect_gradcheck(
      [op](const std::vector<Variable>& v) {
        std::vector<Variable> e;
        for (const auto& x : v) e.push_back(exp(x));
        return mul(op(v), op(e));
      },
      inputs());
}

TEST_P(ShapeOpTest, GradientRoutesEachElementBack) {
  // loss = sum(op(x) * w) with w[i] = i: each input element's gradient is the
  // sum of the weights of the output elements it went to, found by tagging
  // every input element with a distinct value and pushing the tags through.
  const auto in = inputs();
  std::vector<Variable> vars;
  std::vector<Values> tags;
  double tag = 0.0;
  for (const auto& t : in) {
    vars.emplace_back(t, true);
    Values v(static_cast<std::size_t>(t.numel()));
    for (double& x : v) x = tag++;
    tags.push_back(v);
  }
  const Values routed = scase().ref(tags);  // output slot -> input tag
  Values w(routed.size());
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<double>(i) + 1.0;
  sum(mul(scase().op(vars), Variable(Tensor::from_values(w, scase().out, DType::float64)))).backward();
  Values want(static_cast<std::size_t>(tag), 0.0);
  for (std::size_t i = 0; i < routed.size(); ++i) want[static_cast<std::size_t>(routed[i])] += w[i];
  std::size_t at = 0;
  for (const auto& v : vars) {
    const Values sub(want.begin() + static_cast<std::ptrdiff_t>(at),
                     want.begin() + static_cast<std::ptrdiff_t>(at + static_cast<std::size_t>(v.numel())));
    expect_exact_values(v.grad(), v.shape(), sub);
    at += static_cast<std::size_t>(v.numel());
  }
}

// e.g. "cat_d1_three_narrowed"
std::string shape_param_name(const ::testing::TestParamInfo<ShapeParam>& info) {
  return std::get<0>(info.param).name + "_" + layout_name(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    Sweep, ShapeOpTest,
    ::testing::Combine(::testing::ValuesIn(shape_cases()),
                       ::testing::Values(Layout::contiguous, Layout::transposed, Layout::narrowed)),
    shape_param_name);

// ---------------------------------------------------------------- views and copies

TEST(ShapeOps, ViewAndReshapeShareStorageOnlyWhenTheyCan) {
  Generator gen(5);
  const Variable x(randn({2, 3, 4}, DType::float64, gen));
  EXPECT_TRUE(view(x, {6, 4}).data().shares_storage(x.data()));
  EXPECT_TRUE(reshape(x, {6, 4}).data().shares_storage(x.data()));
  EXPECT_TRUE(transpose(x, 0, 2).data().shares_storage(x.data()));
  EXPECT_TRUE(permute(x, {1, 2, 0}).data().shares_storage(x.data()));
  EXPECT_TRUE(narrow(x, 2, 1, 2).data().shares_storage(x.data()));
  EXPECT_TRUE(expand(narrow(x, 0, 0, 1), {5, 3, 4}).data().shares_storage(x.data()));
  EXPECT_TRUE(contiguous(x).data().shares_storage(x.data()));

  const Variable xt = transpose(x, 1, 2);  // [2, 4, 3]
  const Variable r = reshape(xt, {2, 12});
  EXPECT_FALSE(r.data().shares_storage(x.data()));
  EXPECT_EQ(r.data().to_vector(), xt.data().to_vector());
  EXPECT_FALSE(contiguous(xt).data().shares_storage(x.data()));
  EXPECT_TRUE(contiguous(xt).data().is_contiguous());
  EXPECT_EQ(r.op_name(), "reshape");
}

TEST(ShapeOps, ViewOfViewableNonContiguousGradchecks) {
  // [2, 3, 4] narrowed from [2, 3, 7]: dims 0 and 1 still merge, so view works.
  const Tensor n = make({2, 3, 4}, Layout::narrowed, 6);
  ASSERT_FALSE(n.is_contiguous());
  const Variable v = view(Variable(n), {6, 4});
  EXPECT_TRUE(v.data().shares_storage(n));
  expect_exact_values(v.data(), {6, 4}, n.to_vector());
  expect_gradcheck([](const std::vector<Variable>& in) { return view(in[0], {6, 4}); }, {n});
  expect_gradcheck([](const std::vector<Variable>& in) { return mul(view(in[0], {6, 4}), view(exp(in[0]), {6, 4})); },
                   {n});
}

TEST(ShapeOps, ViewThatStridesForbidThrowsAndReshapeCopies) {
  const Tensor t = make({2, 3, 4}, Layout::transposed, 7);  // [2, 3, 4] with strides [12, 1, 3]
  expect_invalid([&] { view(Variable(t), {6, 4}); }, {"view", "cannot be viewed", "reshape", "contiguous"});
  expect_gradcheck([](const std::vector<Variable>& in) { return reshape(in[0], {6, 4}); }, {t});
}

TEST(ShapeOps, HandWorkedValues) {
  // x = [[1, 2, 3], [4, 5, 6]]
  const Variable x(Tensor::from_values(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, DType::float64));
  expect_exact_values(transpose(x, 0, 1).data(), {3, 2}, {1, 4, 2, 5, 3, 6});
  expect_exact_values(narrow(x, 1, 1, 2).data(), {2, 2}, {2, 3, 5, 6});
  expect_exact_values(cat({x, x}, 0).data(), {4, 3}, {1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6});
  expect_exact_values(cat({x, x}, 1).data(), {2, 6}, {1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6});
  expect_exact_values(stack({x, x}, 0).data(), {2, 2, 3}, {1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6});
  expect_exact_values(stack({x, x}, 2).data(), {2, 3, 2}, {1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6});
  expect_exact_values(repeat_interleave(x, 2, 0).data(), {4, 3}, {1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6});
  expect_exact_values(repeat_interleave(x, 2, 1).data(), {2, 6}, {1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6});
  expect_exact_values(expand(narrow(x, 0, 1, 1), {2, 3}).data(), {2, 3}, {4, 5, 6, 4, 5, 6});
  expect_exact_values(reshape(transpose(x, 0, 1), {2, 3}).data(), {2, 3}, {1, 4, 2, 5, 3, 6});
}

TEST(ShapeOps, RepeatInterleaveWidensKvHeads) {
  // [B, Hkv, T, d] = [1, 2, 1, 1] with heads (10, 20) -> 4 query heads (10, 10, 20, 20),
  // and each KV head's gradient sums over the query heads it serves.
  Variable kv(Tensor::from_values(std::vector<double>{10, 20}, {1, 2, 1, 1}, DType::float64), true);
  const Variable wide = repeat_interleave(kv, 2, 1);
  expect_exact_values(wide.data(), {1, 4, 1, 1}, {10, 10, 20, 20});
  const Variable w(Tensor::from_values(std::vector<double>{1, 2, 3, 4}, {1, 4, 1, 1}, DType::float64));
  sum(mul(wide, w)).backward();
  expect_exact_values(kv.grad(), {1, 2, 1, 1}, {3, 7});
}

TEST(ShapeOps, Errors) {
  const Variable x(Tensor::zeros({2, 3, 4}, DType::float64));
  expect_invalid([&] { view(x, {5, 5}); }, {"view", "[5, 5]", "[2, 3, 4]"});
  expect_invalid([&] { reshape(x, {5, -1}); }, {"reshape", "[5, -1]", "[2, 3, 4]"});
  expect_invalid([&] { cat({x, Variable(Tensor::zeros({2, 4, 4}, DType::float64))}, 0); },
                 {"cat", "[2, 3, 4]", "[2, 4, 4]"});
  expect_invalid([&] { cat({x, Variable(Tensor::zeros({2, 3}, DType::float64))}, 1); },
                 {"cat", "[2, 3, 4]", "[2, 3]"});
  expect_invalid([&] { cat({x, Variable(Tensor::zeros({2, 3, 4}, DType::float32))}, 0); },
                 {"cat", "float32", "float64"});
  expect_invalid([&] { cat({}, 0); }, {"cat"});
  expect_invalid([&] { cat({x}, 3); }, {"cat", "3", "[2, 3, 4]"});
  expect_invalid([&] { stack({x, Variable(Tensor::zeros({2, 3, 5}, DType::float64))}, 0); },
                 {"stack", "[2, 3, 4]", "[2, 3, 5]"});
  expect_invalid([&] { stack({x}, 4); }, {"stack", "4"});
  expect_invalid([&] { expand(x, {2, 5, 4}); }, {"expand", "[2, 3, 4]", "[2, 5, 4]"});
  expect_invalid([&] { narrow(x, 1, 2, 2); }, {"narrow", "[2, 3, 4]"});
  expect_invalid([&] { transpose(x, 0, 3); }, {"transpose", "3"});
  expect_invalid([&] { permute(x, {0, 0, 1}); }, {"permute"});
  expect_invalid([&] { repeat_interleave(x, 0, 1); }, {"repeat_interleave", "0"});
  expect_invalid([&] { repeat_interleave(x, 2, -4); }, {"repeat_interleave", "-4", "[2, 3, 4]"});
}

}  // namespace

}  // namespace test_ops_shape
