#!/usr/bin/env bash
# Downloads (does not install) the Debian packages the GPU machine lacks into
# .deps/, which the device tool carries there and run_gpu_suite.sh unpacks.
set -eu
cd "$(dirname "$0")/../.."
mkdir -p .deps
cd .deps
apt-get download liburing-dev liburing2 catch2 libcli11-dev
