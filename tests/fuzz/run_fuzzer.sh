#!/usr/bin/env bash
# Runs one libFuzzer target on a copy of its seed corpus, so that the inputs
# it finds land in a scratch folder and never in the committed corpus.
# Usage: run_fuzzer.sh FUZZER SEED_DIR [libFuzzer flags...]
# A finding (crash, sanitizer report, leak, timeout, out-of-memory) makes the
# fuzzer exit non-zero; its reproducer is kept as crash-*/leak-*/timeout-*/oom-*
# in the current folder (meson test: the build folder).
set -euo pipefail
fuzzer="$1"
seeds="$2"
shift 2
scratch="$(mktemp -d "${TMPDIR:-/tmp}/headgrad-fuzz.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
status=0
"$fuzzer" "$@" "$scratch" "$seeds" || status=$?
exit "$status"
