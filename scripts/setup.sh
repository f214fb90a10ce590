#!/usr/bin/env bash
# Installs what loosefs needs on a fresh Debian machine (run as root): fuse3 (fusermount3,
# used by tests and as the non-root mount fallback), unzip (zip compatibility test), cmake and
# nasm (libjpeg-turbo build for the decoded views), python3-venv, nginx-light and openssl (remote
# packs over HTTP in the tests). Skips apt when all are there.
set -euo pipefail
need=()
command -v fusermount3 >/dev/null || need+=(fuse3)
command -v unzip >/dev/null || need+=(unzip)
command -v cmake >/dev/null || need+=(cmake)
command -v nasm >/dev/null || need+=(nasm)
command -v cc >/dev/null || need+=(build-essential)
command -v pkg-config >/dev/null || need+=(pkg-config)
# nginx serves packs over HTTP ranges and openssl makes its test certificate (remote-pack tests).
command -v nginx >/dev/null || need+=(nginx-light)
command -v openssl >/dev/null || need+=(openssl)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}" >&2
  if [ "$(id -u)" != 0 ]; then
    echo "setup: need root to apt-get install ${need[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null; then
  echo "setup: cargo not found. loosefs needs a Rust toolchain >= 1.85 (edition 2024): install it with rustup" >&2
  exit 1
fi
