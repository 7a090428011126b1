// Defaults of the plugin interface: a level a plugin does not implement.
#include "headgrad/plugin.hpp"

namespace headgrad {

Variable Attention::mha_forward(const Variable&, const MhaWeights&, const AttentionSpec&) const {
  throw UnsupportedError("plugin '" + info().name + "' does not implement the mha level");
}

Variable Attention::core_forward(const Variable&, const Variable&, const Variable&,
                                 const AttentionSpec&) const {
  throw UnsupportedError("plugin '" + info().name + "' does not implement the core level");
}

Variable Attention::rope_forward(const Variable&, const RopeSpec&) const {
  throw UnsupportedError("plugin '" + info().name + "' does not implement the rope level");
}

}  // namespace headgrad
