#!/usr/bin/env bash
# Adds NVIDIA's CUDA repository for Debian 12 to an image. `devel` also installs what the CUDA
# build needs (nvcc, CUDA runtime and cuBLAS headers, CCCL, NCCL); `repo` only adds the repository,
# from which the runtime stage installs the libraries the binaries link.
# Usage: cuda_apt.sh repo|devel CUDA_VERSION (e.g. 13.0)
set -euo pipefail
mode=$1
v=${2//./-}  # package names spell 13.0 as 13-0
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends ca-certificates curl
curl -fsSL -o /tmp/cuda-keyring.deb \
  https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb
dpkg -i /tmp/cuda-keyring.deb
rm /tmp/cuda-keyring.deb
apt-get update -qq
case "$mode" in
  devel)
    apt-get install -y -qq --no-install-recommends "cuda-nvcc-$v" "cuda-cudart-dev-$v" \
      "cuda-cccl-$v" "libcublas-dev-$v" libnccl-dev ;;
  repo) ;;
  *) echo "cuda_apt.sh: mode must be repo or devel, got '$mode'" >&2; exit 2 ;;
esac
rm -rf /var/lib/apt/lists/*
