#!/usr/bin/env bash
# Installs (once) and prints the path of Azurite's blob server (`azurite-blob`), Microsoft's
# Azure Storage emulator, for the Azure tests (tests/e2e/servers.py Azurite). It comes from the
# npm registry at the versions scripts/azurite/package-lock.json pins (`npm ci`), into
# ${LOOSEFS_AZURITE_DIR:-$HOME/.cache/loosefs/azurite}, reused while its stamp matches the lock.
# Needs Node.js and npm (scripts/setup.sh installs Debian's).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)/azurite"
DIR=${LOOSEFS_AZURITE_DIR:-$HOME/.cache/loosefs/azurite}
WANT=$(cat "$HERE/package.json" "$HERE/package-lock.json" | sha256sum | cut -d' ' -f1)
BIN="$DIR/node_modules/.bin/azurite-blob"
ready() { [ -x "$BIN" ] && [ "$(cat "$DIR/.loosefs-stamp" 2>/dev/null)" = "$WANT" ]; }
if ! ready; then
  command -v npm >/dev/null || { echo "azurite: npm not found (run scripts/setup.sh)" >&2; exit 1; }
  mkdir -p "$DIR"
  exec 9>"$DIR.lock"
  flock 9
  if ! ready; then
    echo "azurite: installing Azurite from the npm registry into $DIR" >&2
    cp "$HERE/package.json" "$HERE/package-lock.json" "$DIR/"
    (cd "$DIR" && npm ci --no-audit --no-fund --loglevel=error >&2)
    echo "$WANT" > "$DIR/.loosefs-stamp"
  fi
fi
echo "$BIN"
