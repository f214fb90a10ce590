#!/usr/bin/env bash
# Runs every test of loosefs: formatting and lints, Rust unit and integration tests (the ones
# that mount run when root and /dev/fuse are present; without them they are reported as
# ignored/skipped, and under CI=true the run fails), and the Python end-to-end loader tests (torchvision, DataLoader, DALI) in a venv
# cached outside the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The free space the run starts with (tests/README: it needs a few GB): shown for a failure's log.
df -h "${TMPDIR:-/tmp}" .
echo "== cargo fmt --check / clippy"
cargo fmt --check
cargo clippy --release --all-targets -- -D warnings
echo "== cargo build --release"
cargo build --release
# The venv is made before any test needs it (decode tests use Pillow as their oracle), once,
# under python-env.sh's lock.
echo "== Python venv"
VENV=$(scripts/python-env.sh)
# A test that hangs (a FUSE read whose daemon is stuck) fails with its name after this long
# instead of hanging the run (tests/common Timeout; pytest-timeout below).
export LOOSEFS_TEST_TIMEOUT=${LOOSEFS_TEST_TIMEOUT:-900}
if [ "$(id -u)" = 0 ] && [ -e /dev/fuse ]; then
  echo "== cargo test (including the mount tests)"
  cargo test --release --no-fail-fast -- --include-ignored
  # Mounts take FUSE over io_uring where the kernel offers it (`--transport auto`); the
  # Rust suite runs again with every mount on /dev/fuse, so both transports are tested.
  echo "== cargo test again, every mount over /dev/fuse (LOOSEFS_TRANSPORT=classic)"
  LOOSEFS_TRANSPORT=classic cargo test --release --no-fail-fast --tests -- --include-ignored
elif [ "${CI:-}" = true ]; then
  echo "== cargo test (no mount tests: this machine cannot mount)"
  cargo test --release
  echo "!! CI=true but this machine cannot mount (needs root and /dev/fuse): the mount tests did not run; failing" >&2
  exit 1
else
  echo "!! SKIPPED: mount tests need root and /dev/fuse; they are reported as ignored below" >&2
  cargo test --release
fi
echo "== Python end-to-end loader tests"
# Their directories (~5 GB) are removed when every test passed, kept for a failed run.
cd tests/e2e
LOOSEFS_BIN="$PWD/../../target/release/loosefs" "$VENV/bin/python" -m pytest -rs -v -p no:cacheprovider -o tmp_path_retention_policy=failed --timeout "$LOOSEFS_TEST_TIMEOUT" --timeout-method thread .
