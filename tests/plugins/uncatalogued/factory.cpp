// The factory every u_<name> library exports (../one_unit.hpp).
#include "common.hpp"

HEADGRAD_TEST_PLUGIN_FACTORY()
