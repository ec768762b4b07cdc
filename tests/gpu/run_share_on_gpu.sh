#!/usr/bin/env bash
# Shared device memory on the GPU machine (process mode, the real driver): what
# the CI hostile tests show with the test double (tests/process/hostile_tenant_test.cc),
# here with the GPU's own memory as the witness (docs/design.md, "Tenants and what
# they share").
#  - allocations created exportable, exported and released stay charged to their
#    exporter (the quota shows none free and refuses one more), and stay on the GPU
#    while the exporter lives (nvidia-smi);
#  - they leave the GPU when the exporter leaves, though a warm worker stays (the
#    daemon keeps no deposit of a guest that left);
#  - an IPC-opened allocation of another process counts against the opener.
#   run_share_on_gpu.sh BUILD_DIR [DRIVER]   (DRIVER: libcuda.so.1; on a CPU machine the
#   GPU test double, where the nvidia-smi cases cannot run)
set -u
build=$(cd "${1:-build/gpu}" && pwd)
driver=${2:-libcuda.so.1}
root=$(pwd)
out=${OUT:-$root/out}/share
mkdir -p "$out"
. "$root/tests/lib/verdicts.sh"
. "$root/tests/lib/daemon.sh"
py=${PYTHON:-python3}
probe=$root/tests/gpu/share_probe.py
sock=/tmp/ivcuda-share.sock
trap stop_ivcudad EXIT
start_ivcudad "$out/ivcudad.log" --socket "$sock" --shm-size 1G --mem-limit 4G --warm-workers 1 --driver "$driver" || exit 1
expect_cases 5
gib=$((1 << 30))
used_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null | head -1; }
have_smi=0
command -v nvidia-smi >/dev/null 2>&1 && [ -n "$(used_mib)" ] && have_smi=1
through() { IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib timeout 120 "$py" "$probe" "$@"; }
value() { sed -n "s/^$1=//p" "$2" | tail -1; }

sleep 4  # the warm worker holds its context by now
m0=$(used_mib)
# 3 x 1 GiB exported and released under a 4 GiB quota: charged, they leave at most 1 GiB free
# (less where the worker's context is charged too), and 2 GiB more are refused; uncharged, 2 GiB
# would fit.
through export 3 1024 8 >"$out/export.txt" 2>&1 &
probe_pid=$!
for _ in $(seq 200); do grep -q holding "$out/export.txt" && break; sleep 0.1; done
sleep 1
m1=$(used_mib)
wait $probe_pid
rc=$?
cat "$out/export.txt"
free=$(value free_after_exports "$out/export.txt")
more=$(value twice_more_create "$out/export.txt")
[ $rc -eq 0 ] && [ -n "$free" ] && [ "$free" -le $gib ] && [ "${more:-x}" = 2 ]
verdict "exported and released allocations stay charged: at most 1 of 4 GiB free, 2 GiB more refused" $?
sleep 3  # the daemon reaps the exporter's worker; a new warm worker starts
m2=$(used_mib)
echo "GPU memory used: ${m0:-?} MiB before, ${m1:-?} MiB while the exporter held 3 GiB, ${m2:-?} MiB after it left"
if [ $have_smi -eq 1 ]; then
  [ $((m1 - m0)) -ge 3072 ]
  verdict "the GPU holds exported and released memory while its exporter lives" $?
  d=$((m2 - m0))
  [ ${d#-} -lt 512 ]
  verdict "the GPU frees it when the exporter leaves, though a warm worker stays" $?
else
  not_run "the GPU holds exported and released memory while its exporter lives" "no nvidia-smi"
  not_run "the GPU frees it when the exporter leaves, though a warm worker stays" "no nvidia-smi"
fi
through ipc 1024 >"$out/ipc.txt" 2>&1
rc=$?
cat "$out/ipc.txt"
before=$(value free_before_open "$out/ipc.txt")
after=$(value free_after_open "$out/ipc.txt")
[ $rc -eq 0 ] && [ -n "$before" ] && [ -n "$after" ] && [ $((before - after)) -ge $gib ]
verdict "an IPC-opened allocation of another process counts against the opener's quota" $?
! grep -q "died of signal" "$out/ivcudad.log"
verdict "ivcudad served to the end" $?
finish
