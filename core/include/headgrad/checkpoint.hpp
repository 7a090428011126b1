// Recompute instead of keeping (gradient checkpointing, like
// torch.utils.checkpoint): trades one more forward of fn for fn's
// intermediates not being held from the forward to the backward.
//
//   Variable o = checkpoint("head", {q, k, v}, [&](const std::vector<Variable>& in) {
//     return matmul(softmax(matmul(in[0], transpose(in[1], -2, -1)), -1), in[2]); });
//
// The forward runs fn without recording a graph, so none of fn's
// intermediates outlive it: the node saves only its inputs' values. Its
// backward runs fn again on those values, this time recording, and
// backpropagates the output's gradient through that graph, which is freed
// when the node's backward returns. So fn's intermediates are alive during
// one checkpoint's backward at a time. fn must compute the same values both
// times (the engine's ops do: grad mode changes what they save, not what they
// compute), so the gradients are those of fn's ops without checkpoint, bit for
// bit. Every input must be defined; a recompute of another shape or dtype is a
// std::logic_error naming the checkpoint.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "headgrad/variable.hpp"

namespace headgrad {

using CheckpointFn = std::function<Variable(const std::vector<Variable>&)>;
Variable checkpoint(const std::string& name, std::vector<Variable> inputs, CheckpointFn fn);

}  // namespace headgrad
