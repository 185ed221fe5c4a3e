#!/usr/bin/env bash
# Installs what is missing, builds, and runs every CPU test (ctest; GPU tests skip themselves).
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/install_deps.sh
./tools/build.sh
cd build
ctest --output-on-failure -j"$(nproc)" "$@"
