#!/usr/bin/env bash
# Installs what building and testing ivcuda needs on Debian 12 (root, apt).
# The CUDA 13 toolkit (nvcc, headers, the libcuda stub) is expected at
# /usr/local/cuda; it is not a Debian package.
#   tools/install-deps.sh          build + test dependencies, VM tests included
#   tools/install-deps.sh --build  only what building the daemon and library needs
set -euo pipefail
build=(cmake ninja-build g++ make pkg-config python3 liburing-dev libseccomp-dev libboost-dev catch2 libcli11-dev nlohmann-json3-dev
       python3-matplotlib libsystemd-dev libmicrohttpd-dev python3-pip)
# The fuzz preset's harnesses: libFuzzer comes with clang (Debian 12: clang 14; its runtimes,
# libFuzzer's included, are libclang-rt-14-dev).
fuzz=(clang libclang-rt-14-dev)
# The asan preset compiles with clang 16 (a sixth to a quarter less CPU than g++: docs/design.md)
# and links its sanitizer runtimes (libclang-rt-16-dev).
asan=(clang-16 libclang-rt-16-dev)
vm=(qemu-system-x86 linux-image-amd64 linux-headers-amd64 busybox-static kmod cpio xz-utils zstd dkms dpkg-dev
    libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients)  # tests/libvirt: a private session libvirtd
# The GPU test double reads compressed fatbins (cuBLAS's, cuFFT's) with these, loaded at run time.
testlibs=(libzstd1 liblz4-1)
# nvbench-configs/setup.sh fetches the NVBench wheel (cuda-bench) and a CMake >= 3.30.4 with pip.
nvbench=(python3-pip)
# Not fatal here: without them the test that builds against the wheel fails, saying why.
nvbench_setup() {
  [ "${1:-}" = "--build" ] || bash "$(dirname "$0")/../nvbench-configs/setup.sh" ||
    echo "install-deps: nvbench-configs/setup.sh failed (see above): nvbench_configs.build_against_wheel will fail" >&2
}
# nvml.h (not a Debian package, never committed): the guest's libnvidia-ml.so.1 is generated
# from it; pip fetches NVIDIA's wheel (python3-pip is in build: the build needs the header).
nvml_header() { bash "$(dirname "$0")/fetch-nvml-header.sh"; }
pkgs=("${build[@]}")
[ "${1:-}" = "--build" ] || pkgs+=("${vm[@]}" "${testlibs[@]}" "${fuzz[@]}" "${asan[@]}" "${nvbench[@]}")
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -eq 0 ]; then echo "install-deps: all ${#pkgs[@]} packages present"; nvml_header; nvbench_setup "${1:-}"; exit 0; fi
if ! command -v apt-get >/dev/null; then
  echo "install-deps: missing ${missing[*]} and no apt-get here" >&2; exit 1
fi
sudo=; [ "$(id -u)" -eq 0 ] || sudo=sudo
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: installed ${missing[*]}"
nvml_header
nvbench_setup "${1:-}"
