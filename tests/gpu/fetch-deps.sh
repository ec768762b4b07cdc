#!/usr/bin/env bash
# Downloads (does not install) the Debian packages the GPU machine lacks into
# .deps/, which the device tool carries there and run_gpu_suite.sh unpacks.
# nlohmann-json3-dev: ivcuda-bench writes its JSON with it.
# libseccomp-dev: its archive is linked into ivcudad (the workers' filter).
# strace and libunwind8 (its one library Ubuntu 24.04 lacks): for
# tests/gpu/trace_worker_syscalls.sh, which unpacks them into /tmp.
set -eu
cd "$(dirname "$0")/../.."
mkdir -p .deps
cd .deps
apt-get download liburing-dev liburing2 catch2 libcli11-dev nlohmann-json3-dev libseccomp-dev strace libunwind8
