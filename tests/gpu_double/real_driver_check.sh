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
# The double's sources and its tests, read from the same lists CMake builds them from
# (tests/gpu_double/CMakeLists.txt): a test file added there runs against the driver too.
cmake_list() {  # HEAD: the words after "HEAD" in the CMakeLists.txt, up to its closing parenthesis
  awk -v head="$1" '!on && (i = index($0, head)) { on = 1; $0 = substr($0, i + length(head)) }
    on { sub(/#.*/, ""); done = sub(/\).*/, ""); n = split($0, w, /[ \t]+/)
         for (k = 1; k <= n; ++k) if (w[k] != "") print w[k]; if (done) exit }' $T/CMakeLists.txt
}
mapfile -t double_srcs < <(cmake_list "add_library(ivcuda_gpu_double SHARED")
mapfile -t test_srcs < <(cmake_list "set(_double_tests")
echo "from $T/CMakeLists.txt: ${#double_srcs[@]} sources of the double, tests: ${test_srcs[*]}"
[ ${#double_srcs[@]} -gt 0 ] && [ ${#test_srcs[@]} -gt 0 ] || { echo "FAIL: the lists were not found there"; exit 1; }
g++ $FLAGS -fPIC -shared -o $W/libivcuda-gpu-double.so "${double_srcs[@]/#/$T/}" \
  -Wl,--version-script=$T/exports.map -Wl,--no-undefined -pthread || exit 1
echo "double built with $(g++ --version | head -1)"
TESTS="${test_srcs[*]/#/$T/} $T/test_support.cc tests/test_main.cc"
g++ $FLAGS $DEFS -o $W/on_double $TESTS -L$W -livcuda-gpu-double -Wl,-rpath,$W -pthread || exit 1
# shellcheck source=../lib/verdicts.sh
. tests/lib/verdicts.sh
g++ $FLAGS $DEFS -o $W/on_real $TESTS -L/usr/local/cuda/lib64/stubs -lcuda -pthread || exit 1
# The cases both builds hold but for [double_only]: the double's build lists them without a
# driver, so the count does not come from the build under test. (Catch2 v2's listing exits
# with the number of cases listed: not a status to judge.)
$W/on_double --list-test-names-only '~[double_only]' >$W/names 2>&1
mapfile -t names < <(grep . $W/names)
[ ${#names[@]} -gt 0 ] || { cat $W/names; echo "FAIL: the double's build lists no case"; exit 1; }
# the double's own run, the real build's list, one case per test case
expect_cases $((2 + ${#names[@]}))
$W/on_double -w NoTests >$W/on_double.log 2>&1; rc=$?
verdict "the double's own tests on the double ($(tail -2 $W/on_double.log | head -1))" $rc
$W/on_real --list-test-names-only '~[double_only]' >$W/real-names 2>&1
diff $W/names $W/real-names
listed=$?
verdict "the real-driver build lists the same ${#names[@]} test cases" $listed
# One process per test case; -w NoTests: a name that matches nothing fails.
for name in "${names[@]}"; do
  spec=${name//,/\\,}
  $W/on_real -w NoTests "$spec" >$W/case.out 2>&1; rc=$?
  [ $rc -ne 0 ] && grep -A8 'FAILED' $W/case.out | head -40
  verdict "real driver: $name" $rc
done
finish
