#!/usr/bin/env bash
# Runs a command inside the Debian trixie root (scripts/trixie-root.sh makes it on first use):
# chroot in a private mount namespace with /proc, /dev, an empty /tmp (tmpfs) and each
# `--bind HOST:INNER` directory (a mount too) bind-mounted at INNER; every bind vanishes with
# the namespace. The environment is emptied but for PATH, HOME, LANG and what keeps the
# command on this machine: HF_HUB_OFFLINE, HF_DATASETS_OFFLINE, AWS_EC2_METADATA_DISABLED.
# Usage: scripts/in-trixie.sh [--bind HOST:INNER]... -- CMD [ARG...]     (as root)
set -euo pipefail
ROOTFS=$("$(dirname "$0")/trixie-root.sh")
binds=()
while [ $# -gt 0 ]; do
  case $1 in
    --bind) binds+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "usage: $0 [--bind HOST:INNER]... -- CMD [ARG...]" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: $0 [--bind HOST:INNER]... -- CMD [ARG...]" >&2; exit 2; }
# shellcheck disable=SC2016
exec unshare --mount --propagation private bash -c '
  set -euo pipefail
  R=$1 n=$2
  shift 2
  mount -t proc proc "$R/proc"
  mount --rbind /dev "$R/dev"
  mount -t tmpfs tmpfs "$R/tmp"
  for ((i = 0; i < n; i++)); do
    host=${1%%:*} inner=${1#*:}
    shift
    mkdir -p "$R$inner"
    mount --bind "$host" "$R$inner"
  done
  exec chroot "$R" env -i PATH=/usr/bin:/bin HOME=/root LANG=C.UTF-8 HF_HUB_OFFLINE=1 \
    HF_DATASETS_OFFLINE=1 AWS_EC2_METADATA_DISABLED=true "$@"
' bash "$ROOTFS" "${#binds[@]}" "${binds[@]}" "$@"
