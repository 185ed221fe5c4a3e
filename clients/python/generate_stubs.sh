#!/usr/bin/env bash
# Generates the Python stubs of the public API (proto/treespec/v1/generation.proto) into OUT_DIR
# (default clients/python/gen), as the package treespec.v1:
#
#   clients/python/generate_stubs.sh [OUT_DIR]
#
# Needs protoc >= 3.15 (proto3 `optional` fields) and gRPC's Python plugin: on Debian 12 /
# Ubuntu 22.04+ `apt-get install protobuf-compiler protobuf-compiler-grpc` (protoc 3.21 and
# /usr/bin/grpc_python_plugin), with the runtime `python3-grpcio python3-protobuf`. Debian's
# python3-grpc-tools (grpc_tools.protoc) bundles protoc 3.5, which rejects `optional`: do not
# use it. From pip, `grpcio-tools` of any current version works (python3 -m grpc_tools.protoc
# with the same arguments).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$here/gen}
plugin=$(command -v grpc_python_plugin || true)
[ -n "$plugin" ] || { echo "generate_stubs: no grpc_python_plugin (apt-get install protobuf-compiler-grpc)" >&2; exit 1; }
version=$(protoc --version | awk '{print $2}')
major=${version%%.*}; rest=${version#*.}; minor=${rest%%.*}
if [ "$major" -lt 3 ] || { [ "$major" -eq 3 ] && [ "$minor" -lt 15 ]; }; then
  echo "generate_stubs: protoc $version is too old for proto3 optional fields (needs 3.15+)" >&2
  exit 1
fi
mkdir -p "$out"
protoc -I "$root/proto" --python_out="$out" --grpc_out="$out" \
  --plugin=protoc-gen-grpc="$plugin" "$root/proto/treespec/v1/generation.proto"
echo "generate_stubs: $out/treespec/v1/generation_pb2{,_grpc}.py (protoc $version)"
