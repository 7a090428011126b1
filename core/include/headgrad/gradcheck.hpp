// Gradient checking: analytic gradients against central finite differences.
//
//   auto r = gradcheck([](const std::vector<Variable>& v) { return softmax(v[0], -1); },
//                      {randn({3, 4}, DType::float64, gen).transpose(0, 1)});
//   EXPECT_TRUE(r.ok) << r.message;
//
// The output is reduced to one scalar, loss = sum(out * R) with R a seeded
// random tensor of out's shape (a plain sum would hide errors that cancel), and
// d loss / d input is compared element by element with
// (loss(x + eps) - loss(x - eps)) / (2 eps), for every element of every input.
// Inputs must be float64. They are used as given, views included, so a
// transposed or narrowed input is checked with its own strides; each element is
// restored exactly after it is perturbed.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "headgrad/variable.hpp"

namespace headgrad {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-7;
  double rtol = 1e-5;
  std::uint64_t seed = 0;  // for R
};

struct GradcheckResult {
  bool ok = true;
  double max_abs_error = 0.0;
  std::size_t worst_input = 0;
  Shape worst_index;        // index into that input
  double analytic = 0.0;    // at the worst element
  double numeric = 0.0;
  std::int64_t elements_checked = 0;
  std::string message;      // one line: verdict and the worst element
};

using GradcheckFn = std::function<Variable(const std::vector<Variable>&)>;

GradcheckResult gradcheck(const GradcheckFn& f, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options = {});

}  // namespace headgrad
