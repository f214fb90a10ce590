#!/usr/bin/env bash
# Runs every test of loosefs: formatting and lints, Rust unit and integration tests (the ones
# that mount run when root and /dev/fuse are present; without them they are reported as
# ignored/skipped, and under CI=true the run fails), and the Python end-to-end loader tests
# (torchvision, DataLoader, DALI) in a venv cached outside the repository.
#
# Every phase runs even when an earlier one failed (a failing Rust test does not hide the
# Python tests); the script prints one summary line per phase and exits with the worst status.
# On exit, whatever way it ends, a trap detaches mounts the tests left behind and puts back the
# host settings they change (/dev/fuse's mode, /sbin/mount.fuse.loosefs, test cgroups).
set -uo pipefail
cd "$(dirname "$0")/.."
# No test may send a request beyond 127.0.0.1, the instance-metadata address included (GCS's
# credential chain asks the metadata server last: here a closed local port).
export AWS_EC2_METADATA_DISABLED=true GCE_METADATA_HOST=127.0.0.1:9 GCE_METADATA_IP=127.0.0.1:9

declare -a SUMMARY=()
WORST=0
# phase NAME CMD...: runs CMD, records its status; never stops the script.
phase() {
  local name=$1 t0=$SECONDS rc
  shift
  echo "== $name"
  "$@"
  rc=$?
  SUMMARY+=("$(printf '%-58s %s (%d s)' "$name" "$([ $rc = 0 ] && echo ok || echo "FAILED: exit $rc")" $((SECONDS - t0)))")
  [ $rc -gt $WORST ] && WORST=$rc
  return 0
}

