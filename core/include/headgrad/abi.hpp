// The build description every C++ plugin exports, and what the loader checks
// in it before it calls any C++ code of the plugin.
//
// A C++ plugin and headgrad exchange std::string, std::shared_ptr,
// std::vector, std::map, std::function, exceptions and the SDK's own structs
// by value. That only works when both sides were compiled with the same
// compiler ABI, the same standard library (and its dual ABI: libstdc++'s
// _GLIBCXX_USE_CXX11_ABI), the same C++ standard and the same SDK headers.
// HEADGRAD_PLUGIN (<headgrad/plugin.hpp>) compiles this description into the
// plugin, from the plugin's own compiler settings; the loader compares it with
// the one compiled into headgrad, field by field, and rejects a plugin that
// differs, naming the field ("built with _GLIBCXX_USE_CXX11_ABI=0, headgrad
// uses 1"). The description itself is plain C: fixed-width fields, only ever
// appended to, read through a C function.
#pragma once

#include <cstdint>

#include "headgrad/version.h"

// Bumped whenever a type of the SDK changes layout or meaning (the layout
// table below catches a size change; tests/test_abi_layout.cpp pins the sizes
// and offsets so that a change cannot go unnoticed). 5: MhaWeights' biases
// and Capabilities::bias. 6: windows, soft-capping, sinks, QK-norm and
// cross-attention (AttentionSpec, MhaWeights' gains, five capabilities).
// 7: Shape is a small vector (6 dims inline), so Tensor changed layout.
#define HEADGRAD_PLUGIN_ABI_VERSION 7

#define HEADGRAD_BUILD_INFO_MAGIC 0x49424748u  // "HGBI"

extern "C" {

// One type that crosses the boundary, as the including translation unit sees it.
struct headgrad_type_layout {
  const char* name;  // "PluginInfo", "std::string", ...
  std::uint32_t size;
  std::uint32_t align;
};

// Values of headgrad_build_info::stdlib.
#define HEADGRAD_STDLIB_OTHER 0u
#define HEADGRAD_STDLIB_LIBSTDCXX 1u
#define HEADGRAD_STDLIB_LIBCXX 2u

// Bits of headgrad_build_info::features.
#define HEADGRAD_FEATURE_EXCEPTIONS 0x1u  // -fexceptions (the SDK throws across the boundary)
#define HEADGRAD_FEATURE_RTTI 0x2u        // -frtti (exceptions and std::function need typeinfo)
#define HEADGRAD_FEATURE_STDLIB_DEBUG 0x4u  // _GLIBCXX_DEBUG (changes the std containers' layout)

struct headgrad_build_info {
  std::uint32_t magic;        // HEADGRAD_BUILD_INFO_MAGIC
  std::uint32_t info_size;    // sizeof(headgrad_build_info) where it was compiled
  std::uint32_t abi_version;  // HEADGRAD_PLUGIN_ABI_VERSION
  std::uint32_t stdlib;       // HEADGRAD_STDLIB_*
  std::uint64_t stdlib_version;  // __GLIBCXX__ (a date) or _LIBCPP_VERSION
  std::int32_t cxx11_abi;     // _GLIBCXX_USE_CXX11_ABI; -1 without libstdc++
  std::uint32_t features;     // HEADGRAD_FEATURE_*
  std::int64_t cplusplus;     // __cplusplus
  const char* headgrad_version;  // the SDK's version, "0.1.0"
  const char* compiler;          // "gcc 12.2.0", "clang 16.0.6"
  std::uint32_t layout_count;
  const headgrad_type_layout* layout;  // [layout_count]
};

}  // extern "C"

// The exported function that returns the description (a plain C function:
// calling it needs no agreement on any C++ type).
#define HEADGRAD_BUILD_INFO_SYMBOL "headgrad_plugin_build"

#define HEADGRAD_ABI_STR2(x) #x
#define HEADGRAD_ABI_STR(x) HEADGRAD_ABI_STR2(x)

#if defined(__clang__)
#define HEADGRAD_COMPILER_ID \
  "clang " HEADGRAD_ABI_STR(__clang_major__) "." HEADGRAD_ABI_STR(__clang_minor__) "." HEADGRAD_ABI_STR(__clang_patchlevel__)
#elif defined(__GNUC__)
#define HEADGRAD_COMPILER_ID \
  "gcc " HEADGRAD_ABI_STR(__GNUC__) "." HEADGRAD_ABI_STR(__GNUC_MINOR__) "." HEADGRAD_ABI_STR(__GNUC_PATCHLEVEL__)
#else
#define HEADGRAD_COMPILER_ID "unknown compiler"
#endif

