#!/usr/bin/env bash
# Runs one libFuzzer target on a copy of its seed corpus, so that the inputs
# it finds land in a scratch folder and never in the committed corpus.
# Usage: run_fuzzer.sh FUZZER SEED_DIR [libFuzzer flags...]
# A finding (crash, sanitizer report, leak, timeout, out-of-memory) makes the
# fuzzer exit non-zero; its reproducer is kept where -artifact_prefix says
# (meson test: build-san/tests/fuzz/fuzz_<name>-crash-*, -leak-*, -timeout-*, -oom-*).
set -euo pipefail
fuzzer="$1"
seeds="$2"
shift 2
scratch="$(mktemp -d "${TMPDIR:-/tmp}/headgrad-fuzz.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
# libFuzzer's own exit code for a finding is 77, which meson reads as
# "skipped": any failure is exit 1 here.
status=0
"$fuzzer" "$@" "$scratch" "$seeds" || status=$?
if (( status != 0 )); then
  echo "run_fuzzer: $(basename "$fuzzer") exited $status: a finding (its input is named above)" >&2
  exit 1
fi
