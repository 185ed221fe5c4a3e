#!/usr/bin/env bash
# Installs the Debian packages treespec builds against, only those that are missing.
# Arguments name extra packages a caller needs (tools/fuzz.sh: clang and its libFuzzer runtime).
set -euo pipefail
pkgs=(cmake g++ make pkg-config libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev
  protobuf-compiler libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev
  libopenblas-dev libpcre2-dev libicu-dev prometheus-cpp-dev libcivetweb-dev python3
  python3-yaml python3-jsonschema  # tests/deploy's manifest checker
  python3-grpcio python3-protobuf  # clients/python and its test
  openssl)  # tls_test makes its certificates with it
pkgs+=("$@")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi
