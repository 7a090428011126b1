// segfaults: writes through a null pointer (the volatile keeps the compiler
// from reasoning the store away). The runner must survive and say SIGSEGV.
// Not instrumented: in a sanitizer build UBSan would stop at the null store
// (a report and exit 1) before the fault that this plugin exists to make.
#include "common.hpp"

namespace runner_segfaults {

using namespace runner_test;

[[noreturn]] __attribute__((no_sanitize("address", "undefined"))) void crash() {
  volatile int* volatile p = nullptr;  // a volatile store: never elided
  *p = 42;
  __builtin_trap();  // not reached: the store above faults
}

class Segfaults final : public Attention {
 public:
  PluginInfo info() const override { return test_info("segfaults", "test plugin: writes through a null pointer"); }
  Variable mha_forward(const Variable&, const MhaWeights&, const AttentionSpec&) const override { crash(); }
  Variable core_forward(const Variable&, const Variable&, const Variable&, const AttentionSpec&) const override {
    crash();
  }
};

HEADGRAD_TEST_PLUGIN(segfaults, Segfaults)

}  // namespace runner_segfaults
