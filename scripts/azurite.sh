#!/usr/bin/env bash
# Installs (once) and prints the path of Azurite's blob server (`azurite-blob`), Microsoft's
# Azure Storage emulator, for the Azure tests (tests/e2e/servers.py Azurite). It comes from the
# npm registry at the versions scripts/azurite/package-lock.json pins (`npm ci`), into
# ${LOOSEFS_AZURITE_DIR:-$HOME/.cache/loosefs/azurite}, reused while its stamp matches the lock.
# Needs Node.js and npm (scripts/setup.sh installs Debian's).
set -euo pipefail
exec "$(dirname "$0")/npm-tool.sh" azurite "${LOOSEFS_AZURITE_DIR:-$HOME/.cache/loosefs/azurite}" node_modules/.bin/azurite-blob
