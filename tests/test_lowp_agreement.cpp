// per_head, batched and fused_sdpa in bfloat16 and float16, against a float64
// oracle: per_head in float64 on the very same values (the 16-bit inputs
// upcast exactly), at the MHA and core levels; and fused_sdpa's 16-bit
// boundary bit for bit against its float32 kernel (whose backward
// test_fused_sdpa gradchecks in float64).
//
// The tolerance comes from the dtype's epsilon (eps = 2^-7 bfloat16, 2^-10
// float16), not from a suite's default. Every op rounds its result once, a
// relative error of at most eps/2; a tensor here is the end of a chain of
// about ten such ops (projections, scores, softmax, P V, output projection,
// and the matmuls and softmax backward on the way back), and the sums inside
// a matmul add their inputs' roundings (growing like sqrt(length) when they
// are independent, and partly cancelling). So the error of a correct plugin,
// normalized by the tensor's largest value, stays within a few eps (measured
// 0.3 - 1.1 eps at these shapes): kUlps = 4 leaves room, while a bug of the
// catalog moves a tensor by O(1) of its scale, hundreds of eps. The 16-bit error must
// also be above eps/64: a plugin that quietly ran in float64 would not round.
//
// Shape legend: B batch, T sequence, D model width, H heads, d head width,
// Tq/Tk query/key lengths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "headgrad/loader.hpp"
#include "headgrad/ops.hpp"
#include "headgrad/plugin.hpp"
#include "attention_run.hpp"
#include "real_plugins.hpp"

namespace test_lowp_agreement {  // this file's names: test files share unity builds (tests/meson.build)

namespace {

using namespace headgrad;

constexpr double kUlps = 4;

double epsilon(DType dt) { return dt == DType::bfloat16 ? 0x1p-7 : 0x1p-10; }

// max|a - golden| / max|golden|
double scaled_error(const Tensor& a, const Tensor& golden) {
  const std::vector<double> x = a.to_vector(), g = golden.to_vector();
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    err = std::max(err, std::fabs(x[i] - g[i]));
    scale = std::max(scale, std::fabs(g[i]));
  }
  return err / scale;
}

// The real plugins, loaded once per test suite.
class LoadedPlugins : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    registry_ = std::make_unique<PluginRegistry>();
    problems_ = test::load_real_plugins(*registry_);
  }
  static void TearDownTestSuite() { registry_.reset(); }
  static const Attention& plugin(const std::string& name) {
    if (!registry_->find(name)) throw std::runtime_error("plugin " + name + " not loaded:\n" + problems_);
    return *registry_->get(name).attention;
  }

  // Each tensor of `got` (16-bit) against `golden` (float64).
  static void expect_close(const std::vector<std::string>& names, const std::vector<Tensor>& got,
                           const std::vector<Tensor>& golden, DType dt, const std::string& who) {
    for (std::size_t i = 0; i < names.size(); ++i) {
      ASSERT_EQ(got[i].dtype(), dt) << names[i] << " of " << who;
      const double e = scaled_error(got[i], golden[i]);
      EXPECT_LE(e, kUlps * epsilon(dt)) << names[i] << " of " << who << " in " << dtype_name(dt);
      EXPECT_GT(e, epsilon(dt) / 64) << names[i] << " of " << who << " did not round to " << dtype_name(dt);
      std::printf("%-10s %-9s %-4s error %.2f eps\n", who.c_str(), std::string(dtype_name(dt)).c_str(),
                  names[i].c_str(), e / epsilon(dt));
    }
  }

  static inline std::unique_ptr<PluginRegistry> registry_;
  static inline std::string problems_;
};

class LowPrecision : public LoadedPlugins,
                     public ::testing::WithParamInterface<std::tuple<std::string, DType>> {};
class FusedBoundary : public LoadedPlugins, public ::testing::WithParamInterface<DType> {};

// [B, T, D] = [2, 16, 32], H 4, causal: drawn in float64, rounded to the dtype.
std::vector<Tensor> mha_run(const Attention& p, DType dt, DType run_dt) {
  Generator gen(11);
  const std::int64_t b = 2, t = 16, dm = 32, h = 4;
  std::vector<Tensor> in = {randn({b, t, dm}, DType::float64, gen), randn({dm, dm}, DType::float64, gen, 0.2),
                            randn({dm, dm}, DType::float64, gen, 0.2), randn({dm, dm}, DType::float64, gen, 0.2),
                            randn({dm, dm}, DType::float64, gen, 0.2), randn({b, t, dm}, DType::float64, gen)};
  for (auto& x : in) x = x.to(dt).to(run_dt);  // the 16-bit values, in the dtype that runs
  AttentionSpec spec;
  spec.d_model = dm;
  spec.num_heads = h;
  spec.causal = true;
  return test::run_mha(p, in[0], in[1], in[2], in[3], in[4], spec, in[5]).all();
}

// q, k, v [B, H, T, d] = [2, 3, 12, 16], causal.
std::vector<Tensor> core_run(const Attention& p, DType dt, DType run_dt) {
  Generator gen(12);
  const Shape s = {2, 3, 12, 16};
  std::vector<Tensor> in = {randn(s, DType::float64, gen), randn(s, DType::float64, gen),
                            randn(s, DType::float64, gen), randn(s, DType::float64, gen)};
  for (auto& x : in) x = x.to(dt).to(run_dt);
  AttentionSpec spec;
  spec.causal = true;
  return test::run_core(p, in[0], in[1], in[2], spec, in[3]).all();
}

TEST_P(LowPrecision, MhaLevelAgreesWithTheFloat64Oracle) {
  const auto& [name, dt] = GetParam();
  const std::vector<Tensor> golden = mha_run(plugin("per_head"), dt, DType::float64);
  expect_close({"out", "dx", "dwq", "dwk", "dwv", "dwo"}, mha_run(plugin(name), dt, dt), golden, dt, name);
}

TEST_P(LowPrecision, CoreLevelAgreesWithTheFloat64Oracle) {
  const auto& [name, dt] = GetParam();
  const std::vector<Tensor> golden = core_run(plugin("per_head"), dt, DType::float64);
  expect_close({"out", "dq", "dk", "dv"}, core_run(plugin(name), dt, dt), golden, dt, name);
}

INSTANTIATE_TEST_SUITE_P(Plugins, LowPrecision,
                         ::testing::Combine(::testing::Values("per_head", "batched", "fused_sdpa"),
                                            ::testing::Values(DType::bfloat16, DType::float16)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::string(dtype_name(std::get<1>(info.param)));
                         });

// fused_sdpa in 16 bits is its float32 kernel on the exact upcasts, each output
// and gradient rounded once: out, dq, dk, dv equal round(float32 result) bit
// for bit (dout = round(1 * r) = r, upcast exactly).
TEST_P(FusedBoundary, FusedIsItsFloat32KernelRoundedOnce) {
  const DType dt = GetParam();
  const Attention& fused = plugin("fused_sdpa");
  const std::vector<Tensor> f32 = core_run(fused, dt, DType::float32);
  const std::vector<Tensor> f16 = core_run(fused, dt, dt);
  const char* names[] = {"out", "dq", "dk", "dv"};
  for (std::size_t i = 0; i < 4; ++i) {
    ASSERT_EQ(f32[i].dtype(), DType::float32);
    EXPECT_EQ(f16[i].to_vector(), f32[i].to(dt).to_vector()) << names[i] << " in " << dtype_name(dt);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FusedBoundary, ::testing::Values(DType::bfloat16, DType::float16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace

}  // namespace test_lowp_agreement
