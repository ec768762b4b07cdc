#!/usr/bin/env bash
# The long fuzz run: every harness at once, for a fixed time, on N cores.
#   tests/fuzz/long_run.sh DIR CORES SECONDS [OUT]
# DIR holds the harnesses (worker_fuzz, ivshmem_fuzz, reply_fuzz), libivcuda-gpu-double.so
# and libivcuda-nvml-double.so, copied from build/fuzz (tests/fuzz/README.md); it needs
# no clang, no CUDA and no liburing (linked statically). Without the NVML double every
# NVML request would stop at LIBRARY_NOT_FOUND, so the run refuses to start without it.
# Run from the repository root: the seeds and regression inputs of tests/fuzz/corpus are
# replayed first, with each harness's dictionary (tests/fuzz/<harness>.dict).
# Cores are shared out one process each, worker_fuzz getting the remainder: each
# process fuzzes until the time is up, restarting after a crash (the crash is
# counted and its input kept under OUT, default fuzz-long-run/). Processes of one
# harness share a corpus directory (libFuzzer reloads it). Prints per harness the
# executions, exec/s and crashes, and a total line; exits 1 if anything crashed.
set -uo pipefail
dir=$(cd "${1:?usage: long_run.sh DIR CORES SECONDS [OUT]}" && pwd)
cores=${2:?cores}
secs=${3:?seconds}
out=${4:-fuzz-long-run}
harnesses=(worker_fuzz ivshmem_fuzz reply_fuzz)
corpus=tests/fuzz/corpus
[ -d "$corpus" ] || { echo "long_run: run it from the repository root (no $corpus here)"; exit 2; }
for h in "${harnesses[@]}"; do [ -x "$dir/$h" ] || { echo "long_run: $dir/$h missing"; exit 2; }; done
for lib in libivcuda-gpu-double.so libivcuda-nvml-double.so; do
  [ -f "$dir/$lib" ] || { echo "long_run: $dir/$lib missing (tests/fuzz/README.md, \"Long run\")"; exit 2; }
done
export IVCUDA_FUZZ_DOUBLE="$dir/libivcuda-gpu-double.so"
export IVCUDA_FUZZ_NVML_DOUBLE="$dir/libivcuda-nvml-double.so"
mkdir -p "$out"
out=$(cd "$out" && pwd)
n=${#harnesses[@]}
[ "$cores" -ge "$n" ] || { echo "long_run: at least $n cores (one per harness)"; exit 2; }

# One core's loop: fuzz until the deadline, again after each crash.
run_core() {
  local h=$1 core=$2 deadline=$3 k=0 left
  mkdir -p "$out/$h/corpus" "$out/$h/crashes"
  while left=$((deadline - $(date +%s))); [ "$left" -gt 0 ]; do
    k=$((k + 1))
    local dict=()
    [ ! -f "tests/fuzz/$h.dict" ] || dict=(-dict="tests/fuzz/$h.dict")
    "$dir/$h" -max_total_time="$left" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 "${dict[@]}" \
      -artifact_prefix="$out/$h/crashes/" "$out/$h/corpus" "$corpus/$h" \
      >"$out/$h/log.$core.$k" 2>&1
    local rc=$?
    [ "$rc" -eq 0 ] && break
    echo "$rc" >>"$out/$h/failures.$core"
  done
}

deadline=$(( $(date +%s) + secs ))
pids=()
for i in $(seq 0 $((cores - 1))); do
  if [ "$i" -lt $(( (cores / n) * n )) ]; then h=${harnesses[$((i % n))]}; else h=worker_fuzz; fi
  run_core "$h" "$i" "$deadline" &
  pids+=($!)
done
wait "${pids[@]}"

total=0
crashes_all=0
printf '%-14s %6s %16s %12s %8s\n' harness procs executions "exec/s" crashes
for h in "${harnesses[@]}"; do
  execs=0 procs=0
  for log in "$out/$h"/log.*; do
    [ -f "$log" ] || continue
    # The final stats, or (a run that died without them) the last status line.
    e=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    [ -n "$e" ] || e=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
    execs=$((execs + ${e:-0}))
  done
  procs=$(ls "$out/$h"/log.*.1 2>/dev/null | wc -l)
  crashes=$(find "$out/$h/crashes" -type f | wc -l)
  fails=$(cat "$out/$h"/failures.* 2>/dev/null | wc -l)
  [ "$fails" -gt "$crashes" ] && crashes=$fails
  printf '%-14s %6d %16d %12d %8d\n' "$h" "$procs" "$execs" $((execs / secs)) "$crashes"
  total=$((total + execs))
  crashes_all=$((crashes_all + crashes))
done
echo "total executions: $total, crashes: $crashes_all (${secs} s on $cores cores; logs and inputs in $out)"
[ "$crashes_all" -eq 0 ]
