// The graph engine: accumulation, upstream gradients, grad mode, leaves,
// custom ops with hand-written backward, and gradcheck's own ability to fail.
// Every expected gradient is worked out by hand in the comment beside it.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "checks.hpp"
#include "headgrad/checkpoint.hpp"
#include "headgrad/gradcheck.hpp"
#include "headgrad/kernels.hpp"
#include "headgrad/ops.hpp"
#include "headgrad/variable.hpp"

namespace test_autograd {  // this file's names: test files share unity builds (tests/meson.build)

namespace {

using namespace headgrad;

Tensor vec(std::vector<double> v) {
  const auto n = static_cast<std::int64_t>(v.size());
  return Tensor::from_values(v, {n}, DType::float64);
}

Tensor rnd(const Shape& shape, std::uint64_t seed) {
  Generator gen(seed);
  return randn(shape, DType::float64, gen);
}

template <class E>
void expect_throw_with(const std::function<void()>& f, std::initializer_list<std::string> pieces) {
  try {
    f();
    ADD_FAILURE() << "expected an exception";
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const auto& p : pieces) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

void expect_values(const Tensor& t, const std::vector<double>& want, double tol = 1e-12) {
  ASSERT_TRUE(t.defined());
  const std::vector<double> got = t.to_vector();
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

// ---------------------------------------------------------------- accumulation

TEST(Autograd, ValueUsedTwiceAccumulates) {
  // y = x * x + x, so dy/dx = 2x + 1: x enters mul twice and add once.
  Variable x(vec({1.5, -2.0, 0.5}), true);
  Variable y = add(mul(x, x), x);
  expect_values(y.data(), {3.75, 2.0, 0.75});
  sum(y).backward();
  expect_values(x.grad(), {4.0, -3.0, 2.0});
}

TEST(Autograd, DiamondGraph) {
  // a = 2x, b = x^2, y = a * b = 2 x^3, dy/dx = 6 x^2: x reaches y along two paths.
  Variable x(vec({1.0, -3.0}), true);
  Variable y = mul(scale(x, 2.0), mul(x, x));
  sum(y).backward();
  expect_values(x.grad(), {6.0, 54.0});
}

TEST(Autograd, ExplicitUpstreamGradient) {
  // y = x * x with upstream g: dx = 2 x g.
  Variable x(vec({1.0, 2.0, -1.0}), true);
  Variable y = mul(x, x);
  y.backward(vec({1.0, 0.5, 3.0}));
  expect_values(x.grad(), {2.0, 2.0, -6.0});
  // An upstream gradient of another dtype is converted to the output's.
  Variable x2(vec({4.0}), true);
  scale(x2, 3.0).backward(Tensor::full({1}, 2.0, DType::float32));
  expect_values(x2.grad(), {6.0});
}

TEST(Autograd, BackwardErrors) {
  Variable x(vec({1.0, 2.0}), true);
  Variable y = mul(x, x);
  expect_throw_with<std::invalid_argument>([&] { y.backward(); }, {"backward", "[2]", "scalar"});
  expect_throw_with<std::invalid_argument>([&] { y.backward(vec({1.0, 2.0, 3.0})); },
                                           {"backward", "[3]", "[2]"});
  Variable c(vec({1.0}));  // requires no gradient
  EXPECT_THROW(scale(c, 2.0).backward(), std::invalid_argument);
  EXPECT_THROW(Variable().backward(), std::logic_error);
  EXPECT_THROW(Variable(Tensor::zeros({2}, DType::boolean), true), std::invalid_argument);
  EXPECT_THROW((void)Variable(Tensor{}), std::invalid_argument);
}

TEST(Autograd, OneElementNonScalarBackward) {
  // A [1, 1] output counts as a scalar.
  Variable x(vec({3.0}), true);
  Variable y = view(mul(x, x), {1, 1});
  y.backward();
  expect_values(x.grad(), {6.0});
}

// ---------------------------------------------------------------- grad mode

TEST(Autograd, NoGradGuardRecordsNoGraphAndRestores) {
  Variable x(vec({1.0, 2.0}), true);
  ASSERT_TRUE(grad_enabled());
  {
    NoGradGuard guard;
    EXPECT_FALSE(grad_enabled());
    Variable y = mul(x, x);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(y.is_leaf());  // no backward attached
    expect_values(y.data(), {1.0, 4.0});
    EXPECT_THROW(sum(y).backward(), std::invalid_argument);
    {
      NoGradGuard nested;
      EXPECT_FALSE(grad_enabled());
    }
    EXPECT_FALSE(grad_enabled());  // the nested guard restores "off", not "on"
  }
  EXPECT_TRUE(grad_enabled());
  Variable z = mul(x, x);
  EXPECT_TRUE(z.requires_grad());
  EXPECT_FALSE(z.is_leaf());
  EXPECT_EQ(z.op_name(), "mul");
  EXPECT_FALSE(x.grad().defined());  // nothing reached x
}

TEST(Autograd, InputsWithoutGradGetNone) {
  // loss = sum(a * b): da = b, and b (no grad) keeps an undefined gradient.
  Variable a(vec({1.0, 2.0, 3.0}), true);
  Variable b(vec({4.0, 5.0, 6.0}));
  EXPECT_FALSE(b.requires_grad());
  EXPECT_TRUE(b.is_leaf());
  EXPECT_EQ(b.op_name(), "leaf");
  sum(mul(a, b)).backward();
  expect_values(a.grad(), {4.0, 5.0, 6.0});
  EXPECT_FALSE(b.grad().defined());
}

// ---------------------------------------------------------------- leaves

TEST(Autograd, LeavesKeepGradAndAccumulateAcrossBackwards) {
  // With retain_graph the graph survives, and a second pass adds to the leaves.
  Variable x(vec({1.0, -1.0}), true);
  Variable h = scale(x, 3.0);
  Variable loss = sum(mul(h, x));  // 3 x^2, d/dx = 6 x
  loss.backward({.retain_graph = true});
  expect_values(x.grad(), {6.0, -6.0});
  EXPECT_FALSE(h.grad().defined());  // a non-leaf's gradient is not kept
  loss.backward({.retain_graph = true});
  expect_values(x.grad(), {12.0, -12.0});
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
  loss.backward();  // the last pass may free it
  expect_values(x.grad(), {6.0, -6.0});
}

TEST(Autograd, SecondBackwardOnAFreedGraphNamesTheOp) {
  Variable x(vec({1.0, -1.0}), true);
  Variable loss = sum(mul(scale(x, 3.0), x));
  loss.backward();
  expect_values(x.grad(), {6.0, -6.0});
  expect_throw_with<std::logic_error>([&] { loss.backward(); }, {"'sum'", "freed", "retain_graph"});
  expect_values(x.grad(), {6.0, -6.0});  // the refused pass changed nothing
  // A new graph over part of the freed one: the freed node is named.
  Variable x2(vec({2.0}), true);
  Variable h = exp(x2);
  sum(h).backward();
  expect_throw_with<std::logic_error>([&] { sum(scale(h, 2.0)).backward(); }, {"'exp'", "freed"});
  // An upstream gradient with retain_graph, then without: both add, then it is gone.
  Variable y = mul(x2, x2);
  x2.zero_grad();
  y.backward(vec({1.0}), {.retain_graph = true});
  y.backward(vec({0.5}));
  expect_values(x2.grad(), {6.0});  // 2 x (1 + 0.5)
  EXPECT_THROW(y.backward(vec({1.0})), std::logic_error);
}

TEST(Autograd, ThrowingBackwardLeavesGradientsAsTheyWere) {
  // loss = sum(a * b + boom(a)): boom's backward throws, after or before mul's
  // has produced gradients for a and b; neither leaf may see any of them.
  Variable a(vec({1.0, 2.0}), true), b(vec({3.0, 4.0}), true);
  sum(mul(a, b)).backward();
  expect_values(a.grad(), {3.0, 4.0});
  expect_values(b.grad(), {1.0, 2.0});
  const Variable boom = custom_op(
      "boom", {a}, [](CustomOpContext&, const std::vector<Tensor>& in) { return in[0].clone(); },
      [](const CustomOpContext&, const Tensor&) -> std::vector<Tensor> {
        throw std::runtime_error("boom's backward fails");
      });
  Variable loss = sum(add(mul(a, b), boom));
  expect_throw_with<std::runtime_error>([&] { loss.backward({.retain_graph = true}); }, {"boom"});
  expect_values(a.grad(), {3.0, 4.0});
  expect_values(b.grad(), {1.0, 2.0});
  // The same pass through a graph that is freed as it goes: still nothing committed.
  expect_throw_with<std::runtime_error>([&] { loss.backward(); }, {"boom"});
  expect_values(a.grad(), {3.0, 4.0});
  expect_values(b.grad(), {1.0, 2.0});
}

TEST(Autograd, GraphKeepsOnlyWhatBackwardsRead) {
  // exp saves its output, scale saves nothing: scale's output dies with its
  // Variable although exp's node still points at it, and backward frees
  // exp's output as it walks the graph.
  constexpr std::int64_t n = 1 << 14;
  constexpr std::size_t bytes = n * sizeof(double);
  Variable x(rnd({n}, 9), true);
  const std::size_t base = memory_stats().current_bytes;
  Variable loss = sum(exp(scale(x, 0.5)));
  EXPECT_EQ(memory_stats().current_bytes - base, bytes + sizeof(double));  // exp's out, the loss
  loss.backward();
  EXPECT_EQ(memory_stats().current_bytes - base, bytes + sizeof(double));  // x's gradient, the loss
  const std::vector<double> xs = x.data().to_vector(), g = x.grad().to_vector();
  for (std::size_t i = 0; i < xs.size(); i += 997) EXPECT_NEAR(g[i], 0.5 * std::exp(0.5 * xs[i]), 1e-12);
}

TEST(Autograd, GradientOfAViewLeafHasItsShape) {
  // A leaf holding a transposed view gets a gradient of the view's shape.
  Tensor base = Tensor::from_values(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, DType::float64);
  Variable x(base.transpose(0, 1), true);  // [3, 2]
  sum(mul(x, x)).backward();               // 2 x
  EXPECT_EQ(x.grad().shape(), (Shape{3, 2}));
  expect_values(x.grad(), {2, 8, 4, 10, 6, 12});
}

// Slices of one leaf (narrow, whose gradient the engine adds into the slice
// of the pending one), overlapping and beside a use of the whole: the
// gradient is worked out by hand, and the upstream gradient, which the
// engine first holds as is (cat's backward passes views of it), is not
// written by the in-place adds; a second backward adds up again.
TEST(Autograd, SlicedLeafGradientsAddUpWithoutWritingTheUpstream) {
  const Tensor w0 = Tensor::from_values(std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8}, {4, 2}, DType::float64);
  Variable w(w0, true);
  // rows 1..2 and 2..3 of w, then w whole: out [8, 2]
  const Variable out = cat({narrow(w, 0, 1, 2), narrow(w, 0, 2, 2), reshape(w, {4, 2})}, 0);
  const Tensor g = Tensor::from_values(std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 10, 20, 30, 40, 50, 60, 70, 80}, {8, 2},
                                       DType::float64);
  const std::vector<double> g_before = g.to_vector();
  out.backward(g, {.retain_graph = true});
  // row r of dw: the whole's row r (g rows 4..7), plus row r - 1 of the first slice
  // (g rows 0..1) for r = 1, 2, plus row r - 2 of the second (g rows 2..3) for r = 2, 3
  const std::vector<double> want = {10, 20, 30 + 1, 40 + 2, 50 + 3 + 5, 60 + 4 + 6, 70 + 7, 80 + 8};
  EXPECT_EQ(w.grad().to_vector(), want);
  EXPECT_EQ(g.to_vector(), g_before);
  out.backward(g);
  std::vector<double> twice = want;
  for (double& v : twice) v *= 2;
  EXPECT_EQ(w.grad().to_vector(), twice);
  EXPECT_EQ(g.to_vector(), g_before);
  // a slice's gradient alone: zeros outside it
  Variable v(w0, true);
  sum(narrow(v, 1, 1, 1)).backward();
  EXPECT_EQ(v.grad().to_vector(), (std::vector<double>{0, 1, 0, 1, 0, 1, 0, 1}));
}

TEST(Autograd, MillionOpChainBuildsRunsAndFrees) {
  // y = x + 1e6 scale(., 1) steps on one-element tensors: building, backward
  // and teardown all walk the chain iteratively (a recursive destructor or
  // topological sort would overflow the stack long before). Under
  // AddressSanitizer a quarter: its frames are larger, so a recursive walk
  // would overflow sooner, and a million steps there took 24 s.
  constexpr int kOps = headgrad::test::under_asan ? 250'000 : 1'000'000;
  Variable x(Tensor::scalar(2.0, DType::float64), true);
  auto chain = [&] {
    Variable y = x;
    for (int i = 0; i < kOps; ++i) y = scale(y, 1.0);
    return y;
  };
  {
    Variable y = chain();
    y.backward();  // frees the graph as it goes
    expect_values(x.grad(), {1.0});
  }
  {
    Variable y = chain();
    y.backward({.retain_graph = true});  // the whole chain is torn down with y, by ~Node
    expect_values(x.grad(), {2.0});
  }
  // Fan-in: every op also reads x, so x's node is shared by a million edges.
  Variable y = x;
  for (int i = 0; i < kOps / 4; ++i) y = add(y, x);
  x.zero_grad();
  sum(y).backward();
  expect_values(x.grad(), {kOps / 4 + 1.0});
}

// ---------------------------------------------------------------- in-place writes

TEST(Autograd, WritingASavedTensorInPlaceIsCaughtNamingTheOp) {
  // mul saves each operand for the other's gradient: a write into b after the
  // forward would make da = g * b use the new values.
  Variable a(vec({1.0, 2.0}), true), b(vec({3.0, 4.0}), true);
  Variable loss = sum(mul(a, b));
  Tensor b_values = b.data();  // a handle on the same storage
  b_values.set({0}, 30.0);
  expect_throw_with<std::logic_error>([&] { loss.backward(); },
                                      {"'mul'", "saved tensor 1", "written in place"});
  EXPECT_FALSE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());

