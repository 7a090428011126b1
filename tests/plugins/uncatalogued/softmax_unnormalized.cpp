// softmax_unnormalized: a kernel that subtracts the row max and takes exp but
// never divides by the row's sum (the normalization left for a later pass
// that never came): each output row is the right one times its denominator.
#include "common.hpp"

namespace u_softmax_unnormalized {
using namespace uncatalogued;

class Plugin final : public Attention {
 public:
  PluginInfo info() const override {
    return info_of("u_softmax_unnormalized", "test: softmax without the division by the sum", "core");
  }
  Variable core_forward(const Variable& q, const Variable& k, const Variable& v, const AttentionSpec& spec) const override {
    const Variable s = scores(q, k, spec);  // [B, H, Tq, Tk]
    // the row max as a constant, as a kernel keeps it
    const Tensor sd = s.data().contiguous();
    const std::int64_t tk = sd.size(-1);
    auto vals = sd.to_vector();
    std::vector<double> m(vals.size() / static_cast<std::size_t>(tk), -INFINITY);
    for (std::size_t i = 0; i < vals.size(); ++i) m[i / tk] = std::max(m[i / tk], vals[i]);
    Shape rows = sd.shape();
    rows.back() = 1;
    const Variable max(Tensor::from_values(m, rows, sd.dtype()));
    return matmul(exp(sub(s, max)), v);  // BUG: no division by sum(exp(s - max))
  }
};
HEADGRAD_TEST_PLUGIN(u_softmax_unnormalized, Plugin)
}  // namespace u_softmax_unnormalized
