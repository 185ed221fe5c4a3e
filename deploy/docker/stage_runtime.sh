#!/usr/bin/env bash
# Collects what the runtime image needs from the build stage into OUT: the binaries (OUT/bin) and
# the Debian packages that own the shared libraries they link (OUT/runtime-packages.txt), so the
# runtime stage installs exactly those and none of the toolchain. A library no package owns
# fails the build rather than leaving a binary that cannot start.
# Usage: stage_runtime.sh OUT BINARY...
set -euo pipefail
out=$1
shift
mkdir -p "$out/bin"
cp "$@" "$out/bin/"
owner() {  # dpkg records a library under /lib or /usr/lib depending on the package's age
  dpkg -S "$1" 2>/dev/null || dpkg -S "$(realpath "$1")" 2>/dev/null || dpkg -S "/usr$1" 2>/dev/null
}
ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
  pkg=$(owner "$lib") || { echo "stage_runtime.sh: no Debian package owns $lib" >&2; exit 1; }
  echo "${pkg%%:*}"
done | sort -u >"$out/runtime-packages.txt"
echo "stage_runtime.sh: $(wc -l <"$out/runtime-packages.txt") runtime packages:" \
  "$(tr '\n' ' ' <"$out/runtime-packages.txt")"
