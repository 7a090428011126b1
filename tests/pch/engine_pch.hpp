// The precompiled header of test_engine (tests/meson.build): what most of its
// files include, compiled once for all of them (meson compiles it as its own
// file: no include guard).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "headgrad/attention.hpp"
#include "headgrad/gradcheck.hpp"
#include "headgrad/loader.hpp"
#include "headgrad/ops.hpp"
