// The precompiled header of test_tools (tests/meson.build): what most of its
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
#include <nlohmann/json.hpp>

#include "analysis/analyze.hpp"
#include "case/inputs.hpp"
#include "headgrad/loader.hpp"
#include "headgrad/ops.hpp"
#include "job/run_suite.hpp"
#include "judge/run_case.hpp"
#include "report/report.hpp"
