#!/usr/bin/env bash
# Generates the stubs into a temporary folder and runs client_test.py with Debian's python3
# (python3-grpcio, python3-protobuf: tools/install_deps.sh) against the binaries in BIN_DIR.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:?usage: clients/python/run_test.sh BIN_DIR}
work=$(mktemp -d /tmp/treespec-pyclient.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$here/generate_stubs.sh" "$work/stubs" >/dev/null
python=/usr/bin/python3
"$python" -c 'import grpc, google.protobuf' 2>/dev/null ||
  { echo "run_test: needs Debian's python3-grpcio and python3-protobuf: run tools/install_deps.sh" >&2; exit 1; }
"$python" "$here/client_test.py" --bin_dir "$bin" --stubs "$work/stubs" --log_dir "$work"
