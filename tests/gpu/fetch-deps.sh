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
