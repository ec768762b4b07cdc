#!/usr/bin/env bash
# Downloads (does not install) the Debian packages the GPU machine lacks into
# .deps/, which the device tool carries there and run_gpu_suite.sh unpacks.
# nlohmann-json3-dev: ivcuda-bench writes its JSON with it.
# libseccomp-dev: its archive is linked into ivcudad (the workers' filter).
# strace and libunwind8 (its one library Ubuntu 24.04 lacks): for
# tests/gpu/trace_worker_syscalls.sh, which unpacks them into /tmp.
# And the NVBench wheel cuda-bench[cu13] for the GPU machine's Python 3.12, into .deps/wheels
# (part "nvbench" of run_all.sh builds against it and puts it on PYTHONPATH; there is no pip there).
set -eu
cd "$(dirname "$0")/../.."
mkdir -p .deps
cd .deps
apt-get download liburing-dev liburing2 catch2 libcli11-dev nlohmann-json3-dev libseccomp-dev strace libunwind8
bash ../nvbench-configs/setup.sh --python-version 3.12 --no-cmake
# nvml.h for guest/nvml (unpacked into .deps/nvml/include, carried with .deps).
bash ../tools/fetch-nvml-header.sh
# gpustat and nvitop with their pure or abi3 dependencies, for tests/gpu/run_nvml_on_gpu.sh (d);
# the GPU machine's venv has nvidia-ml-py itself. gpustat comes only as an sdist (pure Python).
mkdir -p wheels/tools
python3 -m pip download --quiet --no-deps -d wheels/tools gpustat==1.1.1 nvitop==1.7.2
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d wheels/tools \
  psutil==7.2.2 blessed==1.52.0 jinxed==2.1.0 wcwidth==0.9.4 cachetools==8.0.2 termcolor==3.3.0
