#!/usr/bin/env bash
# Builds the release wheel, one a user installs with pip where there is no toolchain and no
# FFmpeg: the loosefs command line (release profile, stripped) and the Python package, with every
# shared library the binary needs beyond the manylinux set (FFmpeg's and theirs) copied into
# `loosefs.libs/` by maturin's auditwheel repair (patchelf). The platform tag is the lowest
# manylinux tag the binary's glibc symbols allow (manylinux_2_35 when built on Debian 12).
# Prints the wheel's path. Usage: scripts/wheel.sh [OUT_DIR]   (default target/wheels)
# tests/e2e/test_python_api.py builds it, installs it in a Debian trixie root (another glibc, no
# FFmpeg, no Rust) and mounts from it.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-target/wheels}
command -v patchelf >/dev/null || { echo "wheel: patchelf is missing (scripts/setup.sh installs it)" >&2; exit 1; }
VENV=$(scripts/python-env.sh)
mkdir -p "$OUT"
rm -f "$OUT"/loosefs-*.whl
# maturin's repair patches the binary in place, and cargo's copy in target/release/deps is the
# same file (a hard link): drop both before and after, so that cargo links a clean one each
# time and no later build takes the patched one as up to date.
drop_patched() {
  [ -e target/maturin/loosefs ] || return 0
  find target/release/deps -maxdepth 1 -samefile target/maturin/loosefs -delete
  rm -f target/maturin/loosefs
}
drop_patched
"$VENV/bin/maturin" build --release --auditwheel repair --out "$OUT" >&2
drop_patched
WHEEL=$(ls "$OUT"/loosefs-*manylinux*.whl)

# The manylinux policy lets a wheel assume libX11, libXext, libXrender, libglib and libgobject
# (and zlib, expat) on every system; slim container images lack them, and Debian's FFmpeg
# libraries need them. They go into loosefs.libs/ too, under their own names (the binary's
# RPATH, $ORIGIN/../loosefs.libs, covers every library it loads), with what they need in turn:
# the wheel then needs only glibc >= its tag's version, libgcc_s and libstdc++.
SYSTEM='^(libc|libm|libpthread|libdl|librt|libresolv|libutil|libgcc_s|libstdc\+\+|ld-linux-x86-64)\.so'
UNPACKED=$(mktemp -d)
trap 'rm -rf "$UNPACKED"' EXIT
"$VENV/bin/wheel" unpack --dest "$UNPACKED" "$WHEEL" >&2
DIR=$(echo "$UNPACKED"/loosefs-*)
LIBS="$DIR/loosefs.libs"
LDCACHE=$(ldconfig -p)
grafted=()
more=1
while [ $more = 1 ]; do
  more=0
  for f in "$DIR/loosefs.scripts/loosefs" "$LIBS"/*; do
    for so in $(patchelf --print-needed "$f"); do
      [[ $so =~ $SYSTEM ]] && continue
      [ -e "$LIBS/$so" ] && continue
      path=$(awk -v so="$so" '$1 == so && /x86-64/ {print $NF; exit}' <<<"$LDCACHE")
      [ -n "$path" ] || { echo "wheel: $so (needed by ${f##*/}) is not on this machine" >&2; exit 1; }
      cp -L "$path" "$LIBS/$so"
      grafted+=("$so")
      more=1
    done
  done
done
echo "wheel: also bundled ${grafted[*]}" >&2
rm -f "$WHEEL"
"$VENV/bin/wheel" pack --dest-dir "$OUT" "$DIR" >&2
ls "$OUT"/loosefs-*manylinux*.whl
