#!/usr/bin/env bash
# Fetches nvml.h (CUDA 13.0's, from NVIDIA's PyPI wheel nvidia-nvml-dev) into
# .deps/nvml/include/nvml.h, where CMake's IVCUDA_NVML_INCLUDE_DIR looks by
# default. The header is NVIDIA's and is never committed; the guest's
# libnvidia-ml.so.1 (guest/nvml) is generated from it.
# Run by tools/install-deps.sh and tests/gpu/fetch-deps.sh (the GPU machine has no
# network: the header travels in the carried .deps/). Does nothing when the header is there.
# The version is pinned to the toolkit's (13.0): a newer nvml.h declares functions the
# CUDA 13.0 driver does not have.
set -euo pipefail
version=13.0.87
root=$(cd "$(dirname "$0")/.." && pwd)
wheels=$root/.deps/wheels
dest=$root/.deps/nvml/include
wheel=$wheels/nvidia_nvml_dev-$version-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl

# And NVIDIA's Python binding, nvidia-ml-py (pure Python), which the QEMU guest test runs unchanged
# over the guest's libnvidia-ml.so.1 (tests/guest_vm/pynvml_check.py); the release for driver 580.
pyversion=13.580.82
mkdir -p "$wheels"
if [ ! -f "$wheels/nvidia_ml_py-$pyversion-py3-none-any.whl" ]; then
  python3 -m pip download --quiet --no-deps --dest "$wheels" "nvidia-ml-py==$pyversion"
fi
if [ -f "$dest/nvml.h" ] && grep -q "NVML_API_VERSION" "$dest/nvml.h"; then
  echo "fetch-nvml-header: $dest/nvml.h present"; exit 0
fi
if [ ! -f "$wheel" ]; then
  python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
    --dest "$wheels" "nvidia-nvml-dev==$version"
fi
[ -f "$wheel" ] || { echo "fetch-nvml-header: $wheel was not downloaded" >&2; exit 1; }
mkdir -p "$dest"
python3 - "$wheel" "$dest/nvml.h" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[2] + ".tmp", "wb") as out:
    out.write(z.read("nvidia/cu13/include/nvml.h"))
import os
os.replace(sys.argv[2] + ".tmp", sys.argv[2])
PY
echo "fetch-nvml-header: nvml.h $version -> $dest/nvml.h"
