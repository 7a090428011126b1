#include "headgrad/variable.hpp"
#include "headgrad/checkpoint.hpp"

#include <stdexcept>
#include <atomic>
#include <memory>
#include <optional>

#include "headgrad/kernels.hpp"

namespace headgrad {

// One node of the graph. It describes its value (shape, dtype) but holds no
// data: what the backward reads is in `saved`, so an edge keeps no input's
// value alive.
struct Variable::Node {
  std::string op = "leaf";
  Shape shape;
  DType dtype = DType::float64;
  bool requires_grad = false;
  bool is_op = false;    // recorded by an op (stays true when released)
  bool released = false; // its backward ran without retain_graph: closure and saved are gone
  Tensor grad;           // leaves: the accumulated gradient
  // Set by the backward walking the node: the walk's id, and its place in the walk's order.
  std::uint64_t walk = 0;
  std::size_t slot = 0;
  std::vector<std::shared_ptr<Node>> inputs;
  // A tensor the op saved for its backward, with its storage's version then:
  // a backward must not read a tensor written in place since (PyTorch's rule).
  struct Saved {
    Tensor tensor;
    std::uint64_t version = 0;
  };
  std::vector<Saved> saved;
  BackwardFn backward;
  // Set by from_slice: the node is input 0's slice [start, start + length)
  // along dim, and the engine places its gradient there.
  struct Slice {
    std::int64_t dim = 0, start = 0;
  };
  std::optional<Slice> slice_of_input;

  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  ~Node();

