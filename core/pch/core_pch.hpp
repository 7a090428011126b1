// The precompiled header of libheadgrad (core/meson.build): the standard
// headers most of its files include and the public headers of its ops,
// compiled once for the library's 28 files instead of in each (a release
// build's core: 78 -> 66 CPU s, plus 4 for this header). Meson compiles it
// as its own file (no include guard) and puts it first in every file of the
// library. Not kernels.hpp: half_convert.cpp has a function of that name.

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "headgrad/ops.hpp"
#include "headgrad/parallel.hpp"
