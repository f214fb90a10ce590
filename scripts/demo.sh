#!/usr/bin/env bash
# The main job on an embedded default: installs what it needs, builds loosefs, packs a dataset
# (the argument, else ../shared/data/imagenet-sample when present, else a small set of JPEGs
# it generates), mounts the pack, runs torchvision ImageFolder over the mount and over the
# original directory, prints what it did and the files/s of warm read passes, and unmounts.
#
#   scripts/demo.sh [DATASET_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "== building loosefs (release)"
cargo build --release --quiet
BIN=$PWD/target/release/loosefs
VENV=$(scripts/python-env.sh)
WORK=${LOOSEFS_DEMO_DIR:-${TMPDIR:-/tmp}/loosefs-demo}
mkdir -p "$WORK"
SRC=${1:-}
if [ -z "$SRC" ]; then
  if [ -d ../shared/data/imagenet-sample ]; then
    SRC=../shared/data/imagenet-sample
  else
    SRC=$WORK/generated
    [ -d "$SRC" ] || "$VENV/bin/python" scripts/make-sample-jpegs.py "$SRC"
  fi
fi
SRC=$(cd "$SRC" && pwd)
PACK=$WORK/data.pack
MNT=$WORK/mnt
mkdir -p "$MNT"
if mountpoint -q "$MNT" 2>/dev/null || ! stat "$MNT" >/dev/null 2>&1; then
  "$BIN" umount "$MNT" || true
fi
echo "== loosefs pack $SRC $PACK"
"$BIN" pack "$SRC" "$PACK" --force
"$BIN" info "$PACK"
echo "== loosefs mount $PACK $MNT"
"$BIN" mount "$PACK" "$MNT" --log "$WORK/daemon.log"
trap '"$BIN" umount "$MNT" 2>/dev/null || true' EXIT
echo "== torchvision ImageFolder over the mount"
"$VENV/bin/python" - "$SRC" "$MNT" <<'PY'
import os, sys, time
import torchvision
src, mnt = sys.argv[1], sys.argv[2]
a, b = torchvision.datasets.ImageFolder(src), torchvision.datasets.ImageFolder(mnt)
same = a.classes == b.classes and [(os.path.relpath(p, src), y) for p, y in a.samples] == [(os.path.relpath(p, mnt), y) for p, y in b.samples]
t = time.perf_counter()
for i in range(len(b)):
    img, label = b[i]
dt = time.perf_counter() - t
print(f"ImageFolder({mnt}): {len(b.classes)} classes, {len(b)} samples, same classes and samples as the original: {same}")
print(f"decoded every sample once through the mount: {len(b) / dt:.0f} files/s")
if not same:
    sys.exit(1)
PY
echo "== warm read passes, same run: original directory vs loosefs mount"
"$VENV/bin/python" bench/read_pass.py --orig "$SRC" --mount "$MNT" --repeat 3
echo "== loosefs umount $MNT"
"$BIN" umount "$MNT"
trap - EXIT
echo "demo done: pack $PACK, daemon log $WORK/daemon.log"