  void release() {
    backward = nullptr;
    saved.clear();
    inputs.clear();
    released = true;
  }
};

// Iterative teardown: a chain of a million nodes must not recurse a million
// destructors deep. A node whose last owner is this loop hands its edges over
// before it dies.
Variable::Node::~Node() {
  std::vector<std::shared_ptr<Node>> pending = std::move(inputs);
  while (!pending.empty()) {
    std::shared_ptr<Node> n = std::move(pending.back());
    pending.pop_back();
    if (n.use_count() == 1) {
      for (auto& in : n->inputs) pending.push_back(std::move(in));
      n->inputs.clear();
    }
  }
}

namespace {
thread_local bool t_grad_enabled = true;
std::atomic<std::uint64_t> g_walks{0};

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
  node_->shape = data.shape();
  node_->dtype = data.dtype();
  node_->requires_grad = requires_grad;
  data_ = std::move(data);
}

const Tensor& Variable::data() const {
  if (!node_) throw_undefined("data()");
  return data_;
}
bool Variable::requires_grad() const { return node_ && node_->requires_grad; }
bool Variable::is_leaf() const { return node_ && !node_->is_op; }
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

// Inputs: a std::vector<Variable> or a braced list of references to them.
template <class Inputs>
Variable Variable::build_op(std::string op, Tensor data, const Inputs& inputs,
                            std::vector<Tensor> saved, BackwardFn backward) {
  Variable out(std::move(data));
  out.node_->op = std::move(op);
  bool any = false;
  for (const Variable& in : inputs) any = any || in.requires_grad();
  if (any && t_grad_enabled) {
    Node& n = *out.node_;
    n.requires_grad = true;
    n.is_op = true;
    n.inputs.reserve(inputs.size());
    for (const Variable& in : inputs) {
      if (!in.node_) throw_undefined(n.op.c_str());
      n.inputs.push_back(in.node_);
    }
    n.saved.reserve(saved.size());
    for (auto& t : saved) {
      const std::uint64_t version = t.version();
      n.saved.push_back({std::move(t), version});
    }
    n.backward = std::move(backward);
  }
  return out;
}

Variable Variable::from_op(std::string op, Tensor data, const std::vector<Variable>& inputs,
                           std::vector<Tensor> saved, BackwardFn backward) {
  return build_op(std::move(op), std::move(data), inputs, std::move(saved), std::move(backward));
}

Variable Variable::from_slice(std::string op, Tensor data, const Variable& x, std::int64_t dim,
                              std::int64_t start) {
  Variable out = build_op(std::move(op), std::move(data), std::vector<Variable>{x}, {}, BackwardFn());
  if (out.node_->is_op) out.node_->slice_of_input = Node::Slice{dim, start};
  return out;
}

Variable Variable::from_op(std::string op, Tensor data,
                           std::initializer_list<std::reference_wrapper<const Variable>> inputs,
                           std::vector<Tensor> saved, BackwardFn backward) {
  return build_op(std::move(op), std::move(data), inputs, std::move(saved), std::move(backward));
}

void Variable::backward(const BackwardOptions& options) const {
  if (!node_) throw_undefined("backward()");
  if (data_.numel() != 1)
    throw std::invalid_argument("backward(): output of shape " + shape_str(data_.shape()) +
                                " is not a scalar; pass an upstream gradient of that shape");
  backward(Tensor::ones(data_.shape(), data_.dtype()), options);
}

namespace {

// Adds g to the gradient pending in `slot`. The first one is kept as is (it
// may be a view of another tensor); a sum is a tensor of the engine's own,
// `owned`, which add_to_slice may then write in place.
void accumulate(Tensor& slot, bool& owned, const Tensor& g) {
  owned = slot.defined();
  slot = slot.defined() ? kernels::binary(kernels::BinaryOp::add, slot, g) : g;
}

// Adds g, the gradient of the slice [start, start + g.size(dim)) along dim of
// a tensor of `shape`, into that slice of the gradient pending in `slot`:
// zeros elsewhere when it is the first, else in place (after one copy when
// the pending tensor is not the engine's own).
void add_to_slice(Tensor& slot, bool& owned, const Shape& shape, std::int64_t dim, std::int64_t start,
                  const Tensor& g) {
  if (!slot.defined()) {
    slot = Tensor::zeros(shape, g.dtype());
    slot.narrow(dim, start, g.size(dim)).copy_(g);
    owned = true;
    return;
  }
  if (!owned) {
    Tensor own = Tensor::empty(shape, slot.dtype());
    own.copy_(slot);
    slot = std::move(own);
    owned = true;
  }
  Tensor part = slot.narrow(dim, start, g.size(dim));
  part.copy_(kernels::binary(kernels::BinaryOp::add, part, g));
}

}  // namespace

std::vector<Tensor> Variable::unpack_saved(const Node& n) {
  std::vector<Tensor> out;
  out.reserve(n.saved.size());
  for (std::size_t i = 0; i < n.saved.size(); ++i) {
    const Node::Saved& s = n.saved[i];
    if (s.tensor.defined() && s.tensor.version() != s.version)
      throw std::logic_error("backward of '" + n.op + "': saved tensor " + std::to_string(i) +
                             " " + s.tensor.repr() +
                             " was written in place after the op saved it (version " +
                             std::to_string(s.version) + ", now " +
                             std::to_string(s.tensor.version()) +
                             "); write into a copy (clone()) instead");
    out.push_back(s.tensor);
  }
  return out;
}

void Variable::backward(const Tensor& grad_output, const BackwardOptions& options) const {
  if (!node_) throw_undefined("backward()");
  if (!node_->requires_grad)
    throw std::invalid_argument("backward(): the output does not require a gradient (no input "
                                "requires one, or it was computed under NoGradGuard)");
  if (grad_output.shape() != data_.shape())
    throw std::invalid_argument("backward(): upstream gradient " + shape_str(grad_output.shape()) +
                                " does not match output " + shape_str(data_.shape()));

  // Topological order by an iterative post-order DFS (deep graphs must not
  // overflow the stack), then one reversed loop, as in micrograd. `order`
  // owns the nodes: releasing a node's edges must not free one still to run.
  std::vector<std::shared_ptr<Node>> order;
  const std::uint64_t walk = ++g_walks;
  auto check_live = [](const Node& n) {
    if (n.released)
      throw std::logic_error("backward(): the graph through '" + n.op +
                             "' was freed by an earlier backward; pass {.retain_graph = true} "
                             "to that backward to run another");
  };
  {
    check_live(*node_);
    std::vector<std::pair<const std::shared_ptr<Node>*, std::size_t>> stack{{&node_, 0}};
    node_->walk = walk;
    while (!stack.empty()) {
      auto& [n, next] = stack.back();
      const std::vector<std::shared_ptr<Node>>& ins = (*n)->inputs;
      if (next < ins.size()) {
        const std::shared_ptr<Node>& child = ins[next++];
        if (child->requires_grad && child->walk != walk) {
          child->walk = walk;
          check_live(*child);
          stack.push_back({&child, 0});
        }
      } else {
        (*n)->slot = order.size();
        order.push_back(*n);
        stack.pop_back();
      }
    }
  }

  // Gradients wait here until the pass is done: a backward that throws
  // changes no leaf's gradient.
  std::vector<Tensor> pending(order.size());
  // owned[i]: pending[i] is a sum the engine made (accumulate, add_to_slice)
  const std::unique_ptr<bool[]> owned = std::make_unique<bool[]>(order.size());
  pending[node_->slot] = grad_output.to(data_.dtype());
  {
    NoGradGuard no_grad;  // backward closures record no graph
    // One context for every node: its vectors (and the input shapes' buffers)
    // keep their capacity from node to node instead of being allocated anew.
    BackwardContext ctx;
    for (std::size_t i = order.size(); i-- > 0;) {
      Node& n = *order[i];
      if (!n.is_op) continue;  // a leaf: its gradient is committed below
      const Tensor g = std::move(pending[i]);  // a non-leaf's gradient is not kept (as in PyTorch)
      pending[i] = Tensor();
      if (g.defined() && n.slice_of_input) {
        const Node& in = *n.inputs[0];
        if (in.requires_grad)
          add_to_slice(pending[in.slot], owned[in.slot], in.shape, n.slice_of_input->dim, n.slice_of_input->start, g);
      } else if (g.defined()) {
        ctx.saved = unpack_saved(n);
        const std::size_t n_in = n.inputs.size();
        ctx.needs_input_grad.resize(n_in);
        ctx.input_shapes.resize(n_in);
        for (std::size_t k = 0; k < n_in; ++k) {
          ctx.needs_input_grad[k] = n.inputs[k]->requires_grad;
          ctx.input_shapes[k] = n.inputs[k]->shape;  // copy-assign: reuses the buffer
        }
        const std::vector<Tensor> grads = n.backward(g, ctx);
        ctx.saved.clear();  // the saved tensors die with the node, not with the next one
        if (grads.size() != n.inputs.size())
          throw std::logic_error("backward of '" + n.op + "' returned " +
                                 std::to_string(grads.size()) + " gradients for " +
                                 std::to_string(n.inputs.size()) + " inputs");
        for (std::size_t k = 0; k < grads.size(); ++k) {
          const Node& in = *n.inputs[k];
          if (!grads[k].defined() || !in.requires_grad) continue;
          if (grads[k].shape() != in.shape || grads[k].dtype() != in.dtype)
            throw std::logic_error("backward of '" + n.op + "': gradient " + std::to_string(k) +
                                   " is " + grads[k].repr() + ", its input is " +
                                   std::string(dtype_name(in.dtype)) + " " + shape_str(in.shape));
          accumulate(pending[in.slot], owned[in.slot], grads[k]);
        }
      }
      if (!options.retain_graph) n.release();
    }
  }

  // Commit: new leaf gradients are built first, then swapped in.
  std::vector<std::pair<Node*, Tensor>> updates;
  for (std::size_t i = 0; i < order.size(); ++i) {
    Node& n = *order[i];
    if (n.is_op || !pending[i].defined()) continue;
    Tensor total = n.grad.defined() ? kernels::binary(kernels::BinaryOp::add, n.grad, pending[i])
                                    : pending[i].contiguous();
    updates.emplace_back(&n, std::move(total));
  }
  for (auto& [n, g] : updates) n->grad = std::move(g);
}

// ---------------------------------------------------------------- custom ops

Variable custom_op(const std::string& name, std::vector<Variable> inputs, CustomForward forward,
                   CustomBackward backward) {
  CustomOpContext ctx;
  std::vector<Tensor> values;
  values.reserve(inputs.size());
  for (const auto& in : inputs) {
    values.push_back(in.data());
    ctx.needs_input_grad.push_back(in.requires_grad() && grad_enabled());
  }
  Tensor out;
  {
    NoGradGuard no_grad;  // a forward that calls ops internally records no graph
    out = forward(ctx, values);
  }
  if (!out.defined()) throw std::logic_error("custom op '" + name + "': forward returned nothing");
  // The engine keeps ctx.saved (and frees it with the graph); the closure keeps the rest.
  std::vector<Tensor> saved = std::move(ctx.saved);
  ctx.saved.clear();
  return Variable::from_op(name, std::move(out), inputs, std::move(saved),
                           [ctx = std::move(ctx), backward = std::move(backward)](
                               const Tensor& g, const BackwardContext& b) {
                             CustomOpContext call = ctx;
                             call.saved = b.saved;
                             return backward(call, g);
                           });
}

// ---------------------------------------------------------------- checkpoint

namespace {

// Grad mode on while alive, whatever it was (the engine runs backward closures
// under NoGradGuard; a recompute must record).
class RecordGuard {
 public:
  RecordGuard() : previous_(t_grad_enabled) { t_grad_enabled = true; }
  ~RecordGuard() { t_grad_enabled = previous_; }
  RecordGuard(const RecordGuard&) = delete;
  RecordGuard& operator=(const RecordGuard&) = delete;

