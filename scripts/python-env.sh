#!/usr/bin/env bash
# Creates (once) and prints the path of the Python venv used by the demo, the end-to-end tests and
# the bench: torch + torchvision + NVIDIA DALI (CPU-only use) + Pillow + numpy.
# The venv lives outside the repository, in ${LOOSEFS_VENV:-$HOME/.cache/loosefs/venv}, and is
# reused while its stamp matches the package list below.
set -euo pipefail
VENV=${LOOSEFS_VENV:-$HOME/.cache/loosefs/venv}
PKGS="torch torchvision nvidia-dali-cuda120 pillow numpy pytest matplotlib"
STAMP="$VENV/.loosefs-stamp"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PKGS" ] && "$VENV/bin/python" -c 'import torch, torchvision, nvidia.dali, pytest, matplotlib' 2>/dev/null; then
  echo "$VENV"
  exit 0
fi
echo "python-env: creating $VENV with: $PKGS (first run only; this downloads several GB)" >&2
python3 -m venv "$VENV" >&2
"$VENV/bin/pip" install --quiet --upgrade pip >&2
# shellcheck disable=SC2086
"$VENV/bin/pip" install --quiet $PKGS >&2
echo "$PKGS" > "$STAMP"
echo "$VENV"
