// forks: computes a correct result, but first forks a process that lives on
// (60 s) holding every file the side had open, the result pipe included. The
// runner must take the side's result when it is complete, not wait for the
// pipe to close, and kill the grandchild with the side's process group.
// HEADGRAD_TEST_GRANDCHILD_FILE, when set, names a file the grandchild's pid
// is written to (for the test to check it is gone).
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "common.hpp"

namespace runner_forks {

using namespace runner_test;

void fork_a_lingering_grandchild() {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::sleep(60);
    ::_exit(0);
  }
  if (const char* file = std::getenv("HEADGRAD_TEST_GRANDCHILD_FILE"); file && pid > 0) std::ofstream(file) << pid;
}

class Forks final : public Attention {
 public:
  PluginInfo info() const override { return test_info("forks", "test plugin: leaves a grandchild holding the pipe"); }
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    fork_a_lingering_grandchild();
    return good_mha(x, w, spec);
  }
  Variable core_forward(const Variable& q, const Variable& k, const Variable& v,
                        const AttentionSpec& spec) const override {
    fork_a_lingering_grandchild();
    return attention_core(q, k, v, spec);
  }
};

HEADGRAD_TEST_PLUGIN(forks, Forks)

}  // namespace runner_forks
