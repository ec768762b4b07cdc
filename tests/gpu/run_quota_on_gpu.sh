#!/usr/bin/env bash
# Two guests under device-memory quotas on the GPU machine (process mode):
# PyTorch and JAX at once, each a guest with --mem-limit 20G. Each sizes
# itself to its quota, is refused cleanly past it, and the other is
# unaffected; nvidia-smi and ivcudactl status show what the two hold meanwhile.
#   run_quota_on_gpu.sh BUILD_DIR
set -u
build=$(cd "${1:-build/gpu}" && pwd)
root=$(pwd)
out=${OUT:-$root/out}/quota
mkdir -p "$out"
. "$root/tests/lib/verdicts.sh"
py=${PYTHON:-python3}
sock=/tmp/ivcuda-quota.sock
ctl=/tmp/ivcuda-quota.ctl
rm -f "$sock"
"$build/host-daemon/ivcudad" --socket "$sock" --shm-size 2G --mem-limit 20G --driver libcuda.so.1 --control-socket "$ctl" \
  >"$out/ivcudad.log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
expect_cases 3
log=$out/ivcudad.log
mark=$(log_mark "$log")
guest() {  # NAME SCRIPT
  rm -f "$out/$1.pid"
  IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib QUOTA_GIB=20 timeout 240 "${tagged[@]}" "$out/$1.pid" \
    "$py" "$root/tests/frameworks/$2" >"$out/$1.out" 2>"$out/$1.err"
}
served() { served_by "$log" "$(cat "$out/$1.pid" 2>/dev/null || echo 0)" "$mark" || { echo "$1: not served by ivcudad"; return 1; }; }
guest torch quota_torch.py & t=$!
guest jax quota_jax.py & j=$!
peak=0
while kill -0 $t 2>/dev/null || kill -0 $j 2>/dev/null; do
  used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
  [ -n "$used" ] && [ "$used" -gt "$peak" ] && {
    peak=$used
    nvidia-smi >"$out/nvidia-smi.txt" 2>&1
    "$build/host-daemon/ivcudactl" --socket "$ctl" status >"$out/ivcudactl.txt" 2>&1
  }
  sleep 0.5
done
wait $t; rt=$?
wait $j; rj=$?
cat "$out/torch.out" "$out/jax.out"
[ $rt -ne 0 ] && tail -5 "$out/torch.err"
[ $rj -ne 0 ] && tail -5 "$out/jax.err"
verdict "PyTorch in a guest with a 20 GiB quota: sized to it, refused past it, works on" $rt
verdict "JAX at the same time in another guest with a 20 GiB quota: its pool is 75 % of the quota" $rj
echo "GPU memory used at the peak (nvidia-smi, both guests and their workers): $peak MiB"
grep -E "MiB|python|ivcudad" "$out/nvidia-smi.txt" | head -12
echo "ivcudactl status at the peak:"
cat "$out/ivcudactl.txt"
# Both served (their hellos in the log), the daemon still up, no worker killed by a signal.
served torch && served jax && kill -0 "$daemon" 2>/dev/null && ! grep -q "died of signal" "$log"
verdict "ivcudad served both to the end" $?
finish
