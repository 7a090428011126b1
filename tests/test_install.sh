#!/usr/bin/env bash
# End to end, as a user would: install headgrad, write a plugin outside the
# tree from the template, build it against the installed SDK, check it with the
# installed headgrad; then break it (a merge without the transpose) and check
# that the suite fails and names the bug. Every step is required: a missing
# subcommand, plugin or diagnosis fails the test.
#
#   test_install.sh BUILD_ROOT PREFIX BINDIR LIBDIR
#
# The installation is relocatable, so no second build is configured: the
# build is installed with DESTDIR into a scratch folder, moved elsewhere, and
# used from there. That the installed program finds libheadgrad.so ($ORIGIN
# rpath) and its plugins (next to the library), and that headgrad.pc works
# from wherever it lies (${pcfiledir}), is part of what is tested.
set -euo pipefail

build_root=$1 prefix=$2 bindir=$3 libdir=$4
tmp=$(mktemp -d "${TMPDIR:-/tmp}/headgrad_install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
unset HEADGRAD_PLUGIN_PATH
# meson test points LD_LIBRARY_PATH at the build's core; an installed headgrad
# must find its own libheadgrad.so without it.
unset LD_LIBRARY_PATH
export NO_COLOR=1

start=$SECONDS
step_start=$SECONDS
step() {
  echo "--- [$((SECONDS - start))s, previous step $((SECONDS - step_start))s] $*"
  step_start=$SECONDS
}
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
# run LOG CMD...: runs CMD with its output in LOG; prints LOG and fails when CMD fails
run() {
  local log=$1
  shift
  local code=0
  "$@" >"$log" 2>&1 || code=$?
  if [[ $code != 0 ]]; then
    cat "$log"
    fail "$* (exit $code)"
  fi
}

step "install into a staging folder, then move it"
run "$tmp/install.log" env DESTDIR="$tmp/stage" meson install -C "$build_root" --no-rebuild
mv "$tmp/stage$prefix" "$tmp/prefix"
rm -rf "$tmp/stage"
root=$tmp/prefix
headgrad=$root/$bindir/headgrad
pcdir=$root/$libdir/pkgconfig
[[ -x $headgrad ]] || fail "no installed program at $headgrad"
[[ -f $root/$libdir/libheadgrad.so ]] || fail "no libheadgrad.so in $root/$libdir"
[[ -f $pcdir/headgrad.pc ]] || fail "no headgrad.pc in $pcdir"

step "the installed SDK headers are the plugin-facing ones only"
headers=$(cd "$root/include/headgrad" && ls | tr '\n' ' ')
want="abi.hpp attention.hpp blas.hpp c_plugin.h checkpoint.hpp half.hpp kernels.hpp ops.hpp parallel.hpp plugin.hpp shape.hpp tensor.hpp tensor_inl.hpp variable.hpp version.h "
[[ $headers == "$want" ]] || fail "installed headers: '$headers', expected '$want'"

step "the installed program runs from its new place with its own library and plugins"
deps=$(ldd "$headgrad")  # (not piped into grep -q: with pipefail, ldd's SIGPIPE would fail the check)
[[ $deps == *"libheadgrad.so => $root/"* ]] ||
  fail "the installed headgrad does not load the installed libheadgrad.so: $(grep headgrad <<<"$deps")"
run "$tmp/plugins.log" "$headgrad" plugins
for p in per_head batched fused_sdpa; do
  grep -Eq "^$p .*$root/$libdir/headgrad/plugins/$p.so\$" "$tmp/plugins.log" ||
    { cat "$tmp/plugins.log"; fail "the installed headgrad does not list its installed plugin $p"; }
done

step "pkg-config: flags that compile the SDK headers (no spdlog) and link libheadgrad"
export PKG_CONFIG_PATH=$pcdir
cflags=$(pkg-config --cflags headgrad)
libs=$(pkg-config --libs headgrad)
[[ $cflags != *spdlog* && $libs != *spdlog* ]] || fail "headgrad.pc drags spdlog in: $cflags $libs"
[[ $(readlink -f "$(pkg-config --variable=plugindir headgrad)") == "$root/$libdir/headgrad/plugins" ]] ||
  fail "plugindir is $(pkg-config --variable=plugindir headgrad)"
cat >"$tmp/sdk.cpp" <<'EOF'
#include <headgrad/plugin.hpp>
#include <headgrad/kernels.hpp>
#include <headgrad/c_plugin.h>
#ifdef SPDLOG_VERSION
#error "the plugin SDK headers include spdlog"
#endif
namespace {
class Probe final : public headgrad::Attention {
 public:
  headgrad::PluginInfo info() const override { return {}; }
};
}  // namespace
HEADGRAD_PLUGIN(Probe)
EOF
run "$tmp/sdk.log" c++ -std=c++20 -shared -fPIC "$tmp/sdk.cpp" -o "$tmp/sdk.so" $cflags $libs
printf '#include <headgrad/c_plugin.h>\nint main(void) { return HEADGRAD_C_ABI_VERSION == 1 ? 0 : 1; }\n' >"$tmp/c.c"
run "$tmp/c.log" cc -std=c99 -pedantic-errors -Wall -Werror -c "$tmp/c.c" -o "$tmp/c.o" $cflags

step "new-plugin myattn (the installed program's own subcommand)"
"$headgrad" --help >"$tmp/help.log" 2>&1 || { cat "$tmp/help.log"; fail "headgrad --help failed"; }
grep -q "new-plugin" "$tmp/help.log" || { cat "$tmp/help.log"; fail "the installed headgrad has no new-plugin subcommand"; }
run "$tmp/new.log" "$headgrad" new-plugin myattn "$tmp/myattn"
cat "$tmp/new.log"
# the installed program knows its headgrad.pc
grep -qF "PKG_CONFIG_PATH=$(readlink -f "$pcdir")" "$tmp/new.log" ||
  fail "new-plugin does not print the installation's PKG_CONFIG_PATH ($pcdir)"

step "build it against the installed SDK (meson, dependency('headgrad'))"
cd "$tmp/myattn"
run "$tmp/setup.log" meson setup build
run "$tmp/ninja.log" ninja -C build
[[ -f build/myattn.so ]] || fail "no build/myattn.so"

step "its suite passes with the installed headgrad"
code=0
"$headgrad" run suite.yaml --plugin-path build >"$tmp/run_ok.log" 2>&1 || code=$?
tail -n 5 "$tmp/run_ok.log"
[[ $code == 0 ]] || { cat "$tmp/run_ok.log"; fail "the generated plugin's suite exited $code, expected 0"; }

step "built with the other std::string ABI it is rejected, naming the macro, and nothing crashes"
mkdir -p "$tmp/old_abi"
run "$tmp/old_abi.log" c++ -std=c++20 -O1 -shared -fPIC -fvisibility=hidden -D_GLIBCXX_USE_CXX11_ABI=0 \
  myattn.cpp -o "$tmp/old_abi/myattn.so" $cflags $libs
code=0
"$headgrad" plugins --all --plugin-path "$tmp/old_abi" >"$tmp/old_abi_list.log" 2>&1 || code=$?
[[ $code == 0 ]] || { cat "$tmp/old_abi_list.log"; fail "plugins --all with an old-ABI plugin exited $code, expected 0"; }
grep -qF "rejected  $tmp/old_abi/myattn.so: built with _GLIBCXX_USE_CXX11_ABI=0, headgrad uses 1" \
  "$tmp/old_abi_list.log" || { cat "$tmp/old_abi_list.log"; fail "the old-ABI plugin is not rejected naming the macro"; }

step "break it: merge without the transpose"
grep -q 'reshape(transpose(o, 1, 2), {b, t, dm})' myattn.cpp || fail "the merge line is not in myattn.cpp"
sed -i 's/reshape(transpose(o, 1, 2), {b, t, dm})/reshape(o, {b, t, dm})/' myattn.cpp
grep -q 'const Variable merged = reshape(o, {b, t, dm});' myattn.cpp || fail "the edit did not apply"
run "$tmp/ninja2.log" ninja -C build

step "its suite now fails"
code=0
"$headgrad" run suite.yaml --plugin-path build >"$tmp/run_bad.log" 2>&1 || code=$?
tail -n 5 "$tmp/run_bad.log"
[[ $code == 1 ]] || { cat "$tmp/run_bad.log"; fail "the broken plugin's suite exited $code, expected 1"; }

step "and names the bug"
# The installed mutant of the same bug must be named first (a runner that stops
# naming bugs fails here), then myattn must be named the same way.
cat >"$tmp/calibrate.yaml" <<'EOF'
suite: calibrate
cases:
  - name: known bug
    compare: [mutant_merge_without_transpose, per_head]
    shape: {B: 2, T: 3, D: 8, H: 2}
EOF
code=0
"$headgrad" run "$tmp/calibrate.yaml" >"$tmp/calibrate.log" 2>&1 || code=$?
[[ $code == 1 ]] || { cat "$tmp/calibrate.log"; fail "the installed mutant's case exited $code, expected 1"; }
# A diagnosis line names the bug ("diagnosis: ... reproduces merge_without_transpose ...").
sed 's/mutant_merge_without_transpose//g' "$tmp/calibrate.log" | grep -i 'diagnos.*merge_without_transpose' >/dev/null ||
  { cat "$tmp/calibrate.log"; fail "the runner does not name merge_without_transpose for its own mutant"; }
grep -qi 'diagnos.*merge_without_transpose' "$tmp/run_bad.log" ||
  { cat "$tmp/run_bad.log"; fail "the runner names merge_without_transpose for the mutant but not for myattn"; }
echo "the failure is diagnosed as merge_without_transpose"

step "done: PASS in $((SECONDS - start))s"
