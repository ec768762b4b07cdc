#!/usr/bin/env bash
# Compute shares on the GPU machine: a compute-bound loop (bench/compute_share.cc)
# alone and two at once, natively and through ivcuda (process mode), without
# MPS (the driver time-slices) and with MPS at 50/50 and 75/25 (natively:
# CUDA_MPS_ACTIVE_THREAD_PERCENTAGE per client; ivcuda: ivcudad --mps with
# one socket per guest, compute=N). Prints kernels/s per run and each side's
# share, ivcuda next to native; ivcudactl status while ivcuda runs 75/25.
#   run_mps_share.sh BUILD_DIR
set -u
build=$(cd "${1:-build/gpu}" && pwd)
root=$(pwd)
out=${OUT:-$root/out}/mps
mkdir -p "$out"
. "$root/tests/lib/verdicts.sh"
expect_cases 4
secs=${IVCUDA_SHARE_SECONDS:-5}
ptx=$build/tests/gpu_double/test_kernels.ptx
prog=$build/bench/ivcuda-compute-share
mpsdir=/tmp/ivcuda-mps-share
# Only the MPS runs see these (a client finding no control daemon there would run without MPS anyway).
mpsenv="CUDA_MPS_PIPE_DIRECTORY=$mpsdir/pipe CUDA_MPS_LOG_DIRECTORY=$mpsdir/log"
mkdir -p "$mpsdir/pipe" "$mpsdir/log"
daemon=
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
  echo quit | env $mpsenv nvidia-cuda-mps-control >/dev/null 2>&1
}
trap cleanup EXIT

# one LABEL [ENV...]: a run alone. two LABEL ENV_A ENV_B: two at once, same start.
# A run through ivcuda (IVCUDA_SOCKET among its ENV) must be served: ivcudad's log shows that
# very process (one that found this machine's libcuda.so.1 would match native and prove nothing).
log=$out/ivcudad.log
run() {  # LABEL ENV... -- ARGS...
  local label=$1 envs=() pidf mark rc
  shift
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  pidf=$out/$(echo "$label" | tr / _).pid
  rm -f "$pidf"
  mark=$(log_mark "$log")
  env "${envs[@]}" "${tagged[@]}" "$pidf" "$prog" --ptx "$ptx" --seconds "$secs" --label "$label" "$@" \
    >>"$out/runs.jsonl" 2>>"$out/errors.txt"
  rc=$?
  case " ${envs[*]} " in
    *" IVCUDA_SOCKET="*)
      if ! served_by "$log" "$(cat "$pidf" 2>/dev/null || echo 0)" "$mark"; then
        echo "$label: not served by ivcudad (no hello from its process in $log)"
        echo "$label" >>"$out/unserved.txt"  # a file: two() runs its sides in subshells
        rc=1
      fi ;;
  esac
  return $rc
}
one() {
  local label=$1
  shift
  run "$label" "$@" --
}
two() {
  local label=$1 a=$2 b=$3 at
  at=$(( $(date +%s%3N) + 3000 ))
  # shellcheck disable=SC2086 # each side's environment, word by word
  run "$label/A" $a -- --start-at "$at" &
  local pa=$!
  # shellcheck disable=SC2086
  run "$label/B" $b -- --start-at "$at" &
  local pb=$!
  wait $pa && wait $pb
}
ivcuda_env() { echo "IVCUDA_SOCKET=$1 LD_LIBRARY_PATH=$build/lib"; }
start_ivcudad() {  # ARGS...
  rm -f /tmp/ivcuda-share-*.sock
  "$build/host-daemon/ivcudad" --socket /tmp/ivcuda-share-a.sock --shm-size 512M --driver libcuda.so.1 \
    --control-socket /tmp/ivcuda-share.ctl "$@" >>"$out/ivcudad.log" 2>&1 &
  daemon=$!
  for _ in $(seq 100); do [ -S /tmp/ivcuda-share-a.sock ] && [ -S /tmp/ivcuda-share-b.sock ] && break; sleep 0.05; done
}
stop_ivcudad() { kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null; daemon=; }
: >"$out/runs.jsonl"
rm -f "$out/unserved.txt"

rc=0
# Without MPS: the driver time-slices.
one native/alone || rc=1
two native/timesliced "X=1" "X=1" || rc=1
start_ivcudad --guest-socket /tmp/ivcuda-share-b.sock=0
one ivcuda/alone $(ivcuda_env /tmp/ivcuda-share-a.sock) || rc=1
two ivcuda/timesliced "$(ivcuda_env /tmp/ivcuda-share-a.sock)" "$(ivcuda_env /tmp/ivcuda-share-b.sock)" || rc=1
stop_ivcudad
verdict "no MPS: alone and two at once, natively and through ivcuda" $rc

