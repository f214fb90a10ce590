#!/usr/bin/env bash
# Builds the loosefs image (the CSI driver's node plugin and mounter, and any container whose
# daemon serves a FUSE connection a privileged side hands over) as an OCI archive that
# `podman load` and `docker load` take, then `skopeo copy` / `podman push` to a registry
# (docs/CLUSTERS.md, "Install").
#
#   deploy/container/build.sh OUT.tar [IMAGE]      # IMAGE: the name inside, default loosefs:VERSION
#
# No base image is pulled: the image is built FROM scratch (Debian's buildah) out of a root
# this script lays out under target/container-root/ — the release binary, stripped of its
# debug sections, the shared libraries it loads (FFmpeg's, for video frames; found by `ldd`,
# kept at their paths, with an ld.so.cache), the dynamic loader, CA certificates (s3://, gs://,
# az://, https:// sources), /etc/passwd and /etc/group naming root and nobody, an empty /tmp and /mnt.
# The build's context is the repository root filtered by .containerignore to that root alone.
# LOOSEFS_BIN: use this binary instead of building one (`cargo build --release --bin loosefs`).
# Buildah's storage is a temporary directory, removed at the end: nothing is left on the host
# but OUT.tar.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 OUT.tar [IMAGE]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$(realpath -m "$1")
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
image=${2:-loosefs:$version}
command -v buildah >/dev/null || { echo "$0: buildah is not installed (apt-get install buildah)" >&2; exit 1; }
command -v ldd >/dev/null && command -v objcopy >/dev/null \
  || { echo "$0: ldd and objcopy are needed (libc-bin, binutils)" >&2; exit 1; }

bin=${LOOSEFS_BIN:+$(realpath "$LOOSEFS_BIN")}
if [ -z "$bin" ]; then
  (cd "$root" && cargo build --release --locked --bin loosefs)
  bin=$root/target/release/loosefs
fi
[ -x "$bin" ] || { echo "$0: $bin is not an executable" >&2; exit 1; }

stage=$root/target/container-root
rm -rf "$stage"
mkdir -p "$stage/usr/local/bin" "$stage/etc/ssl/certs" "$stage/tmp" "$stage/mnt" "$stage/loosefs"
chmod 1777 "$stage/tmp"
objcopy --strip-debug "$bin" "$stage/usr/local/bin/loosefs"
# Every library the binary loads, at the path the loader found it, and the loader itself.
ldd "$bin" | awk '/=> \// {print $3} /^[ \t]*\/lib/ {print $1}' | sort -u | while read -r lib; do
  mkdir -p "$stage$(dirname "$lib")"
  cp -L "$lib" "$stage$lib"
done
unresolved=$(ldd "$bin" | grep 'not found' || true)
[ -z "$unresolved" ] || { echo "$0: libraries not found: $unresolved" >&2; exit 1; }
ldconfig -r "$stage" 2>/dev/null || true
cp -L /etc/ssl/certs/ca-certificates.crt "$stage/etc/ssl/certs/" \
  || { echo "$0: no /etc/ssl/certs/ca-certificates.crt (apt-get install ca-certificates)" >&2; exit 1; }
printf 'root:x:0:0:root:/tmp:/nonexistent\nnobody:x:65534:65534:nobody:/tmp:/nonexistent\n' > "$stage/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$stage/etc/group"

storage=$(mktemp -d "${TMPDIR:-/tmp}/loosefs-buildah-XXXXXX")
trap 'rm -rf "$storage"' EXIT
b=(buildah --root "$storage/root" --runroot "$storage/run" --storage-driver vfs)
"${b[@]}" bud --quiet --layers=false --pull=never \
  --ignorefile "$root/.containerignore" \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.revision=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)" \
  --label "org.opencontainers.image.source=loosefs" \
  -f "$here/Containerfile" -t "$image" "$root" >/dev/null
rm -f "$out"
"${b[@]}" push --quiet "$image" "oci-archive:$out:$image"
echo "$0: $image written to $out ($(du -h "$out" | cut -f1))" >&2
