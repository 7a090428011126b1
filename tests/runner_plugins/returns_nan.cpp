// returns_nan: a correct attention whose output has one NaN, at a known
// element: mha level out[0, 1, 3], core level out[0, 0, 1, 2].
#include <cmath>

#include "common.hpp"

namespace runner_returns_nan {

using namespace runner_test;

Variable poison(const Variable& out, std::initializer_list<std::int64_t> at) {
  Tensor nan = Tensor::zeros(out.shape(), out.dtype());
  nan.set(at, std::nan(""));
  return add(out, Variable(nan));
}

class ReturnsNan final : public Attention {
 public:
  PluginInfo info() const override { return test_info("returns_nan", "test plugin: one NaN in its output"); }
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    return poison(good_mha(x, w, spec), {0, 1, 3});  // [B, T, D]
  }
  Variable core_forward(const Variable& q, const Variable& k, const Variable& v,
                        const AttentionSpec& spec) const override {
    return poison(attention_core(q, k, v, spec), {0, 0, 1, 2});  // [B, H, Tq, d]
  }
};

HEADGRAD_TEST_PLUGIN(returns_nan, ReturnsNan)

}  // namespace runner_returns_nan
