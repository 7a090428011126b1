#!/bin/sh
# The HTML report in a browser: run the headgrad program on configs/mutants.yaml
# with --html, open the page in headless Chromium and check a screenshot is
# written. Without Debian's chromium (tools/install-deps --with-chromium) the
# test is skipped (exit 77) and says so. What the page holds (self-contained,
# a heatmap per case, every diagnosis named) is checked on the same suite's
# run in runner_analysis (MutantsSuiteCli), which needs no browser.
#
#   test_html_report.sh HEADGRAD_EXE SUITE_YAML
set -eu
exe=$1
suite=$2

if ! command -v chromium >/dev/null 2>&1; then
  echo "chromium not installed (tools/install-deps --with-chromium): the browser check is skipped"
  exit 77
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
html=$work/mutants.html

fail() { echo "FAIL: $*" >&2; exit 1; }

rc=0; "$exe" run "$suite" --html "$html" -q >"$work/stdout" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { cat "$work/stdout"; fail "headgrad run exited $rc"; }
[ -s "$html" ] || fail "no report written to $html"
echo "report: $(wc -c <"$html") bytes"

png=$work/report.png
profile=$(mktemp -d "$work/profile.XXXXXX")
rc=0; timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --screenshot="$png" --window-size=1400,2000 "file://$html" \
  >"$work/chromium.log" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { tail -20 "$work/chromium.log"; fail "chromium exited $rc"; }
[ -f "$png" ] || { tail -20 "$work/chromium.log"; fail "chromium wrote no screenshot"; }
size=$(wc -c <"$png")
[ "$size" -gt 20000 ] || fail "screenshot is only $size bytes"
echo "chromium: screenshot $size bytes"
echo "OK"
