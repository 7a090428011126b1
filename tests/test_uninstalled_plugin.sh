#!/usr/bin/env bash
# End to end from the build tree, as a user who never installed headgrad: the
# built program's `new-plugin` prints steps; run exactly those steps (with a
# decoy "installed" headgrad.pc first on PKG_CONFIG_PATH, which they must not
# pick) and the generated plugin builds against this build and passes its
# suite. Then write each edge-case bug into the plugin's source, one at a time,
# and check that the generated suite fails it and names it:
#   mask_fill_finite            -INFINITY -> -1e4 in the masked fill
#   softmax_no_max_subtraction  softmax -> exp / sum(exp)
#   mask_ignored                the spec's mask dropped before attention_mask
#   causal_alignment            the causal mask aligned bottom-right
# Between the two: features.yaml is refused (exit 2, naming the capability)
# while the plugin declares none of its features, and its window section
# passes once the plugin declares c.window (its core already applies it).
#
#   test_uninstalled_plugin.sh HEADGRAD_EXE SOURCE_ROOT   (build/tools/headgrad, the repository)
set -euo pipefail

headgrad=$1 source_root=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/headgrad_uninstalled.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
unset HEADGRAD_PLUGIN_PATH
export NO_COLOR=1

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

echo "--- another headgrad.pc first on PKG_CONFIG_PATH: the steps must not use it"
mkdir -p "$tmp/decoy"
cat >"$tmp/decoy/headgrad.pc" <<'EOF'
Name: headgrad
Description: a decoy standing for another installed headgrad
Version: 0.0.1
Cflags: -DHEADGRAD_DECOY_SDK -I/nonexistent/include
Libs: -L/nonexistent/lib -lheadgrad_decoy
EOF
export PKG_CONFIG_PATH=$tmp/decoy

echo "--- new-plugin from the build"
"$headgrad" new-plugin myattn "$tmp/myattn" >"$tmp/new.log" 2>&1 || { cat "$tmp/new.log"; fail "new-plugin failed"; }
cat "$tmp/new.log"
grep -q "^this headgrad is an uninstalled build" "$tmp/new.log" || fail "new-plugin does not say it runs from a build"

echo "--- the printed steps, as printed"
sed -n '/^next:$/,/^then /p' "$tmp/new.log" | sed -n 's/^  //p' >"$tmp/steps.sh"
[[ $(wc -l <"$tmp/steps.sh") -ge 3 ]] || { cat "$tmp/steps.sh"; fail "no steps printed"; }
code=0
(bash -euo pipefail "$tmp/steps.sh") >"$tmp/steps.log" 2>&1 || code=$?
tail -n 3 "$tmp/steps.log"
[[ $code == 0 ]] || { cat "$tmp/steps.log"; fail "the printed steps exited $code, expected 0"; }
cd "$tmp/myattn"
[[ -f build/myattn.so ]] || fail "no build/myattn.so"
! grep -q HEADGRAD_DECOY_SDK build/build.ninja || fail "the plugin was built against the decoy headgrad.pc"
grep -qF -- "-I$source_root/core/include" build/build.ninja || fail "the plugin was not built with the build's SDK headers"
# the build's own program runs the suite (the last printed step), so it is not
# some other headgrad on PATH that said "passed"
grep -q "^$headgrad run suite.yaml --plugin-path build\$" "$tmp/steps.sh" ||
  { cat "$tmp/steps.sh"; fail "the steps do not run the suite with $headgrad"; }
grep -q "0 failed" "$tmp/steps.log" || fail "the suite's summary is missing"

cp myattn.cpp "$tmp/myattn.cpp.orig"

echo "--- features.yaml: refused while the plugin declares none of its features, a section run once it declares one"
code=0
"$headgrad" run features.yaml --plugin-path build >"$tmp/features_refused.log" 2>&1 || code=$?
[[ $code == 2 ]] || { cat "$tmp/features_refused.log"; fail "features.yaml exited $code for a plugin without its features, expected 2"; }
grep -q "plugin 'myattn' lacks the capability 'window'" "$tmp/features_refused.log" ||
  { cat "$tmp/features_refused.log"; fail "the refusal does not name the missing capability"; }
# the generated core already applies spec.window (attention_mask): declaring it is enough
sed -i 's/    c.float32 = c.float64 = true;/&\n    c.window = true;/' myattn.cpp
grep -qF "c.window = true;" myattn.cpp || fail "the c.window edit did not apply"
ninja -C build >"$tmp/ninja_window.log" 2>&1 || { cat "$tmp/ninja_window.log"; fail "myattn with c.window does not build"; }
code=0
"$headgrad" run features.yaml --plugin-path build --filter 'window*' >"$tmp/features_window.log" 2>&1 || code=$?
[[ $code == 0 ]] || { cat "$tmp/features_window.log"; fail "features.yaml's window section exited $code, expected 0"; }
grep -q "0 failed" "$tmp/features_window.log" || { cat "$tmp/features_window.log"; fail "the window section's summary is missing"; }
# inject BUG SED_EXPRESSION CHECK_LINE
inject() {
  local bug=$1 expr=$2 check=$3
  echo "--- $bug written into myattn.cpp"
  cp "$tmp/myattn.cpp.orig" myattn.cpp
  sed -i "$expr" myattn.cpp
  grep -qF "$check" myattn.cpp || fail "the $bug edit did not apply"
  ninja -C build >"$tmp/ninja_$bug.log" 2>&1 || { cat "$tmp/ninja_$bug.log"; fail "myattn with $bug does not build"; }
  code=0
  "$headgrad" run suite.yaml --plugin-path build >"$tmp/run_$bug.log" 2>&1 || code=$?
  [[ $code == 1 ]] || { cat "$tmp/run_$bug.log"; fail "the suite exited $code with $bug, expected 1"; }
  grep -qi "diagnos.*reproduces $bug" "$tmp/run_$bug.log" ||
    { cat "$tmp/run_$bug.log"; fail "the suite fails myattn with $bug but does not name it"; }
  grep -E "^  FAIL " "$tmp/run_$bug.log" || true
}
inject mask_fill_finite 's/logical_not(attend), -INFINITY)/logical_not(attend), -1e4)/' \
  'logical_not(attend), -1e4)'
inject softmax_no_max_subtraction \
  's/return matmul(softmax(masked, -1), v);/return matmul(div(exp(masked), sum(exp(masked), -1, true)), v);/' \
  'div(exp(masked), sum(exp(masked), -1, true))'
inject mask_ignored \
  's/attention_mask(spec, q.size(-2), k.size(-2))/attention_mask([\&] { AttentionSpec s = spec; s.mask = Tensor(); return s; }(), q.size(-2), k.size(-2))/' \
  's.mask = Tensor();'
inject causal_alignment \
  's/attention_mask(spec, q.size(-2), k.size(-2))/attention_mask([\&] { AttentionSpec s = spec; s.causal_alignment = CausalAlignment::bottom_right; return s; }(), q.size(-2), k.size(-2))/' \
  'CausalAlignment::bottom_right'
echo "--- done: PASS"
