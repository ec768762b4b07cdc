#!/usr/bin/env bash
# ivcudactl suspend, resume, drain and undrain on the real driver (issue 34;
# host-daemon/daemon/suspend.h), process mode:
#   1. under each sandbox of IVCUDA_SUSPEND_SANDBOXES (default: on audit; under audit the
#      kernel's log names what the allowlist lacks for it; MODE:USER also runs the workers
#      and the checkpointer as USER, --user): a guest holding
#      IVCUDA_SUSPEND_MIB (4096) MiB with a pattern, calling every 10 ms
#      (tests/programs/drv_checkpoint.cc's target): the GPU's used memory before, while
#      suspended and after (nvidia-smi), another tenant (PyTorch, natively) taking and freeing
#      that memory meanwhile, IVCUDA_SUSPEND_HOLD_S (10) s suspended, then its pattern at the
#      same address, no failed call, and how long its longest call waited; lock, checkpoint
#      and restore times from ivcudactl.
#   Then under the first sandbox where 1 passed:
#   2. the cost per GiB: a guest of each size of IVCUDA_SUSPEND_SIZES (MiB; default 1024
#      16384) suspended and resumed, with 1's figures a table of lock, checkpoint and restore
#      times and their ms per GiB;
#   3. drain: three guests (1, 2 and 4 GiB) on GPU 0, ivcudactl drain 0 suspends them all,
#      another tenant takes their memory meanwhile, undrain brings them all back intact;
#   4. a PyTorch training guest (tests/frameworks/suspend_train.py) and
#   5. a JAX one (tests/frameworks/suspend_train_jax.py) suspended mid-run for the hold time:
#      their losses must equal a native run's, step for step.
#   run_suspend_on_gpu.sh BUILD_DIR          (writes $OUT/suspend/, prints a summary)
set -u
build=$(cd "${1:-build/gpu}" && pwd)
root=$(pwd)
out=${OUT:-$root/out}/suspend
mkdir -p "$out"
. "$root/tests/lib/verdicts.sh"
py=${PYTHON:-/opt/torch/.venv/bin/python}
ctl=$build/host-daemon/ivcudactl
mib=${IVCUDA_SUSPEND_MIB:-4096}
hold=${IVCUDA_SUSPEND_HOLD_S:-10}
modes=${IVCUDA_SUSPEND_SANDBOXES:-on audit}
sizes=${IVCUDA_SUSPEND_SIZES:-1024 16384}
expect_cases $(($(echo "$modes" | wc -w) + $(echo "$sizes" | wc -w) + 3))
used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }
# IVCUDA_SUSPEND_STRACE=1: each daemon runs under strace -f (tests/gpu/strace_env.sh), and a mode
# that fails prints the calls its checkpointer saw refused.
traced=()
if [ -n "${IVCUDA_SUSPEND_STRACE:-}" ]; then
  # shellcheck source=strace_env.sh
  . "$root/tests/gpu/strace_env.sh" || exit 1
  traced=("${strace_cmd[@]}" -f -qq -o)
