/* C plugins that go wrong on purpose, one per build (BROKEN_KIND):
 *   1 failing_c: loads, then every forward fails with code 7 and a message
 *   2 wrong C ABI version (the loader must skip it before reading the descriptor)
 *   3 a descriptor without core_forward (the loader must skip it, saying so)
 * Kept apart from tests/c_plugin so that the runner test's --plugin-path there
 * finds only the good plugin.
 */
#include <stdio.h>

#include <headgrad/c_plugin.h>

#if BROKEN_KIND != 3
static int failing_forward(const hg_core_call* call, hg_tensor* out, hg_tensor* stats) {
  (void)out;
  (void)stats;
  snprintf(call->error, call->error_size, "simulated device failure: out of memory (%d x %d)",
           (int)call->q.shape[call->q.ndim - 2], (int)call->k.shape[call->k.ndim - 2]);
  return 7;
}
#endif

#if BROKEN_KIND == 1
static const hg_c_plugin kPlugin = {"failing_c", "0.0.1", "test plugin: every forward fails",
                                    HG_CAP_FLOAT64 | HG_CAP_CROSS_LENGTHS, 0, failing_forward, NULL};
HG_C_EXPORT int headgrad_c_abi_version(void) { return HEADGRAD_C_ABI_VERSION; }
#elif BROKEN_KIND == 2
static const hg_c_plugin kPlugin = {"c_wrong_abi", "0.0.1", "test plugin: a future C ABI",
                                    HG_CAP_FLOAT64, 0, failing_forward, NULL};
HG_C_EXPORT int headgrad_c_abi_version(void) { return HEADGRAD_C_ABI_VERSION + 41; }
#else
static const hg_c_plugin kPlugin = {"c_no_forward", "0.0.1", "test plugin: no core_forward",
                                    HG_CAP_FLOAT64, 0, NULL, NULL};
HG_C_EXPORT int headgrad_c_abi_version(void) { return HEADGRAD_C_ABI_VERSION; }
#endif

HG_C_EXPORT const hg_c_plugin* headgrad_c_plugin(void) { return &kPlugin; }