#if defined(_LIBCPP_VERSION)
#define HEADGRAD_STDLIB_ID HEADGRAD_STDLIB_LIBCXX
#define HEADGRAD_STDLIB_VERSION_ID _LIBCPP_VERSION
#elif defined(__GLIBCXX__)
#define HEADGRAD_STDLIB_ID HEADGRAD_STDLIB_LIBSTDCXX
#define HEADGRAD_STDLIB_VERSION_ID __GLIBCXX__
#else
#define HEADGRAD_STDLIB_ID HEADGRAD_STDLIB_OTHER
#define HEADGRAD_STDLIB_VERSION_ID 0
#endif

#if defined(_GLIBCXX_USE_CXX11_ABI)
#define HEADGRAD_CXX11_ABI_ID _GLIBCXX_USE_CXX11_ABI
#else
#define HEADGRAD_CXX11_ABI_ID (-1)
#endif

#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
#define HEADGRAD_FEATURE_EXCEPTIONS_ID HEADGRAD_FEATURE_EXCEPTIONS
#else
#define HEADGRAD_FEATURE_EXCEPTIONS_ID 0u
#endif
#if defined(__cpp_rtti) || defined(__GXX_RTTI)
#define HEADGRAD_FEATURE_RTTI_ID HEADGRAD_FEATURE_RTTI
#else
#define HEADGRAD_FEATURE_RTTI_ID 0u
#endif
#if defined(_GLIBCXX_DEBUG)
#define HEADGRAD_FEATURE_DEBUG_ID HEADGRAD_FEATURE_STDLIB_DEBUG
#else
#define HEADGRAD_FEATURE_DEBUG_ID 0u
#endif

// The types whose layout both sides must agree on: the SDK's structs and
// classes passed or returned by value or through a pointer, and the standard
// library types inside them. X(name, type...) for each.
#define HEADGRAD_ABI_TYPES(X)                               \
  X("PluginInfo", ::headgrad::PluginInfo)                   \
  X("Capabilities", ::headgrad::Capabilities)               \
  X("Attention", ::headgrad::Attention)                     \
  X("UnsupportedError", ::headgrad::UnsupportedError)       \
  X("AttentionSpec", ::headgrad::AttentionSpec)             \
  X("RopeSpec", ::headgrad::RopeSpec)                       \
  X("WindowSpec", ::headgrad::WindowSpec)                   \
  X("QkNormSpec", ::headgrad::QkNormSpec)                   \
  X("MhaWeights", ::headgrad::MhaWeights)                   \
  X("Tensor", ::headgrad::Tensor)                           \
  X("Storage", ::headgrad::Storage)                         \
  X("Variable", ::headgrad::Variable)                       \
  X("CustomOpContext", ::headgrad::CustomOpContext)         \
  X("Generator", ::headgrad::Generator)                     \
  X("MemoryStats", ::headgrad::MemoryStats)                 \
  X("DType", ::headgrad::DType)                             \
  X("Shape", ::headgrad::Shape)                             \
  X("std::string", ::std::string)                           \
  X("std::vector", ::std::vector<std::int64_t>)             \
  X("std::shared_ptr", ::std::shared_ptr<int>)              \
  X("std::map", ::std::map<std::string, double>)            \
  X("std::function", ::std::function<void()>)               \
  X("std::optional", ::std::optional<double>)               \
  X("std::exception_ptr", ::std::exception_ptr)

#define HEADGRAD_ABI_LAYOUT_ROW(name, ...) {name, sizeof(__VA_ARGS__), alignof(__VA_ARGS__)},

// Defines `var` (a headgrad_build_info with internal linkage) describing the
// translation unit it is expanded in. Expanded once inside HEADGRAD_PLUGIN and
// once inside headgrad's loader, so each side describes its own build.
#define HEADGRAD_DEFINE_BUILD_INFO(var)                                           \
  static const ::headgrad_type_layout var##_layout[] = {                          \
      HEADGRAD_ABI_TYPES(HEADGRAD_ABI_LAYOUT_ROW)};                               \
  static const ::headgrad_build_info var = {                                      \
      HEADGRAD_BUILD_INFO_MAGIC,                                                  \
      sizeof(::headgrad_build_info),                                              \
      HEADGRAD_PLUGIN_ABI_VERSION,                                                \
      HEADGRAD_STDLIB_ID,                                                         \
      static_cast<std::uint64_t>(HEADGRAD_STDLIB_VERSION_ID),                     \
      HEADGRAD_CXX11_ABI_ID,                                                      \
      HEADGRAD_FEATURE_EXCEPTIONS_ID | HEADGRAD_FEATURE_RTTI_ID |                 \
          HEADGRAD_FEATURE_DEBUG_ID,                                              \
      static_cast<std::int64_t>(__cplusplus),                                     \
      HEADGRAD_VERSION_STRING,                                                    \
      HEADGRAD_COMPILER_ID,                                                       \
      static_cast<std::uint32_t>(sizeof(var##_layout) / sizeof(var##_layout[0])), \
      var##_layout}