  // exp saves its output; a write through a view of it (fill_) is a write to it.
  Variable x(vec({0.0, 1.0}), true);
  Variable y = exp(x);
  Variable l2 = sum(y);
  Tensor y_view = y.data().narrow(0, 1, 1);
  y_view.fill_(0.0);
  expect_throw_with<std::logic_error>([&] { l2.backward(); }, {"'exp'", "written in place"});

  // masked_fill saves its mask: mutable_data counts as a write.
  Variable z(vec({1.0, 2.0, 3.0}), true);
  Tensor mask = Tensor::zeros({3}, DType::boolean);
  Variable l3 = sum(masked_fill(z, mask, 0.0));
  mask.mutable_data<bool>()[2] = true;
  expect_throw_with<std::logic_error>([&] { l3.backward(); }, {"'masked_fill'", "written in place"});
}

TEST(Autograd, WritingATensorNoBackwardReadsIsAllowed) {
  // add saves nothing, and reading (data<T>()) is not writing: both backwards run.
  Variable a(vec({1.0, 2.0}), true), b(vec({3.0, 4.0}), true);
  Variable loss = sum(add(a, mul(b, b)));
  Tensor a_values = a.data();
  a_values.set({1}, 20.0);
  const double* read = b.data().data<double>();
  EXPECT_EQ(read[1], 4.0);
  loss.backward();
  expect_values(a.grad(), {1.0, 1.0});
  expect_values(b.grad(), {6.0, 8.0});  // 2 b
}

// ---------------------------------------------------------------- custom ops

// cube(x) = x^3 with backward 3 x^2 dout, written by hand; `wrong` perturbs it.
Variable cube(const Variable& x, const std::string& name = "cube",
              std::function<Tensor(Tensor)> wrong = nullptr) {
  return custom_op(
      name, {x},
      [](CustomOpContext& ctx, const std::vector<Tensor>& in) {
        ctx.saved = {in[0]};
        Tensor out = Tensor::empty(in[0].shape(), in[0].dtype());
        for (std::int64_t i = 0; i < out.numel(); ++i) out.set_flat(i, std::pow(in[0].flat(i), 3));
        return out;
      },
      [wrong](const CustomOpContext& ctx, const Tensor& dout) {
        const Tensor& x = ctx.saved[0];
        Tensor dx = Tensor::empty(x.shape(), x.dtype());
        for (std::int64_t i = 0; i < dx.numel(); ++i)
          dx.set_flat(i, 3.0 * x.flat(i) * x.flat(i) * dout.flat(i));
        if (wrong) dx = wrong(dx);
        return std::vector<Tensor>{dx};
      });
}

TEST(CustomOp, ForwardBackwardAndGradcheck) {
  Variable x(vec({2.0, -1.0}), true);
  Variable y = cube(x);
  EXPECT_EQ(y.op_name(), "cube");
  expect_values(y.data(), {8.0, -1.0});
  sum(y).backward();
  expect_values(x.grad(), {12.0, 3.0});

  const auto r = gradcheck([](const std::vector<Variable>& v) { return cube(v[0]); },
                           {rnd({3, 4}, 1), });
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_EQ(r.elements_checked, 12);
  // Through a transposed input and composed with core ops (fan-out: x feeds both).
  const auto r2 = gradcheck(
      [](const std::vector<Variable>& v) { return mul(cube(v[0]), exp(v[0])); },
      {rnd({4, 3}, 2).transpose(0, 1)});
  EXPECT_TRUE(r2.ok) << r2.message;
}

TEST(CustomOp, ContextAndUndefinedGradients) {
  // z = a * b with a custom backward that returns only da; b gets nothing.
  Variable a(vec({1.0, 2.0}), true), b(vec({3.0, 4.0}), true), c(vec({5.0, 6.0}));
  std::vector<bool> seen_needs;
  Variable z = custom_op(
      "mul_a_only", {a, b, c},
      [&](CustomOpContext& ctx, const std::vector<Tensor>& in) {
        seen_needs = ctx.needs_input_grad;
        EXPECT_FALSE(grad_enabled());  // the forward runs without recording
        ctx.saved = {in[1]};
        ctx.scalars = {0.5};
        return kernels::binary(kernels::BinaryOp::mul, in[0], in[1]);
      },
      [](const CustomOpContext& ctx, const Tensor& dout) {
        return std::vector<Tensor>{
            kernels::scale(kernels::binary(kernels::BinaryOp::mul, dout, ctx.saved[0]),
                           2.0 * ctx.scalars[0]),
            Tensor(), Tensor()};
      });
  EXPECT_EQ(seen_needs, (std::vector<bool>{true, true, false}));
  sum(z).backward();
  expect_values(a.grad(), {3.0, 4.0});
  EXPECT_FALSE(b.grad().defined());
  EXPECT_FALSE(c.grad().defined());
}

TEST(CustomOp, WritingASavedTensorInPlaceIsCaughtNamingTheOp) {
  // cube saves its input in ctx.saved; the plugin-side write below (copy_)
  // would silently change 3 x^2.
  Variable x(vec({1.0, 2.0}), true);
  Variable loss = sum(cube(x, "saving_cube"));
  Tensor x_values = x.data();
  x_values.copy_(vec({5.0, 6.0}));
  expect_throw_with<std::logic_error>([&] { loss.backward(); },
                                      {"'saving_cube'", "saved tensor 0", "written in place"});
  EXPECT_FALSE(x.grad().defined());
}

TEST(CustomOp, WrongGradientShapeThrowsNamingTheOp) {
  Variable x(vec({1.0, 2.0, 3.0}), true);
  Variable y = cube(x, "bad_shape_cube", [](Tensor dx) { return dx.narrow(0, 0, 2); });
  expect_throw_with<std::logic_error>([&] { sum(y).backward(); },
                                      {"bad_shape_cube", "[2]", "[3]"});
}

TEST(CustomOp, BadGradientNamesTheOpThatMadeIt) {
  // The wrong gradient comes from 'bad_dtype_cube' and reaches scale's output,
  // not a leaf: the message names the producer.
  Variable x(vec({1.0, 2.0}), true);
  Variable y = cube(scale(x, 2.0), "bad_dtype_cube", [](Tensor dx) { return dx.to(DType::float32); });
  expect_throw_with<std::logic_error>([&] { sum(y).backward(); },
                                      {"bad_dtype_cube", "float32", "float64"});
  EXPECT_FALSE(x.grad().defined());
}

TEST(CustomOp, WrongGradientCountThrowsNamingTheOp) {
  Variable x(vec({1.0, 2.0}), true);
  Variable y = custom_op(
      "two_grads_for_one", {x},
      [](CustomOpContext&, const std::vector<Tensor>& in) { return in[0].clone(); },
      [](const CustomOpContext&, const Tensor& dout) { return std::vector<Tensor>{dout, dout}; });
  expect_throw_with<std::logic_error>([&] { sum(y).backward(); }, {"two_grads_for_one", "2", "1"});
}

TEST(CustomOp, ForwardReturningNothingThrows) {
  Variable x(vec({1.0}), true);
  expect_throw_with<std::logic_error>(
      [&] {
        custom_op(
            "empty_forward", {x}, [](CustomOpContext&, const std::vector<Tensor>&) { return Tensor(); },
            [](const CustomOpContext&, const Tensor&) { return std::vector<Tensor>{}; });
      },
      {"empty_forward"});
}

// ---------------------------------------------------------------- gradcheck can fail

TEST(Gradcheck, FailsOnAWrongBackwardAndReportsTheWorstElement) {
  // f(a, b) = a * cube'(b) where the custom backward of b is off by 0.5 at [1, 2] only.
  const GradcheckFn f = [](const std::vector<Variable>& v) {
    return mul(v[0], cube(v[1], "cube_off_by_half", [](Tensor dx) {
                 dx.set({1, 2}, dx.at({1, 2}) + 0.5);
                 return dx;
               }));
  };
  const auto r = gradcheck(f, {rnd({2, 3}, 3), rnd({2, 3}, 4)});
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.elements_checked, 12);
  EXPECT_EQ(r.worst_input, 1u);
  EXPECT_EQ(r.worst_index, (Shape{1, 2}));
  EXPECT_NEAR(r.analytic - r.numeric, 0.5, 1e-5);
  EXPECT_NEAR(r.max_abs_error, 0.5, 1e-5);
  EXPECT_NE(r.message.find("FAILED"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("input 1 [1, 2]"), std::string::npos) << r.message;
}

TEST(Gradcheck, FailsOnAScaledBackward) {
  // A backward of 2 x^2 instead of 3 x^2 is wrong everywhere.
  const auto r = gradcheck(
      [](const std::vector<Variable>& v) {
        return cube(v[0], "cube_2x2", [](Tensor dx) { return kernels::scale(dx, 2.0 / 3.0); });
      },
      {rnd({5}, 5)});
  EXPECT_FALSE(r.ok) << r.message;
  EXPECT_GT(r.max_abs_error, 1e-3);
}

TEST(Gradcheck, FailsWhenAGradientIsMissing) {
  // A backward that drops its gradient reads as analytic 0 against a nonzero numeric one.
  const auto r = gradcheck(
      [](const std::vector<Variable>& v) {
        return custom_op(
            "no_grad_cube", {v[0]},
            [](CustomOpContext&, const std::vector<Tensor>& in) {
              return kernels::binary(kernels::BinaryOp::mul, in[0], in[0]);
            },
            [](const CustomOpContext&, const Tensor&) { return std::vector<Tensor>{Tensor()}; });
      },
      {rnd({3}, 6)});
  EXPECT_FALSE(r.ok) << r.message;
  EXPECT_EQ(r.analytic, 0.0);
}

TEST(Gradcheck, RestoresInputsAndRejectsBadOnes) {
  Tensor x = rnd({2, 3}, 7);
  const std::vector<double> before = x.to_vector();
  const auto r = gradcheck([](const std::vector<Variable>& v) { return exp(v[0]); }, {x});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_EQ(x.to_vector(), before);  // restored exactly
  expect_throw_with<std::invalid_argument>(
      [] { gradcheck([](const std::vector<Variable>& v) { return v[0]; }, {Tensor::ones({2}, DType::float32)}); },
      {"gradcheck", "float32"});
  expect_throw_with<std::invalid_argument>(
      [] {
        gradcheck([](const std::vector<Variable>& v) { return v[0]; },
                  {Tensor::ones({1, 3}, DType::float64).expand({2, 3})});
      },
      {"gradcheck", "stride-0"});
}

// ---------------------------------------------------------------- checkpoint

// One attention head written out: exp(q k^T) v, its [Tq, Tk] weights saved by
// exp (and by the second matmul, the same tensor) for the backward.
Variable head(const std::vector<Variable>& in) { return matmul(exp(matmul(in[0], transpose(in[1], -1, -2))), in[2]); }

TEST(Checkpoint, GradientsWorkedOutByHand) {
  // y = a * b * b: dy/da = b^2 = [9, 16], dy/db = 2 a b = [6, 16]; c needs no gradient.
  Variable a(vec({1.0, 2.0}), true), b(vec({3.0, 4.0}), true), c(vec({5.0, 6.0}));
  const auto abb = [](const std::vector<Variable>& in) { return mul(mul(in[0], in[1]), in[1]); };
  Variable y = checkpoint("abb", {a, b}, abb);
  EXPECT_EQ(y.op_name(), "abb");
  expect_values(y.data(), {9.0, 32.0});
  sum(y).backward();
  expect_values(a.grad(), {9.0, 16.0});
  expect_values(b.grad(), {6.0, 16.0});
  // An input without a gradient gets none; its partner's is b^2 = [25, 36].
  a.zero_grad();
  sum(checkpoint("abb", {a, c}, abb)).backward();
  expect_values(a.grad(), {25.0, 36.0});
  EXPECT_FALSE(c.grad().defined());
  // Under NoGradGuard nothing is recorded: the output is a plain value.
  NoGradGuard off;
  EXPECT_FALSE(checkpoint("abb", {a, b}, abb).requires_grad());
}

TEST(Checkpoint, SameGradientsAsWithoutItBitForBit) {
  const Tensor q = rnd({2, 5, 3}, 11), k = rnd({2, 7, 3}, 12), v = rnd({2, 7, 4}, 13), r = rnd({2, 5, 4}, 14);
  const auto grads = [&](bool recompute) {
    std::vector<Variable> in{Variable(q, true), Variable(k, true), Variable(v, true)};
    const Variable o = recompute ? checkpoint("head", in, head) : head(in);
    sum(mul(o, Variable(r))).backward();
    std::vector<std::vector<double>> out{o.data().to_vector()};
    for (const Variable& x : in) out.push_back(x.grad().to_vector());
    return out;
  };
  EXPECT_EQ(grads(true), grads(false));  // output, dq, dk, dv
  const auto fd = gradcheck(
      [](const std::vector<Variable>& in) { return checkpoint("head", in, head); }, {q, k, v});
  EXPECT_TRUE(fd.ok) << fd.message;
}

TEST(Checkpoint, KeepsOneCallsIntermediatesAtATime) {
  // Eight heads of [256, 256] float64 weights (512 KiB each). Without
  // checkpoint, every head's weights are saved from its forward to its
  // backward: all eight are alive when the backward starts. With it, a
  // head's weights exist only inside its own forward (scores and weights)
  // and its own backward (recomputed weights, their gradient, the scores'):
  // never more than three [256, 256] at once.
  constexpr std::int64_t n = 256, heads = 8;
  constexpr std::size_t square = n * n * sizeof(double);
  std::vector<Tensor> values;
  for (std::int64_t i = 0; i < 3 * heads; ++i) values.push_back(scale(Variable(rnd({n, 1}, 20 + i)), 0.1).data());
  const auto run = [&](bool recompute, std::vector<std::vector<double>>& grads) {
    std::vector<Variable> leaves;
    for (const Tensor& t : values) leaves.emplace_back(t, true);
    const std::size_t base = memory_stats().current_bytes;
    reset_peak_memory();
    {
      Variable total;
      for (std::int64_t h = 0; h < heads; ++h) {
        const std::vector<Variable> in(leaves.begin() + 3 * h, leaves.begin() + 3 * h + 3);
        const Variable o = recompute ? checkpoint("head", in, head) : head(in);
        total = total.defined() ? add(total, o) : o;
      }
      sum(total).backward();
    }
    for (const Variable& x : leaves) grads.push_back(x.grad().to_vector());
    return memory_stats().peak_bytes - base;
  };
  std::vector<std::vector<double>> plain_grads, recomputed_grads;
  const std::size_t plain = run(false, plain_grads), recomputed = run(true, recomputed_grads);
  EXPECT_GE(plain, heads * square) << plain;
  EXPECT_LT(recomputed, 3 * square + square / 4) << recomputed;  // the [n, 1] tensors are a few KiB
  EXPECT_EQ(recomputed_grads, plain_grads);
}

TEST(Checkpoint, RetainGraphRecomputesForEachBackward) {
  Variable a(vec({1.0, 2.0}), true);
  const Variable y = sum(checkpoint("cube", {a}, [](const std::vector<Variable>& in) {
    return mul(mul(in[0], in[0]), in[0]);
  }));
  y.backward({.retain_graph = true});
  y.backward();
  expect_values(a.grad(), {6.0, 24.0});  // 3 a^2 twice
}

TEST(Checkpoint, RefusesWhatItCannotRecompute) {
  Variable a(vec({1.0, 2.0}), true);
  expect_throw_with<std::invalid_argument>(
      [&] { checkpoint("f", {a, Variable()}, [](const std::vector<Variable>& in) { return in[0]; }); },
      {"checkpoint 'f'", "input 1 is undefined"});
  expect_throw_with<std::logic_error>(
      [&] { checkpoint("f", {a}, [](const std::vector<Variable>&) { return Variable(); }); },
      {"checkpoint 'f'", "undefined"});
  // A function that computes another shape when run again is named, not backpropagated.
  int calls = 0;
  const Variable y = checkpoint("grows", {a}, [&](const std::vector<Variable>& in) {
    return ++calls == 1 ? in[0] : cat({in[0], in[0]}, 0);
  });
  expect_throw_with<std::logic_error>([&] { sum(y).backward(); },
                                      {"checkpoint 'grows'", "[4]", "[2]", "the same thing both times"});
  EXPECT_FALSE(a.grad().defined());
}

}  // namespace

}  // namespace test_autograd
