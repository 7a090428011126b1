#!/bin/sh
# The HTML report: run the headgrad program on configs/mutants.yaml
# with --html and check the page is self-contained (no http(s):// reference,
# no <script src=), draws heatmaps (an <svg) in each case's section, and names
# every expected diagnosis as the best fit. If Debian's chromium is installed,
# open the page headless and check a screenshot is written; else skip that step.
#
#   test_html_report.sh HEADGRAD_EXE SUITE_YAML
set -eu
exe=$1
suite=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
html=$work/mutants.html

fail() { echo "FAIL: $*" >&2; exit 1; }

rc=0; "$exe" run "$suite" --html "$html" -q >"$work/stdout" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { cat "$work/stdout"; fail "headgrad run exited $rc"; }
[ -s "$html" ] || fail "no report written to $html"
echo "report: $(wc -c <"$html") bytes"

# Self-contained.
if grep -qiE 'https?://' "$html"; then grep -oiE '.{40}https?://.{40}' "$html" | head -3; fail "the page references an URL"; fi
if grep -qiE '<script[^>]*src' "$html"; then fail "the page loads a script"; fi
if grep -qiE '@import|url\(' "$html"; then fail "the CSS loads something"; fi

# One section per case, each with at least one heatmap.
cases=$(grep -c '^  - name:' "$suite")
[ "$cases" -eq 87 ] || fail "expected 87 cases in $suite, found $cases"
sections=$(grep -c '<section id="case-' "$html")
[ "$sections" -eq "$cases" ] || fail "$sections case sections for $cases cases"
awk '/<section id="case-/{n++; name=$0} /<svg/{svg[n]++}
     END{bad=0; for(i=1;i<=n;i++) if(!svg[i]){print "no <svg> in case section " i; bad=1}; exit bad}' "$html" ||
  fail "a case has no heatmap"
echo "heatmaps: $(grep -c '<svg' "$html") maps in $sections case sections"

# Every expected diagnosis named as the best fit.
for bug in $(sed -n 's/.*diagnosis: *\([a-z_0-9]*\).*/\1/p' "$suite"); do
  grep -q "class=\"diag-best\">$bug<" "$html" || fail "the page does not name diagnosis $bug"
done
echo "diagnoses: all $(sed -n 's/.*diagnosis: *\([a-z_0-9]*\).*/\1/p' "$suite" | wc -l) named"
grep -q 'mutation score' "$html" || fail "no mutation score"

# Headless Chromium, when installed.
if command -v chromium >/dev/null 2>&1; then
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
else
  echo "chromium not installed: headless screenshot step skipped"
fi
echo "OK"
