#!/usr/bin/env bash
# Creates (once) and prints the path of a Debian trixie root holding Python 3.13 and lerobot
# 0.6.1 (`lerobot[dataset]`, PyAV). The tests and the bench use it twice over: lerobot needs
# Python >= 3.12 and the build machine's Python is 3.11, so LeRobot's own loader runs there over
# a mount; and it is a distribution with another glibc and no FFmpeg, no Rust, no C compiler,
# where the release wheel must install and mount (tests/e2e/test_python_api.py). It is made by
# debootstrap from Debian's archive and entered with chroot in a private mount namespace
# (tests/e2e/trixie.py).
# The root lives outside the repository, in ${LOOSEFS_TRIXIE_ROOT:-$HOME/.cache/loosefs/trixie-root}
# (about 5.5 GB, most of it torch), and is reused while its stamp matches scripts/trixie.lock,
# which pins every package of its venv (installed with --no-deps). `--relock` (on a root made
# from the list below) writes the lock from what pip resolves today.
# Needs root (debootstrap, chroot).
set -euo pipefail
ROOTFS=${LOOSEFS_TRIXIE_ROOT:-$HOME/.cache/loosefs/trixie-root}
LOCK="$(cd "$(dirname "$0")" && pwd)/trixie.lock"
SUITE=trixie
PKGS="lerobot[dataset]==0.6.1 av==15.1.0"
RELOCK=
if [ "${1:-}" = --relock ]; then RELOCK=1; fi
STAMP="$ROOTFS/.loosefs-stamp"
WANT="$SUITE $(sha256sum "$LOCK" | cut -d' ' -f1)"
ready() {
  [ -z "$RELOCK" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$ROOTFS/venv/bin/python" ]
}
if ready; then
  echo "$ROOTFS"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "trixie-root: needs root (debootstrap and chroot)" >&2
  exit 1
fi
command -v debootstrap >/dev/null || { echo "trixie-root: debootstrap is missing (scripts/setup.sh installs it)" >&2; exit 1; }
mkdir -p "$(dirname "$ROOTFS")"
exec 9>"$ROOTFS.lock"
flock 9
if ready; then
  echo "$ROOTFS"
  exit 0
fi
echo "trixie-root: creating $ROOTFS: Debian $SUITE with Python 3.13, then its venv from $LOCK (first run only; about 5 GB)" >&2
# Binds into the root live only in the private namespaces of scripts/in-trixie.sh; staying on
# one file system anyway keeps a stray mount's files out of reach.
rm -rf --one-file-system "$ROOTFS"
debootstrap --variant=minbase --include=python3,python3-venv "$SUITE" "$ROOTFS" http://deb.debian.org/debian >&2 \
  || { echo "trixie-root: debootstrap of $SUITE failed (log: $ROOTFS/debootstrap/debootstrap.log)" >&2; exit 1; }
# This machine's certificate bundle (a proxy's CA may be in it) and resolver, so pip inside the
# root reaches PyPI as pip outside does.
cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
cp -L /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
in_root() {
  unshare --mount --propagation private sh -c 'mount -t proc proc "$1/proc" && mount --rbind /dev "$1/dev" && shift && exec chroot "$@"' \
    sh "$ROOTFS" "$ROOTFS" env -i PATH=/usr/bin:/bin HOME=/root LANG=C.UTF-8 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_DEFAULT_TIMEOUT=180 PIP_DISABLE_PIP_VERSION_CHECK=1 "$@"
}
in_root python3 -m venv /venv >&2
if [ -n "$RELOCK" ]; then
  # shellcheck disable=SC2086
  in_root /venv/bin/pip install --quiet $PKGS >&2
  { sed -n '/^#/p' "$LOCK"; in_root /venv/bin/pip freeze | grep '=='; } > "$LOCK.new"
  mv "$LOCK.new" "$LOCK"
  WANT="$SUITE $(sha256sum "$LOCK" | cut -d' ' -f1)"
  echo "trixie-root: wrote $LOCK" >&2
else
  cp "$LOCK" "$ROOTFS/trixie.lock"
  in_root /venv/bin/pip install --quiet --no-deps -r /trixie.lock >&2
fi
in_root /venv/bin/python -c 'import lerobot.datasets.lerobot_dataset, av' >&2
echo "$WANT" > "$STAMP"
echo "$ROOTFS"
