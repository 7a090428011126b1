// Memory budget: what a case needs, estimated from its dims before anything
// is allocated, against what the machine has (or --max-memory).
//
//   const double need = attention_bytes({.mha = true, .B = 2, .H = 2, .Tq = 3, .Tk = 3, .d = 4, .D = 8}, 8);
//   if (need > memory_budget(std::nullopt).bytes) ...   // refuse the case
//
// The figures are in double on purpose: a product of dims that overflows
// int64 is still a (huge) number here, and is refused as too large.
//
// Shape legend: B batch, H (query) heads, Hkv key/value heads, Tq/Tk query/key lengths (T = Tq = Tk at mha
// level), d head width, D model width.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace headgrad::runner {

struct AttentionDims {
  bool mha = true;
  double B = 0, H = 0, Tq = 0, Tk = 0, d = 0, D = 0;
  double Hkv = 0;             // key/value heads; 0 means H
  bool score_buffers = true;  // false: a fused plugin's working set (no [B, H, Tq, Tk] buffers)
  // true: one head's [B, Tq, Tk] buffers alive at a time, not every head's
  // (per_head, the oracle, runs each head under checkpoint)
  bool one_head_at_a_time = false;
};

// per_head runs its heads under checkpoint (one head's [Tq, Tk] buffers at a
// time) when every head's together would take more than this many bytes
// (plugins/per_head/per_head.cpp, kRecomputeAboveBytes: the two must agree).
inline constexpr double kOracleRecomputeAboveBytes = 256.0 * 1024 * 1024;

// Peak bytes of one case, simply and on the safe side: the shared inputs
// (held by the runner), one side's working set (the leaves' gradients, the
// projections and their gradients, and the [B, H, Tq, Tk] score and
// probability buffers and their gradients that a non-fused plugin holds), and
// both sides' results (out and every gradient, plus the wire copy).
double attention_bytes(const AttentionDims& dims, double element_size);

struct MemoryBudget {
  double bytes = 0;
  std::string source;  // "--max-memory 4G", "physical memory"
};
// `max_memory` when given, else the machine's physical memory (sysconf), or
// the address-space limit (RLIMIT_AS) when that is lower.
MemoryBudget memory_budget(const std::optional<double>& max_memory);

// "4G", "512M", "1.5GiB", "100000" (bytes); K/M/G/T are powers of 1024.
// Throws std::invalid_argument naming the text for anything else (or <= 0).
double parse_size(std::string_view text);
// "13.4 GiB", "512 MiB", "7.4e+19 bytes" beyond EiB.
std::string format_bytes(double bytes);

}  // namespace headgrad::runner