# MPS natively: a control daemon of our own, clients with their percentage.
rc=0
env $mpsenv nvidia-cuda-mps-control -d || rc=1
one native/mps50-alone $mpsenv CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 || rc=1
two native/mps50-50 "$mpsenv CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" "$mpsenv CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" || rc=1
two native/mps75-25 "$mpsenv CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=75" "$mpsenv CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" || rc=1
echo quit | env $mpsenv nvidia-cuda-mps-control >/dev/null 2>&1
sleep 1
verdict "MPS natively: 50 alone, 50/50, 75/25" $rc

# Through ivcuda: ivcudad starts MPS itself, one socket per guest.
rc=0
start_ivcudad --mps --mps-pipe-dir "$mpsdir/pipe" --mps-log-dir "$mpsdir/log" --compute-share 50 \
  --guest-socket /tmp/ivcuda-share-b.sock=0:compute=50
one ivcuda/mps50-alone $(ivcuda_env /tmp/ivcuda-share-a.sock) || rc=1
two ivcuda/mps50-50 "$(ivcuda_env /tmp/ivcuda-share-a.sock)" "$(ivcuda_env /tmp/ivcuda-share-b.sock)" || rc=1
stop_ivcudad
start_ivcudad --mps --mps-pipe-dir "$mpsdir/pipe" --mps-log-dir "$mpsdir/log" --compute-share 75 \
  --guest-socket /tmp/ivcuda-share-b.sock=0:compute=25
( sleep $((secs / 2 + 4)); "$build/host-daemon/ivcudactl" --socket /tmp/ivcuda-share.ctl status >"$out/ivcudactl.txt" 2>&1 ) &
snap=$!
two ivcuda/mps75-25 "$(ivcuda_env /tmp/ivcuda-share-a.sock)" "$(ivcuda_env /tmp/ivcuda-share-b.sock)" || rc=1
wait $snap
stop_ivcudad
verdict "MPS through ivcuda (ivcudad --mps): 50 alone, 50/50, 75/25" $rc
[ -s "$out/errors.txt" ] && { echo "--- errors"; tail -20 "$out/errors.txt"; }
grep -E "MPS|driver loads with" "$out/ivcudad.log" | sort -u | head -8

python3 - "$out/runs.jsonl" <<'PY'
import json, sys
runs = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        r = json.loads(line)
        runs[r["label"]] = r["kernels_per_s"]
alone = runs.get("native/alone")
if not alone:
    sys.exit("no native baseline")
print(f"\ncompute-bound loop, kernels/s (share = of the native run alone, {alone:.1f}/s)")
print(f"{'scenario':<16}{'native A':>10}{'native B':>10}{'ivcuda A':>10}{'ivcuda B':>10}"
      f"{'share A n/i':>14}{'share B n/i':>14}")
ok = True
for sc in ["alone", "timesliced", "mps50-alone", "mps50-50", "mps75-25"]:
    keys = [f"{sc}"] if sc.endswith("alone") else [f"{sc}/A", f"{sc}/B"]
    n = [runs.get(f"native/{k}") for k in keys]
    i = [runs.get(f"ivcuda/{k}") for k in keys]
    fmt = lambda v: f"{v:10.1f}" if v else f"{'-':>10}"
    share = lambda v: f"{100 * v / alone:5.1f}%" if v else "  -  "
    na, nb = (n + [None])[:2]
    ia, ib = (i + [None])[:2]
    print(f"{sc:<16}{fmt(na)}{fmt(nb)}{fmt(ia)}{fmt(ib)}"
          f"{share(na) + '/' + share(ia):>14}{(share(nb) + '/' + share(ib)) if nb else '':>14}")
    for a, b in ((na, ia), (nb, ib)):
        if a and b and abs(b / a - 1) > 0.10:
            ok = False
print("ivcuda within 10 % of native in every run" if ok else "SOME RUN DIFFERS FROM NATIVE BY MORE THAN 10 %")
sys.exit(0 if ok else 1)
PY
rc=$?
# The shares compared must all come from runs ivcudad served.
[ -s "$out/unserved.txt" ] && { echo "not served by ivcudad: $(paste -sd' ' "$out/unserved.txt")"; rc=1; }
verdict "each guest's compute share through ivcuda matches the same share natively (within 10 %)" $?
echo "ivcudactl status during ivcuda 75/25:"
cat "$out/ivcudactl.txt" 2>/dev/null
finish
