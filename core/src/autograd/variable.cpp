#include "headgrad/variable.hpp"

#include <stdexcept>
#include <unordered_set>

#include "headgrad/kernels.hpp"

namespace headgrad {

struct Variable::Node {
  Tensor data;
  Tensor grad;
  bool requires_grad = false;
  std::string op = "leaf";
  std::vector<Variable> inputs;
  BackwardFn backward;  // empty for leaves
};

namespace {
thread_local bool t_grad_enabled = true;

[[noreturn]] void throw_undefined(const char* what) {
  throw std::logic_error(std::string(what) + " on an undefined Variable");
}
}  // namespace

bool grad_enabled() { return t_grad_enabled; }
NoGradGuard::NoGradGuard() : previous_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = previous_; }

Variable::Variable(Tensor data, bool requires_grad) : node_(std::make_shared<Node>()) {
  if (!data.defined()) throw std::invalid_argument("Variable: undefined tensor");
  if (requires_grad && data.dtype() == DType::boolean)
    throw std::invalid_argument("Variable: a bool tensor cannot require a gradient");
  node_->data = std::move(data);
  node_->requires_grad = requires_grad;
}

const Tensor& Variable::data() const {
  if (!node_) throw_undefined("data()");
  return node_->data;
}
bool Variable::requires_grad() const { return node_ && node_->requires_grad; }
bool Variable::is_leaf() const { return node_ && !node_->backward; }
const std::string& Variable::op_name() const {
  if (!node_) throw_undefined("op_name()");
  return node_->op;
}
const Tensor& Variable::grad() const {
  if (!node_) throw_undefined("grad()");
  return node_->grad;
}
void Variable::zero_grad() {
  if (node_) node_->grad = Tensor();
}

void Variable::accumulate_grad(const Tensor& g) const {
  if (!node_ || !node_->requires_grad || !g.defined()) return;
  Node& n = *node_;
  if (g.shape() != n.data.shape() || g.dtype() != n.data.dtype())
    throw std::logic_error("backward of '" + n.op + "': gradient " + g.repr() +
                           " does not match its value " + n.data.repr());
  if (!n.grad.defined()) {
    // Stored as is: gradients are never updated in place, so sharing is safe.
    n.grad = g.contiguous();
  } else {
    n.grad = kernels::binary(kernels::BinaryOp::add, n.grad, g);
  }
}

Variable Variable::from_op(std::string op, Tensor data, std::vector<Variable> inputs,
                           BackwardFn backward) {
  Variable out(std::move(data));
  out.node_->op = std::move(op);
  bool any = false;
  for (const auto& in : inputs) any = any || in.requires_grad();
  if (any && t_grad_enabled) {
    out.node_->requires_grad = true;
    out.node_->inputs = std::move(inputs);
    out.node_->backward = std::move(backward);
  }
  return out;
}

void Variable::backward() const {
  if (!node_) throw_undefined("backward()");
  if (node_->data.numel() != 1)
    throw std::invalid_argument("backward(): output of shape " + shape_str(node_->data.shape()) +
                                " is not a scalar; pass an upstream gradient of that shape");
  backward(Tensor::ones(node_->data.shape(), node_->data.dtype()));
}

void Variable::backward(const Tensor& grad_output) const {
  if (!node_) throw_undefined("backward()");
  if (!node_->requires_grad)
    throw std::invalid_argument("backward(): the output does not require a gradient (no input "
                                "requires one, or it was computed under NoGradGuard)");
  if (grad_output.shape() != node_->data.shape())
    throw std::invalid_argument("backward(): upstream gradient " + shape_str(grad_output.shape()) +
                                " does not match output " + shape_str(node_->data.shape()));

  // Topological order by an iterative post-order DFS (deep graphs must not
  // overflow the stack), then one reversed loop, as in micrograd.
  std::vector<Node*> order;
  std::unordered_set<Node*> seen;
  std::vector<std::pair<Node*, std::size_t>> stack{{node_.get(), 0}};
  seen.insert(node_.get());
  while (!stack.empty()) {
    auto& [n, next] = stack.back();
    if (next < n->inputs.size()) {
      Node* child = n->inputs[next++].node_.get();
      if (child && child->requires_grad && seen.insert(child).second) stack.push_back({child, 0});
    } else {
      order.push_back(n);
      stack.pop_back();
    }
  }

  accumulate_grad(grad_output.to(node_->data.dtype()));
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* n = *it;
    if (!n->backward || !n->grad.defined()) continue;
    Tensor g = std::move(n->grad);  // a non-leaf's gradient is not kept (as in PyTorch)
    n->grad = Tensor();
    n->backward(g, n->inputs);
  }
}

// ---------------------------------------------------------------- custom ops

Variable custom_op(const std::string& name, std::vector<Variable> inputs, CustomForward forward,
                   CustomBackward backward) {
  auto ctx = std::make_shared<CustomOpContext>();
  std::vector<Tensor> values;
  values.reserve(inputs.size());
  for (const auto& in : inputs) {
    values.push_back(in.data());
    ctx->needs_input_grad.push_back(in.requires_grad() && grad_enabled());
  }
  Tensor out;
  {
    NoGradGuard no_grad;  // a forward that calls ops internally records no graph
    out = forward(*ctx, values);
  }
  if (!out.defined()) throw std::logic_error("custom op '" + name + "': forward returned nothing");
  return Variable::from_op(
      name, std::move(out), std::move(inputs),
      [name, ctx, backward = std::move(backward)](const Tensor& g, std::vector<Variable>& ins) {
        std::vector<Tensor> grads;
        {
          NoGradGuard no_grad;
          grads = backward(*ctx, g);
        }
        if (grads.size() != ins.size())
          throw std::logic_error("custom op '" + name + "': backward returned " +
                                 std::to_string(grads.size()) + " gradients for " +
                                 std::to_string(ins.size()) + " inputs");
        for (std::size_t i = 0; i < ins.size(); ++i) {
          if (!grads[i].defined()) continue;
          if (grads[i].shape() != ins[i].shape())
            throw std::logic_error("custom op '" + name + "': gradient " + std::to_string(i) +
                                   " has shape " + shape_str(grads[i].shape()) +
                                   ", its input has " + shape_str(ins[i].shape()));
          ins[i].accumulate_grad(grads[i]);
        }
      });
}

}  // namespace headgrad
