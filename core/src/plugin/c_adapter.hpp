// The C ABI adapter (internal to core): turns a C plugin's descriptor
// (<headgrad/c_plugin.h>) into an Attention with the core level only.
#pragma once

#include <memory>

#include "headgrad/c_plugin.h"
#include "headgrad/plugin.hpp"

namespace headgrad::detail {

// Checks the descriptor and copies its strings; throws std::invalid_argument
// saying what is wrong with it. `library` is held by the Attention and by every
// graph node its core_forward records, so the C code stays loaded while any
// backward may still call it. `abi_version` is what the plugin's
// headgrad_c_abi_version() returned: capability bits added after it are not read.
std::shared_ptr<Attention> make_c_attention(const hg_c_plugin* desc,
                                            std::shared_ptr<const void> library,
                                            int abi_version = HEADGRAD_C_ABI_VERSION);

}  // namespace headgrad::detail
