// headgrad autodiff: define-by-run reverse mode.
//
//   Variable w(randn({3, 4}, DType::float64, gen), /*requires_grad=*/true);
//   Variable x(randn({2, 4}, DType::float64, gen));
//   Variable loss = sum(mul(linear(x, w), r));   // ops record their backward
//   loss.backward();                              // reverse topological order
//   w.grad();                                     // [3, 4], accumulated
//
// Each op builds its output, saves the tensors its backward needs and attaches
// both to a new graph node (as in micrograd and flashlight; PyTorch's saved
// tensors). A node holds no data of its own: the graph's edges keep no value
// alive, only what an op saved. Gradients always accumulate, so a value used
// twice comes out right.
//
// A backward frees the graph as it walks it (each node's closure and saved
// tensors, once it has run), so a second backward through the same graph is a
// std::logic_error naming the op, unless the first passed retain_graph:
//   loss.backward({.retain_graph = true});
//   loss.backward();                              // gradients add up
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "headgrad/tensor.hpp"

namespace headgrad {

class Variable;

// What an op's backward is given besides the gradient of its output.
struct BackwardContext {
  std::vector<Tensor> saved;           // what the op saved, in its order
  std::vector<bool> needs_input_grad;  // one per input
  std::vector<Shape> input_shapes;     // one per input
};
// Returns one gradient per input (undefined: none, or not needed). The engine
// checks each against its input's shape and dtype, naming the op, and
// accumulates it.
using BackwardFn =
    std::function<std::vector<Tensor>(const Tensor& grad_output, const BackwardContext& ctx)>;

struct BackwardOptions {
  bool retain_graph = false;  // keep closures and saved tensors for another backward
};

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

  // Backward from a one-element output (gradient 1) ...
  void backward(const BackwardOptions& options = {}) const;
  // ... or with an explicit upstream gradient of the output's shape.
  // Leaves get their gradients only when the whole pass succeeds: a backward
  // that throws leaves every gradient as it was (the nodes it had already run
  // are freed, unless retain_graph). One backward at a time per graph.
  void backward(const Tensor& grad_output, const BackwardOptions& options = {}) const;

  // Builds a non-leaf: the core of every op. `saved` are the tensors the
  // backward reads (BackwardContext::saved); their versions are recorded, and
  // a backward after one of them was written in place is a std::logic_error
  // naming the op. The node requires a gradient when any input does and grad
  // mode is on; otherwise nothing is recorded.
  static Variable from_op(std::string op, Tensor data, const std::vector<Variable>& inputs,
                          std::vector<Tensor> saved, BackwardFn backward);
  // The same for a braced list of inputs, `{x, w}`, which it refers to rather
  // than copies (a copied Variable copies its tensor's shape and strides).
  static Variable from_op(std::string op, Tensor data,
                          std::initializer_list<std::reference_wrapper<const Variable>> inputs,
                          std::vector<Tensor> saved, BackwardFn backward);
  // A non-leaf that is x's slice along `dim` from `start` (data: that view,
  // as narrow gives it). Its backward is the engine's own: the gradient is
  // added into that slice of x's pending gradient, in place once the engine
  // owns that tensor, rather than written into zeros of x's shape that are
  // then added whole (a weight sliced once per head would cost a full-size
  // add per head). The values are those of the whole-tensor add (a + 0 = a),
  // up to the sign of a zero outside the slice.
  static Variable from_slice(std::string op, Tensor data, const Variable& x, std::int64_t dim,
                             std::int64_t start);

 private:
  struct Node;
  template <class Inputs>
  static Variable build_op(std::string op, Tensor data, const Inputs& inputs,
                           std::vector<Tensor> saved, BackwardFn backward);
  // The node's saved tensors, checked unwritten since they were saved.
  static std::vector<Tensor> unpack_saved(const Node& n);
  Tensor data_;
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
// dtype and names the op when it does not. ctx.saved is kept by the graph and
// freed with it, and checked unwritten since the forward, like a core op's
// saved tensors.
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
