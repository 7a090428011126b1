// What the analysis's files share and nothing outside tools/analysis uses:
// the localization variants as run (the diagnosis confirms its hypotheses on
// them) and the steps check_case runs in order.
#pragma once

#include <string>
#include <vector>

#include <headgrad/loader.hpp>

#include "case/findings.hpp"
#include "case/inputs.hpp"
#include "judge/run_case.hpp"

namespace headgrad::analysis {

using runner::CaseInputs;
using runner::CaseResult;
using runner::CaseSpec;
using runner::Diagnosis;
using runner::Localization;
using runner::RunOptions;

// What a localization variant changes. The table (probe_info) holds each
// one's name in reports ("B", "Tq!=Tk": Localization::depends_on) and words.
enum class Probe { B, T, H, H_at_D, Tq_ne_Tk, Tq, Tq_gt_Tk, T_both, d, mask, causal, G, Hkv, rope, r, positions, bias,
                   qk_norm, window, softcap, sinks, key_tile };
struct ProbeInfo {
  Probe probe;
  std::string_view dim;    // the name reports use
  std::string_view words;  // "the batch size": what the failure depends on or not
  std::string_view needs;  // what the failure needs when the variant that takes it away passes
  bool counts = true;      // read for dependence (H@D and Tq>Tk only inform the table)
};
const ProbeInfo& probe_info(Probe p);

struct Variant {
  Probe probe;
  std::string change;    // "B = 1": as the table and the sentences show it
  bool removes = false;  // takes away something a bug may need (a dim at 1, Tq = Tk, the mask): passing there is dependence
  CaseSpec spec;
  std::string_view dim() const { return probe_info(probe).dim; }
};


// One variant as run: its result (tensors kept) and the inputs its sides got.
struct VariantRun {
  Variant variant;
  CaseResult result;
  CaseInputs inputs;
  std::string error;  // the variant could not run: why
};

// Max |a - b| per slot of one dim of a [.., n, ..] tensor (dim < 0: from the end),
// or per block of `block` columns along the last dim when block > 0.
std::vector<double> slot_max(const Tensor& a, const Tensor& b, std::int64_t dim, std::int64_t block);

// %.2g-style: "0.5", "1.2e+03".
std::string fmt_g(double v);

// Every variant of c run as a case (tensors kept); one that cannot run holds its error.
std::vector<VariantRun> run_variants(const CaseSpec& c, const PluginRegistry& registry, const RunOptions& options);
// The localization of `failed` from its variants' runs (none for a reference case).
Localization localize_from(const CaseResult& failed, const std::vector<VariantRun>& runs);
// Keeps the hypotheses that also reproduce their side at every variant that ran.
void confirm_with_variants(Diagnosis& dx, const std::vector<VariantRun>& runs);
// Grouped kv at the MHA level: re-runs each failing plugin with its query heads in tile order.
void rerun_under_tile_permutation(Diagnosis& dx, const CaseResult& failed, const CaseInputs& in,
                                  const PluginRegistry& registry, const RunOptions& options);
// dx.sentence from its fits (best first), findings, ruled_out, near and evidence.
void write_verdict(Diagnosis& dx);
// What tells RoPE bugs apart, read off the failing case itself.
std::vector<std::string> rope_clues(const CaseResult& failed, const CaseInputs& in);

}  // namespace headgrad::analysis