fi
daemon=
stop_daemon() {
  [ -n "$daemon" ] || return 0
  kill "$daemon" 2>/dev/null
  [ ${#traced[@]} -eq 0 ] || pkill -f -- "--socket $sock " 2>/dev/null  # strace's daemon, not strace
  wait "$daemon" 2>/dev/null
  daemon=
}
trap 'stop_daemon' EXIT
start_daemon() {  # MODE[:USER]
  local user=() pre=()
  [[ $1 == *:* ]] && user=(--user "${1#*:}")
  sock=/tmp/ivcuda-suspend-${1/:/-}.sock csock=/tmp/ivcuda-suspend-${1/:/-}.ctl log=$out/ivcudad-${1/:/-}.log
  [ ${#traced[@]} -eq 0 ] || pre=("${traced[@]}" "$out/strace-${1/:/-}.txt")
  rm -f "$sock" "$csock"
  IVCUDA_SANDBOX=${1%%:*} "${pre[@]}" "$build/host-daemon/ivcudad" --socket "$sock" --control-socket "$csock" \
    --shm-size 2G --driver libcuda.so.1 "${user[@]}" >>"$log" 2>&1 &
  daemon=$!
  for _ in $(seq 200); do [ -S "$sock" ] && [ -S "$csock" ] && break; sleep 0.05; done
}
guest_of() {  # PID: its guest number from the daemon's log
  for _ in $(seq 100); do
    g=$(sed -n "s/.*guest \([0-9]*\): process $1 says hello.*/\1/p" "$log" | tail -1)
    [ -n "$g" ] && { echo "$g"; return; }
    sleep 0.05
  done
}
other_tenant() {  # MIB: natively, takes and frees MIB MiB; prints "took" and the used memory meanwhile
  "$py" - "$1" <<'PY'
import subprocess, sys, torch
x = torch.full((int(sys.argv[1]) << 20,), 1, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
u = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                   capture_output=True, text=True).stdout.split()[0]
print("took", u)
PY
}
# Guests holding a pattern (drv_checkpoint --child), each told "check" on a FIFO of its own.
declare -A tpid tfd
target_start() {  # NAME MIB
  local f=/tmp/ivcuda-suspend-$1.in fd
  rm -f "$f" && mkfifo "$f"
  IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib timeout 600 "$build/tests/bin/drv_checkpoint" --child --mib "$2" \
    <"$f" >"$out/target-$1.out" 2>&1 &
  tpid[$1]=$!
  exec {fd}>"$f"
  tfd[$1]=$fd
}
target_guest() {  # NAME: waits until it holds its memory; prints its guest number (nothing if it did not start)
  for _ in $(seq 1200); do grep -q '^ready\|^failed' "$out/target-$1.out" && break; sleep 0.05; done
  local prog
  prog=$(awk '$1 == "ready" {print $2}' "$out/target-$1.out")
  [ -n "$prog" ] && guest_of "$prog"
}
target_check() {  # NAME: it checks its memory and ends; 0 when intact with no failed call
  local fd=${tfd[$1]}
  echo check >&"$fd"
  for _ in $(seq 1200); do grep -q '^checked' "$out/target-$1.out" && break; sleep 0.05; done
  exec {fd}>&-
  wait "${tpid[$1]}"
}
# The cost table: "MiB lock checkpoint restore" (ms) per suspended guest.
rows=()
row() {  # MIB SUSPEND_OUTPUT RESUME_OUTPUT
  local l c r
  l=$(sed -n 's/.*(lock \([0-9.]*\) ms, checkpoint [0-9.]* ms).*/\1/p' "$2" | head -1)
  c=$(sed -n 's/.*(lock [0-9.]* ms, checkpoint \([0-9.]*\) ms).*/\1/p' "$2" | head -1)
  r=$(sed -n 's/.*(restore \([0-9.]*\) ms).*/\1/p' "$3" | head -1)
  rows+=("$1 ${l:-?} ${c:-?} ${r:-?}")
}

# --- 1. a 4 GiB guest suspended under each sandbox
worked=
for mode in $modes; do
  start_daemon "$mode"
  marks=$(dmesg 2>/dev/null | wc -l)
  echo "=== --sandbox $mode: a guest holding $mib MiB, suspended $hold s"
  target_start "$mode" "$mib"
  g=$(target_guest "$mode")
  ok=0
  [ -n "$g" ] || { ok=1; echo "the guest did not start"; cat "$out/target-$mode.out"; }
  before=$(used)
  "$ctl" --socket "$csock" suspend "${g:-0}" --wait 300 | tee "$out/suspend-$mode.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || ok=1
  during=$(used)
  tenant=$(other_tenant "$mib" 2>&1 | tail -1)
  sleep "$hold"
  "$ctl" --socket "$csock" resume "${g:-0}" --wait 300 | tee "$out/resume-$mode.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || ok=1
  after=$(used)
  target_check "$mode"; trc=$?
  checked=$(grep '^checked' "$out/target-$mode.out")
  echo "GPU memory used (MiB): before $before, suspended $during, another tenant's $mib MiB meanwhile: ${tenant:-none}, after resume $after"
  echo "the guest: ${checked:-nothing}"
  [ "$trc" -eq 0 ] || ok=1
  [ $((before - during)) -ge $((mib * 9 / 10)) ] || { ok=1; echo "the GPU's used memory fell by $((before - during)) MiB only"; }
  grep -E "suspend|resum|checkpointer" "$log" | grep -v "sandbox" | sed 's/^/  log: /' | head -12
  if [ "${mode%%:*}" = audit ]; then
    echo "the kernel's log while under audit (what the allowlist and Landlock lack):"
    dmesg 2>/dev/null | tail -n +$((marks + 1)) | grep -E "type=1326|landlock|audit" | sed -E 's/^\[[^]]*\] //' |
      sed -E 's/ (pid|ses|auid|uid|gid|ppid|tty|sig|arch|ip|code|old-ses)=[^ ]*//g' | sort | uniq -c | sort -rn | head -20
  fi
  stop_daemon
  cpid=$(sed -n 's/.*checkpointer started: pid \([0-9]*\).*/\1/p' "$log" | tail -1)
  if [ $ok -ne 0 ] && [ ${#traced[@]} -gt 0 ] && [ -n "$cpid" ]; then
    echo "calls refused (EACCES, EPERM) in any of the daemon's processes, and the checkpointer's (pid $cpid) failed ones:"
    grep -E "= -1 E(ACCES|PERM) |^$cpid +.*= -1 E(INVAL|BADF|NOSYS|OPNOTSUPP|SRCH|NXIO|FAULT)" "$out/strace-${mode/:/-}.txt" |
      cut -c1-220 | head -40
  fi
  verdict "--sandbox $mode: a guest's $mib MiB suspended (the GPU's used memory $before -> $during MiB, another tenant took them), resumed after $hold s intact, no call failed" $ok
  if [ $ok -eq 0 ] && [ -z "$worked" ]; then
    worked=$mode
    row "$mib" "$out/suspend-$mode.txt" "$out/resume-$mode.txt"
  fi
done

if [ -z "$worked" ]; then
  for size in $sizes; do not_run "a $size MiB guest suspended and resumed" "no sandbox mode suspended the 4 GiB guest"; done
  not_run "drain: three guests suspended and brought back" "no sandbox mode suspended the 4 GiB guest"
  not_run "PyTorch training suspended mid-run" "no sandbox mode suspended the 4 GiB guest"
  not_run "JAX training suspended mid-run" "no sandbox mode suspended the 4 GiB guest"
  finish
  exit
fi

# --- 2. the cost per GiB
start_daemon "$worked"
for size in $sizes; do
  echo "=== --sandbox $worked: a guest holding $size MiB, suspended and resumed"
  target_start "s$size" "$size"
  g=$(target_guest "s$size")
  ok=0
  [ -n "$g" ] || { ok=1; echo "the guest did not start"; cat "$out/target-s$size.out"; }
  before=$(used)
  "$ctl" --socket "$csock" suspend "${g:-0}" --wait 600 | tee "$out/suspend-s$size.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || ok=1
  during=$(used)
  sleep 1
  "$ctl" --socket "$csock" resume "${g:-0}" --wait 600 | tee "$out/resume-s$size.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || ok=1
  target_check "s$size" || ok=1
  echo "GPU memory used (MiB): before $before, suspended $during; the guest: $(grep '^checked' "$out/target-s$size.out")"
  [ $((before - during)) -ge $((size * 9 / 10)) ] || { ok=1; echo "the GPU's used memory fell by $((before - during)) MiB only"; }
  row "$size" "$out/suspend-s$size.txt" "$out/resume-s$size.txt"
  verdict "--sandbox $worked: a $size MiB guest suspended (the GPU's used memory $before -> $during MiB) and resumed intact" $ok
done
echo "=== suspend and resume times by the guest's device memory (--sandbox $worked; ivcudactl's figures)"
printf '%10s %10s %15s %12s %18s %16s\n' "MiB" "lock ms" "checkpoint ms" "restore ms" "checkpoint ms/GiB" "restore ms/GiB"
for r in "${rows[@]}"; do
  read -r m l c rs <<<"$r"
  awk -v m="$m" -v l="$l" -v c="$c" -v r="$rs" 'BEGIN {
    printf "%10d %10s %15s %12s %18.0f %16.0f\n", m, l, c, r, c / (m / 1024), r / (m / 1024) }'
done

# --- 3. drain: every guest on GPU 0 suspended at once, and brought back
echo "=== --sandbox $worked: drain GPU 0 with three guests (1, 2 and 4 GiB)"
ok=0
for n in 1024 2048 4096; do target_start "d$n" "$n"; done
for n in 1024 2048 4096; do [ -n "$(target_guest "d$n")" ] || { ok=1; echo "guest d$n did not start"; }; done
before=$(used)
"$ctl" --socket "$csock" drain 0 --wait 600 | tee "$out/drain.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || ok=1
during=$(used)
[ "$(grep -c ': suspended: ' "$out/drain.txt")" -eq 3 ] || { ok=1; echo "not three guests suspended"; }
tenant=$(other_tenant 7168 2>&1 | tail -1)
"$ctl" --socket "$csock" status | tee "$out/drain-status.txt" | head -8
"$ctl" --socket "$csock" undrain 0 --wait 600 | tee "$out/undrain.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || ok=1
[ "$(grep -c ': serving again: ' "$out/undrain.txt")" -eq 3 ] || { ok=1; echo "not three guests resumed"; }
after=$(used)
for n in 1024 2048 4096; do
  target_check "d$n" || { ok=1; echo "guest d$n: $(tail -1 "$out/target-d$n.out")"; }
done
grep '^checked' "$out"/target-d*.out | sed 's/^/  /'
echo "GPU memory used (MiB): before $before, drained $during, another tenant's 7168 MiB meanwhile: ${tenant:-none}, after undrain $after"
[ $((before - during)) -ge $((7168 * 9 / 10)) ] || { ok=1; echo "the GPU's used memory fell by $((before - during)) MiB only"; }
stop_daemon
verdict "drain GPU 0: three guests (7 GiB) suspended at once (the GPU's used memory $before -> $during MiB, another tenant took 7 GiB), undrain brought all three back intact" $ok

# --- 4 and 5. training suspended mid-run: the same losses as natively
# train NAME SCRIPT ENV...: natively, then through ivcuda suspended $hold s at step 100.
train() {
  local name=$1 script=$2 tr at
  shift 2
  echo "=== $name training, natively"
  env "$@" "$py" "$script" 300 >"$out/train-$name-native.out" 2>&1
  local ok=$?
  [ $ok -eq 0 ] || tail -5 "$out/train-$name-native.out"
  start_daemon "$worked"
  local mark
  mark=$(log_mark "$log")  # the log goes on from earlier daemons: only this run's hello counts
  echo "=== $name training through ivcuda (--sandbox $worked), suspended $hold s at step 100"
  env "$@" IVCUDA_SOCKET="$sock" LD_LIBRARY_PATH="$build/lib" timeout 400 "$py" "$script" 300 \
    >"$out/train-$name-ivcuda.out" 2>&1 &
  tr=$!
  for _ in $(seq 2400); do grep -q '^step 100 ' "$out/train-$name-ivcuda.out" && break; sleep 0.05; done
  g=$(tail -c +$((mark + 1)) "$log" | sed -n 's/.*guest \([0-9]*\): process [0-9]* says hello.*/\1/p' | tail -1)
  [ -n "$g" ] || { ok=1; echo "the training guest was not served by ivcudad (no hello in its log)"; }
  before=$(used)
  "$ctl" --socket "$csock" suspend "${g:-0}" --wait 300 | tee "$out/train-$name-suspend.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || ok=1
  at=$(grep -c '^step' "$out/train-$name-ivcuda.out")
  during=$(used)
  sleep "$hold"
  [ "$(grep -c '^step' "$out/train-$name-ivcuda.out")" -eq "$at" ] || { ok=1; echo "it made steps while suspended"; }
  "$ctl" --socket "$csock" resume "${g:-0}" --wait 300 | tee "$out/train-$name-resume.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || ok=1
  after=$(used)
  wait "$tr" || { ok=1; tail -5 "$out/train-$name-ivcuda.out"; }
  stop_daemon
  echo "GPU memory used (MiB): before $before, suspended at step $at $during, after resume $after"
  [ "$before" -gt "$during" ] || { ok=1; echo "the GPU's used memory did not fall"; }
  if [ "$(grep -c '^step' "$out/train-$name-native.out")" -eq 300 ] &&
    cmp -s <(grep '^step\|^done' "$out/train-$name-native.out") <(grep '^step\|^done' "$out/train-$name-ivcuda.out"); then
    echo "losses: 300 steps, identical to the native run's; last: $(grep '^step' "$out/train-$name-ivcuda.out" | tail -1)"
  else
    ok=1
    echo "losses DIFFER (or a run did not finish):"
    diff <(grep '^step\|^done' "$out/train-$name-native.out") <(grep '^step\|^done' "$out/train-$name-ivcuda.out") | head -5
  fi
  verdict "$name training suspended $hold s at step $at (--sandbox $worked): its losses identical to native, step for step" $ok
}
train PyTorch "$root/tests/frameworks/suspend_train.py"
train JAX "$root/tests/frameworks/suspend_train_jax.py" XLA_PYTHON_CLIENT_PREALLOCATE=false
finish
