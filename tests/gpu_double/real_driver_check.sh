#!/bin/bash
# Runs the GPU test double's own tests against a REAL driver (on a machine with a GPU), to
# check that the double answers as the driver does. Tests tagged [double_only] are left out;
# each test case runs in a process of its own, since a faulting kernel poisons the real
# driver for the rest of its process. Also builds the double with this machine's g++.
#
# Usage, from the repository root:
#   CATCH2_V2_INCLUDE=/dir tests/gpu_double/real_driver_check.sh
# where /dir holds catch2/catch.hpp of Catch2 v2 (default /usr/include).
set -u
T=tests/gpu_double
W=$(mktemp -d)
INC=${CATCH2_V2_INCLUDE:-/usr/include}
nvcc -ptx -arch=compute_90 $T/test_kernels.cu -o $W/k.ptx || exit 1
nvcc -fatbin --no-compress -gencode arch=compute_90,code=compute_90 $T/test_kernels.cu \
  -o $W/k.fatbin || exit 1
FLAGS="-std=c++20 -O1 -g -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align
  -Wformat=2 -Wimplicit-fallthrough -Werror -I/usr/local/cuda/include -I$INC"
DEFS="-DIVCUDA_TEST_KERNELS_PTX=\"$W/k.ptx\" -DIVCUDA_TEST_KERNELS_FATBIN=\"$W/k.fatbin\""
g++ $FLAGS -fPIC -shared -o $W/libivcuda-gpu-double.so $T/api_*.cc $T/image.cc $T/kernels.cc \
  $T/state.cc -Wl,--version-script=$T/exports.map -Wl,--no-undefined -pthread || exit 1
echo "double built with $(g++ --version | head -1)"
TESTS="$T/handles_test.cc $T/library_test.cc $T/vmm_test.cc $T/device_test.cc $T/context_test.cc $T/memory_test.cc
  $T/stream_test.cc $T/module_test.cc $T/test_support.cc tests/test_main.cc"
g++ $FLAGS $DEFS -o $W/on_double $TESTS -L$W -livcuda-gpu-double -Wl,-rpath,$W -pthread || exit 1
# shellcheck source=../lib/verdicts.sh
. tests/lib/verdicts.sh
$W/on_double -w NoTests >$W/on_double.log 2>&1; rc=$?
verdict "the double's own tests on the double ($(tail -2 $W/on_double.log | head -1))" $rc
g++ $FLAGS $DEFS -o $W/on_real $TESTS -L/usr/local/cuda/lib64/stubs -lcuda -pthread || exit 1
names=$($W/on_real --list-test-names-only '~[double_only]')
[ -n "$names" ]; verdict "the real-driver build lists $(echo "$names" | grep -c .) test cases" $?
# One process per test case; -w NoTests: a name that matches nothing fails.
while IFS= read -r name; do
  [ -z "$name" ] && continue
  spec=${name//,/\\,}
  out=$($W/on_real -w NoTests "$spec" 2>&1); rc=$?
  [ $rc -ne 0 ] && echo "$out" | grep -A8 'FAILED' | head -40
  verdict "real driver: $name" $rc
done <<<"$names"
finish
