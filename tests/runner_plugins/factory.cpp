// The factory every library of this folder's unit exports (../plugins/one_unit.hpp).
#include "common.hpp"

HEADGRAD_TEST_PLUGIN_FACTORY()