 private:
  bool previous_;
};

// fn's output, refused by name when it gives none.
Variable run_checkpointed(const std::string& name, const CheckpointFn& fn, const std::vector<Variable>& inputs) {
  Variable out = fn(inputs);
  if (!out.defined()) throw std::logic_error("checkpoint '" + name + "': fn returned an undefined Variable");
  return out;
}

}  // namespace

Variable checkpoint(const std::string& name, std::vector<Variable> inputs, CheckpointFn fn) {
  std::vector<Tensor> values;
  values.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined())
      throw std::invalid_argument("checkpoint '" + name + "': input " + std::to_string(i) + " is undefined");
    values.push_back(inputs[i].data());
  }
  Tensor out;
  {
    NoGradGuard no_grad;  // fn's intermediates die here: nothing saves them
    std::vector<Variable> constants(values.begin(), values.end());
    out = run_checkpointed(name, fn, constants).data();
  }
  return Variable::from_op(
      name, std::move(out), inputs, std::move(values),
      [name, fn = std::move(fn)](const Tensor& g, const BackwardContext& ctx) {
        RecordGuard record;
        std::vector<Variable> leaves;
        leaves.reserve(ctx.saved.size());
        for (std::size_t i = 0; i < ctx.saved.size(); ++i)
          leaves.emplace_back(ctx.saved[i], static_cast<bool>(ctx.needs_input_grad[i]));
        std::vector<Tensor> grads(leaves.size());
        const Variable y = run_checkpointed(name, fn, leaves);
        if (!y.requires_grad()) return grads;  // fn ignored every input that needs a gradient
        if (y.shape() != g.shape() || y.dtype() != g.dtype())
          throw std::logic_error("checkpoint '" + name + "': fn gave " + y.data().repr() + " on recompute, " +
                                 std::string(dtype_name(g.dtype())) + " " + shape_str(g.shape()) +
                                 " in the forward: fn must compute the same thing both times");
        y.backward(g);
        for (std::size_t i = 0; i < leaves.size(); ++i) grads[i] = leaves[i].grad();
        return grads;
      });
}

}  // namespace headgrad

