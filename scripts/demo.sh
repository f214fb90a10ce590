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
DEC=$WORK/decoded
mkdir -p "$DEC"
if mountpoint -q "$DEC" 2>/dev/null || ! stat "$DEC" >/dev/null 2>&1; then
  "$BIN" umount "$DEC" || true
fi
echo "== loosefs mount $PACK $DEC --decode npy,ppm (x.npy beside x.JPEG, x.JPEG serves a PPM)"
"$BIN" mount "$PACK" "$DEC" --decode npy,ppm --log "$WORK/daemon-decoded.log"
trap '"$BIN" umount "$DEC" 2>/dev/null || true' EXIT
"$VENV/bin/python" - "$SRC" "$DEC" <<'PY'
import os, sys, time
import numpy as np
from PIL import Image
src, dec = sys.argv[1], sys.argv[2]
files = [(c, f) for c in sorted(os.listdir(src)) for f in sorted(os.listdir(os.path.join(src, c)))]
for name, step in (("first pass (decodes)", 0), ("second pass (cached)", 1)):
    t = time.perf_counter()
    for c, f in files:
        np.load(os.path.join(dec, c, os.path.splitext(f)[0] + ".npy"))
    print(f"np.load of every .npy view, {name}: {len(files) / (time.perf_counter() - t):.0f} files/s")
same = all(np.array_equal(np.load(os.path.join(dec, c, os.path.splitext(f)[0] + ".npy")),
                          np.asarray(Image.open(os.path.join(src, c, f)).convert("RGB"))) for c, f in files[:100])
print(f"first 100 .npy views equal Pillow's decode of the JPEG: {same}")
sys.exit(0 if same else 1)
PY
"$BIN" stats "$DEC" | grep -E "^(decode|decoded|daemon) "
"$BIN" umount "$DEC"
trap - EXIT
echo "demo done: pack $PACK, daemon logs $WORK/daemon.log $WORK/daemon-decoded.log"
