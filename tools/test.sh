#!/usr/bin/env bash
# The test command (README; CI runs exactly this through .ci/run): installs
# the dependencies, builds every preset and runs every test.
#  - default: all tests, the VM tests under QEMU and the process-mode tests
#    against the GPU test double included;
#  - asan (AddressSanitizer + UBSan): all tests but the VM ones;
#  - tsan (ThreadSanitizer): the ring and transport tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
export PATH=/usr/local/cuda/bin:$PATH
jobs=${IVCUDA_JOBS:-$(nproc)}
for preset in default asan tsan; do
  echo "=== configure + build: $preset"
  cmake --preset "$preset" >/dev/null
  if [ "$preset" = tsan ]; then
    cmake --build --preset tsan -j "$jobs" --target ivcuda_ring_tests
  else
    cmake --build --preset "$preset" -j "$jobs"
  fi
done
echo "=== tests: tsan (ring, transport)"
ctest --preset tsan -L "^(ring|transport)$" -j "$jobs"
echo "=== tests: asan"
ctest --preset asan -LE "^vm$" -j "$jobs"
echo "=== tests: default"
ctest --preset default -j "$jobs"