FUSE_MODE=$(stat -c %a /dev/fuse 2>/dev/null || true)
loosefs_mounts() { awk '$1 ~ /^loosefs:/ && $3 ~ /^fuse/ {print $2}' /proc/self/mounts | sed 's/\\040/ /g' | sort -r; }
MOUNTS_BEFORE=$(loosefs_mounts)
cleanup() {
  # loosefs mounts made during the run (a test that aborted on its timeout skips its own
  # unmount); mounts that were there before the run are left alone.
  local mnt
  while read -r mnt; do
    [ -n "$mnt" ] || continue
    grep -qxF "$mnt" <<<"$MOUNTS_BEFORE" && continue
    echo "cleanup: detaching a mount left behind: $mnt" >&2
    umount -l "$mnt" 2>/dev/null || fusermount3 -uz "$mnt" 2>/dev/null || true
  done < <(loosefs_mounts)
  if [ -n "$FUSE_MODE" ] && [ "$(stat -c %a /dev/fuse 2>/dev/null)" != "$FUSE_MODE" ]; then
    echo "cleanup: /dev/fuse back to mode $FUSE_MODE" >&2
    chmod "$FUSE_MODE" /dev/fuse || true
  fi
  # tests/mount.rs sets the link aside as mount.fuse.loosefs.loosefs-test-PID.
  local aside
  for aside in /sbin/mount.fuse.loosefs.loosefs-test-*; do
    [ -e "$aside" ] || [ -L "$aside" ] || continue
    echo "cleanup: restoring /sbin/mount.fuse.loosefs" >&2
    rm -f /sbin/mount.fuse.loosefs && mv "$aside" /sbin/mount.fuse.loosefs || true
  done
  local cg
  for cg in /sys/fs/cgroup/loosefs-test-* /sys/fs/cgroup/*/loosefs-test-*; do
    [ -d "$cg" ] && rmdir "$cg" 2>/dev/null || true
  done
}
trap cleanup EXIT

scripts/setup.sh || { echo "!! scripts/setup.sh failed" >&2; exit 1; }
# The free space the run starts with (tests/README: it needs a few GB): shown for a failure's log.
df -h "${TMPDIR:-/tmp}" .
phase "cargo fmt --check" cargo fmt --check
phase "cargo clippy --all-targets -D warnings" cargo clippy --release --all-targets --features bench -- -D warnings
phase "cargo build --release --features bench" cargo build --release --features bench
# The venv is made before any test needs it (decode tests use Pillow as their oracle), once,
# under python-env.sh's lock.
echo "== Python venv"
t0=$SECONDS
if VENV=$(scripts/python-env.sh); then
  SUMMARY+=("$(printf '%-58s ok (%d s)' "Python venv (scripts/python.lock)" $((SECONDS - t0)))")
else
  echo "!! the Python venv could not be made" >&2; VENV=; WORST=1; SUMMARY+=("Python venv: FAILED")
fi
# A Debian trixie root beside the venv, made once: LeRobot's own loader (Python >= 3.12) runs
# there, and the release wheel is installed there (another distribution, no toolchain).
if [ -n "$VENV" ] && [ "$(id -u)" = 0 ]; then
  echo "== Debian trixie root (Python 3.13 + lerobot; tests/e2e/trixie.py)"
  t0=$SECONDS
  TRIXIE_ERR=$(mktemp)
  if scripts/trixie-root.sh >/dev/null 2>"$TRIXIE_ERR"; then
    SUMMARY+=("$(printf '%-58s ok (%d s)' "Debian trixie root" $((SECONDS - t0)))")
  else
    tail -20 "$TRIXIE_ERR" >&2
    echo "!! the trixie root could not be made: its tests say so, each at once" >&2
    SUMMARY+=("$(printf '%-58s FAILED (%d s): its tests fail at once' "Debian trixie root" $((SECONDS - t0)))")
    # The tests that need it fail (skip, without CI) at once instead of trying again each.
    LOOSEFS_TRIXIE_FAILED="$(tail -1 "$TRIXIE_ERR")"
    export LOOSEFS_TRIXIE_FAILED
  fi
  rm -f "$TRIXIE_ERR"
fi
# Azurite (Microsoft's Azure Storage emulator, from the npm registry at a locked version) for the
# Azure tests: tests/e2e/servers.py Azurite finds it through LOOSEFS_AZURITE.
echo "== Azurite (scripts/azurite.sh)"
t0=$SECONDS
if LOOSEFS_AZURITE=$(scripts/azurite.sh); then
  export LOOSEFS_AZURITE
  SUMMARY+=("$(printf '%-58s ok (%d s)' "Azurite (scripts/azurite/package-lock.json)" $((SECONDS - t0)))")
else
  echo "!! Azurite could not be installed: the Azure tests say so" >&2
  SUMMARY+=("$(printf '%-58s FAILED (%d s): the Azure tests say so' "Azurite" $((SECONDS - t0)))")
fi
# The test corpus (scripts/make-test-data.py: 1,000 JPEGs cut from the photographs of
# scikit-image's and matplotlib's wheels, the packed formats by their own writers, a LeRobot
# dataset by lerobot in the trixie root; made once and cached): what the tests read where
# ../shared/data is absent (a user's clone). CI has ../shared and must: its absence fails there.
if [ -n "$VENV" ]; then
  echo "== test corpus"
  CORPUS_ARGS=()
  [ "$(id -u)" = 0 ] && CORPUS_ARGS=(--lerobot)
  t0=$SECONDS
  if LOOSEFS_TEST_DATA=$("$VENV/bin/python" scripts/make-test-data.py "${CORPUS_ARGS[@]}"); then
    SUMMARY+=("$(printf '%-58s ok (%d s)' "test corpus (scripts/make-test-data.py)" $((SECONDS - t0)))")
  else
    echo "!! the test corpus could not be made" >&2; WORST=1; SUMMARY+=("test corpus: FAILED")
  fi
  export LOOSEFS_TEST_DATA
fi
if [ "${CI:-}" = true ] && [ ! -d ../shared/data/imagenet-sample ]; then
  echo "!! CI=true but ../shared/data is absent beside the checkout: its corpora are not tested" >&2
  SUMMARY+=("../shared/data: FAILED (CI=true and it is absent)")
  WORST=1
fi
# A test that hangs (a FUSE read whose daemon is stuck) fails with its name after this long
# instead of hanging the run (tests/common Timeout; pytest-timeout below).
export LOOSEFS_TEST_TIMEOUT=${LOOSEFS_TEST_TIMEOUT:-900}
# The tests the transport changes: the ones that mount (the rest run in process).
MOUNT_TESTS=(--test mount --test read_path --test decode --test dir_mount --test flags --test transport)
if [ "$(id -u)" = 0 ] && [ -e /dev/fuse ]; then
  phase "cargo test (all, mounts over FUSE over io_uring where offered)" \
    cargo test --release --features bench --no-fail-fast -- --include-ignored
  # Mounts take FUSE over io_uring where the kernel offers it (`--transport auto`); the mount
  # tests run again with every mount on /dev/fuse, so both transports are tested. This pass
  # runs as a user's clone does (../shared hidden: LOOSEFS_TEST_CLONE_ALONE=1), on the corpus
  # made above, with the tests that read the formats, the fuzz seeds, the hostile sweep and
  # LeRobot's dataset: a clone's path runs in every CI run.
  phase "cargo test, mount tests over /dev/fuse (LOOSEFS_TRANSPORT=classic), clone alone" \
    env LOOSEFS_TRANSPORT=classic LOOSEFS_TEST_CLONE_ALONE=1 cargo test --release --features bench \
      --no-fail-fast "${MOUNT_TESTS[@]}" --test foreign --test fuzz_replay -- --include-ignored
  phase "cargo test, the hostile sweep and LeRobot's reader, clone alone" \
    env LOOSEFS_TEST_CLONE_ALONE=1 cargo test --release --features bench --no-fail-fast --lib -- \
      formats::hostile video::lerobot
elif [ "${CI:-}" = true ]; then
  phase "cargo test (no mount tests: this machine cannot mount)" cargo test --release --features bench --no-fail-fast
  echo "!! CI=true but this machine cannot mount (needs root and /dev/fuse): the mount tests did not run; failing" >&2
  SUMMARY+=("mount tests: FAILED (CI=true and this machine cannot mount)")
  WORST=1
else
  echo "!! SKIPPED: mount tests need root and /dev/fuse; they are reported as ignored below" >&2
  phase "cargo test (no mount tests)" cargo test --release --features bench --no-fail-fast
fi
# The release wheel, left in target/wheels/ as the run's artifact (docs/INSTALL.md); the Python
# tests install it in the trixie root and mount from it.
if [ -n "$VENV" ]; then
  phase "release wheel (scripts/wheel.sh: target/wheels/)" scripts/wheel.sh target/wheels
  LOOSEFS_WHEEL=$(ls "$PWD"/target/wheels/loosefs-*manylinux*.whl 2>/dev/null | head -1)
  export LOOSEFS_WHEEL
fi
if [ -n "$VENV" ]; then
  # Their directories (~5 GB) are removed when every test passed, kept for a failed run.
  # The tests run one at a time in a worker process (pytest-xdist, `-n 1`): a test that hangs
  # past its timeout ends its worker (pytest-timeout's thread method), is reported failed by
  # name, and the next tests run in a new worker; one hang costs one test, not the session.
  pytest_run() {
    (cd tests/e2e && LOOSEFS_BIN="$PWD/../../target/release/loosefs" "$VENV/bin/python" -m pytest -rs -v \
      -p no:cacheprovider -o tmp_path_retention_policy=failed -n 1 --max-worker-restart 1000 \
      --timeout "$LOOSEFS_TEST_TIMEOUT" --timeout-method thread "$@")
  }
  phase "Python end-to-end tests" pytest_run .
  # The loaders and outages once more with every mount on /dev/fuse (the fallback of every
  # kernel without FUSE over io_uring).
  if [ "$(id -u)" = 0 ] && [ -e /dev/fuse ]; then
    # As a user's clone runs them (../shared hidden, the corpus made above): a skip fails here.
    pytest_classic() (export LOOSEFS_TRANSPORT=classic LOOSEFS_TEST_CLONE_ALONE=1; pytest_run "$@")
    phase "Python loader, format, video and outage tests over /dev/fuse (LOOSEFS_TRANSPORT=classic), clone alone" \
      pytest_classic test_loaders.py test_formats.py test_formats_writers.py test_video.py test_remote.py \
        -k "test_loaders or test_formats or test_video or down or killed or outage or cut or lerobot"
  fi
fi
echo
echo "== summary (total $SECONDS s)"
printf '%s\n' "${SUMMARY[@]}"
[ $WORST = 0 ] && echo "all phases passed" || echo "!! at least one phase failed (worst exit $WORST)"
exit $WORST
