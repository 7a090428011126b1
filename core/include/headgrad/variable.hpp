// headgrad autodiff: define-by-run reverse mode.
//
//   Variable w(randn({3, 4}, DType::float64, gen), /*requires_grad=*/true);
//   Variable x(randn({2, 4}, DType::float64, gen));
//   Variable loss = sum(mul(linear(x, w), r));   // ops record their backward
//   loss.backward();                              // reverse topological order
//   w.grad();                                     // [3, 4], accumulated
//
// Each op builds its output, defines a backward closure that captures only what
// it needs, and attaches both to a new node (as in micrograd and flashlight).
// Gradients always accumulate, so a value used twice comes out right.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "headgrad/tensor.hpp"

namespace headgrad {

class Variable;

// Receives the gradient of the op's output and adds each input's gradient to
// it with Variable::accumulate_grad (skipping inputs that need none).
using BackwardFn = std::function<void(const Tensor& grad_output, std::vector<Variable>& inputs)>;

class Variable {
 public:
  Variable() = default;  // undefined
  explicit Variable(Tensor data, bool requires_grad = false);

  bool defined() const { return node_ != nullptr; }
  const Tensor& data() const;
  const Shape& shape() const { return data().shape(); }
  DType dtype() const { return data().dtype(); }
  std::int64_t dim() const { return data().dim(); }
  std::int64_t size(std::int64_t d) const { return data().size(d); }
  std::int64_t numel() const { return data().numel(); }

  bool requires_grad() const;
  bool is_leaf() const;
  const std::string& op_name() const;  // "leaf" for leaves
  // The accumulated gradient (undefined until a backward pass reaches it).
  const Tensor& grad() const;
  void zero_grad();
  // Adds g to this variable's gradient; no-op when it requires none.
  void accumulate_grad(const Tensor& g) const;

  // Backward from a one-element output (gradient 1) ...
  void backward() const;
  // ... or with an explicit upstream gradient of the output's shape.
  void backward(const Tensor& grad_output) const;

  // Builds a non-leaf: the core of every op. The node requires a gradient when
  // any input does and grad mode is on; otherwise the backward is dropped.
  static Variable from_op(std::string op, Tensor data, std::vector<Variable> inputs,
                          BackwardFn backward);

  bool same_node(const Variable& other) const { return node_ == other.node_; }

 private:
  struct Node;
  std::shared_ptr<Node> node_;
};

// While one is alive on this thread, ops record no graph (like torch.no_grad()).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};
bool grad_enabled();

// ---- custom ops (like torch.autograd.Function) ----
//
// A fused op supplies its forward over plain tensors and its own backward.
//
//   Variable out = custom_op("my_sdpa", {q, k, v},
//       [](CustomOpContext& ctx, const std::vector<Tensor>& in) {
//         Tensor o = ...;  ctx.saved = {in[0], in[1], in[2], o, lse};  return o; },
//       [](const CustomOpContext& ctx, const Tensor& dout) {
//         return std::vector<Tensor>{dq, dk, dv}; });   // undefined = no gradient
//
// The engine checks that each returned gradient has its input's shape and
// names the op when it does not.
struct CustomOpContext {
  std::vector<Tensor> saved;            // tensors the backward needs
  std::vector<bool> needs_input_grad;   // one per input
  std::vector<double> scalars;          // small values the backward needs
};
using CustomForward = std::function<Tensor(CustomOpContext&, const std::vector<Tensor>&)>;
using CustomBackward =
    std::function<std::vector<Tensor>(const CustomOpContext&, const Tensor& grad_output)>;

Variable custom_op(const std::string& name, std::vector<Variable> inputs, CustomForward forward,
                   CustomBackward backward);

}  // namespace headgrad
