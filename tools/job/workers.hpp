// Running a list of cases, serially or in -j forked workers that send each
// result back in the JSON report's form.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "judge/run_case.hpp"

namespace headgrad::runner {

// The default for -j: 1 on one core, for fewer than 4 cases, or without
// isolation; else as many cases as the cores hold at `threads` threads each
// (HEADGRAD_NUM_THREADS, else 1: suite cases are small and gain more from
// running side by side than from threads), never more than the cases.
std::size_t default_jobs(std::size_t cases, bool isolate);
// Threads for each case's plugins at `jobs` cases at once: so that jobs x threads <= cores.
int threads_per_case(std::size_t jobs);

// Each case through `check` (in suite order), on_case_start and on_case_done
// called as run_suite calls them (on_case_done always in suite order). With
// options.jobs > 1, options.jobs worker processes are forked once and fed case
// after case; each result comes back as the JSON report holds it
// (case_report_json, exact, as CBOR), so what a report shows is the same
// either way; tensors do not come back (keep_tensors runs serially). A worker
// that dies gives its case an error and is replaced; what a check throws is
// rethrown once the cases before it are reported.
// check gets `options`, in a worker without its callbacks (the parent's).
using CaseCheck = std::function<CaseResult(const CaseSpec&, const RunOptions&)>;
std::vector<CaseResult> run_cases(const std::vector<const CaseSpec*>& cases, const CaseCheck& check,
                                  const RunOptions& options);

}  // namespace headgrad::runner
