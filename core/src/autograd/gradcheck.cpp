#include "headgrad/gradcheck.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "headgrad/ops.hpp"

namespace headgrad {

namespace {
double weighted_sum(const Tensor& out, const Tensor& r) {
  const std::vector<double> o = out.to_vector(), w = r.to_vector();
  double s = 0.0;
  for (std::size_t i = 0; i < o.size(); ++i) s += o[i] * w[i];
  return s;
}

bool has_overlap(const Tensor& t) {
  for (std::int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1 && t.stride(d) == 0) return true;
  return false;
}
}  // namespace

GradcheckResult gradcheck(const GradcheckFn& f, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options) {
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].dtype() != DType::float64)
      throw std::invalid_argument("gradcheck: input " + std::to_string(i) + " is " +
                                  std::string(dtype_name(inputs[i].dtype())) +
                                  "; finite differences need float64");
    if (has_overlap(inputs[i]))
      throw std::invalid_argument("gradcheck: input " + std::to_string(i) + " " +
                                  inputs[i].repr() +
                                  " has a stride-0 dim: its elements overlap, perturb a "
                                  "contiguous tensor and expand inside f instead");
  }

  // Analytic: one backward of sum(out * R).
  std::vector<Variable> leaves;
  for (const auto& t : inputs) leaves.emplace_back(t, true);
  const Variable out = f(leaves);
  Generator gen(options.seed);
  const Tensor r = randn(out.shape(), DType::float64, gen);
  sum(mul(out, Variable(r))).backward();

  auto loss_at = [&]() {
    NoGradGuard no_grad;
    std::vector<Variable> plain;
    for (const auto& t : inputs) plain.emplace_back(t);
    return weighted_sum(f(plain).data(), r);
  };

  GradcheckResult res;
  double worst_excess = -1.0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    Tensor x = inputs[i];
    const Tensor& g = leaves[i].grad();
    for (std::int64_t e = 0; e < x.numel(); ++e) {
      const double orig = x.flat(e);
      x.set_flat(e, orig + options.eps);
      const double up = loss_at();
      x.set_flat(e, orig - options.eps);
      const double down = loss_at();
      x.set_flat(e, orig);
      const double numeric = (up - down) / (2.0 * options.eps);
      const double analytic = g.defined() ? g.flat(e) : 0.0;
      const double err = std::abs(analytic - numeric);
      const double excess = err - (options.atol + options.rtol * std::abs(numeric));
      ++res.elements_checked;
      res.max_abs_error = std::max(res.max_abs_error, err);
      if (excess > worst_excess || std::isnan(err)) {
        worst_excess = std::isnan(err) ? INFINITY : excess;
        res.worst_input = i;
        res.worst_index = unravel_index(e, x.shape());
        res.analytic = analytic;
        res.numeric = numeric;
      }
    }
  }
  res.ok = worst_excess <= 0.0;
  std::ostringstream msg;
  msg.precision(10);
  msg << (res.ok ? "gradcheck passed" : "gradcheck FAILED") << ": " << res.elements_checked
      << " elements, max |analytic - numeric| " << res.max_abs_error;
  if (res.elements_checked > 0)
    msg << "; worst at input " << res.worst_input << " " << shape_str(res.worst_index)
        << ": analytic " << res.analytic << ", numeric " << res.numeric;
  res.message = msg.str();
  return res;
}

}  // namespace headgrad
