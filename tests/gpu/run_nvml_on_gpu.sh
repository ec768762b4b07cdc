#!/usr/bin/env bash
# NVML for guests on the GPU machine (issue 15), process mode: ivcudad with the
# host's real NVML, and guests that load ivcuda's libnvidia-ml.so.1.
#   (a) pynvml through ivcuda vs the host's NVML (tests/frameworks/nvml_compare.py):
#       name, UUID, memory total, PCI bus id identical; memory used is what the
#       guest's worker holds (covering what it allocated); the process list is the
#       guest's process alone, by its pid, while a native CUDA process also holds memory;
#   (b) ivcuda-smi (-L, the table, --query-gpu) and the driver's own nvidia-smi
#       binary against the guest library: what each prints is recorded, and
#       ivcuda-smi must succeed (nvidia-smi's output is recorded for a reader, not
#       a case);
#   (c) torch.cuda.list_gpu_processes() and utilization() through ivcuda: the
#       guest's own process alone;
#   (d) gpustat and nvitop -1, natively and through ivcuda: each run names the GPU;
#   (e) every query pynvml offers (tests/frameworks/nvml_survey.py), natively and through
#       ivcuda: the same codes, the same values where stable and the GPU's own;
#   (f) JAX's start: no NVML error line through ivcuda that its native start lacks.
# Every run through ivcuda counts only if ivcudad's log shows that very process served
# (served_by): one that loaded this machine's libnvidia-ml.so.1 or libcuda.so.1 would agree
# with native and prove nothing.
#   run_nvml_on_gpu.sh BUILD_DIR     (repository root; BUILD_DIR holds ivcudad, lib/, bin/)
# SMI=PATH overrides ivcuda-smi's path; PYTHON the interpreter (it needs
# nvidia-ml-py and torch: /opt/torch/.venv/bin/python on the GPU machine).
set -u
build=$(cd "${1:-build/gpu}" && pwd)
root=$(pwd)
out=${OUT:-$root/out}/nvml
mkdir -p "$out"
. "$root/tests/lib/verdicts.sh"
py=${PYTHON:-/opt/torch/.venv/bin/python}
[ -x "$py" ] || py=python3
smi=${SMI:-$build/bin/ivcuda-smi}
sock=/tmp/ivcuda-nvml.sock
work=$(mktemp -d /tmp/ivcuda-nvml.XXXXXX)
rm -f "$sock" "$out/ivcuda-smi.txt" "$out/nvidia-smi-guest.txt"
tools=("gpustat" "nvitop -1")
# pynvml, ivcuda-smi's two, torch's two, each tool, the survey, JAX's start and the daemon's own
expect_cases $((5 + ${#tools[@]} + 3))

log=$out/ivcudad.log
# The host's NVML, as the workers load it (the default --nvml; named here so the log says).
# DAEMON_ARGS: more ivcudad options (e.g. --sandbox off, to tell the sandbox's part).
# shellcheck disable=SC2086
"$build/host-daemon/ivcudad" --socket "$sock" --shm-size 2G --driver libcuda.so.1 --nvml libnvidia-ml.so.1 \
  --log-level debug ${DAEMON_ARGS:-} >"$log" 2>&1 &
daemon=$!
native_holder=
trap 'kill $daemon $native_holder 2>/dev/null; wait $daemon 2>/dev/null' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
guest_env=(env IVCUDA_SOCKET="$sock" LD_LIBRARY_PATH="$build/lib")
ran=0 unserved=0  # guest processes started through ivcuda, and those the log does not show served
# through NAME SECONDS CMD...: CMD through ivcuda under a timeout, its own pid (not timeout's)
# in $work/NAME.pid and the log's mark before it started in $work/NAME.mark, for served_here.
through() {
  local name=$1 secs=$2; shift 2
  log_mark "$log" >"$work/$name.mark"
  rm -f "$work/$name.pid"
  "${guest_env[@]}" timeout "$secs" "${tagged[@]}" "$work/$name.pid" "$@"
}
served_here() {  # NAME: the process `through NAME` started was served by ivcudad
  local pid
  pid=$(cat "$work/$1.pid" 2>/dev/null)
  ran=$((ran + 1))
  served_by "$log" "${pid:-0}" "$(cat "$work/$1.mark")" && return 0
  echo "not served by ivcudad: no hello from $1's process ${pid:-?} in its log"
  unserved=$((unserved + 1))
  return 1
}

# --- (a) pynvml, natively and through ivcuda ---------------------------------
rc=0
"$py" -c "import pynvml" 2>/dev/null || rc=1
if [ $rc -ne 0 ]; then
  not_run "pynvml through ivcuda matches the host's NVML" "$py has no pynvml (nvidia-ml-py)"
else
  timeout 60 "$py" "$root/tests/frameworks/nvml_compare.py" dump "$out/native.json" 2>"$out/native.err" || rc=1
  # Another tenant: a native CUDA process holding 256 MiB, which the guest must not see.
  "$py" - >"$out/native-holder.log" 2>&1 <<'PY' &
import ctypes, time
cu = ctypes.CDLL("libcuda.so.1"); cu.cuInit(0)
d = ctypes.c_int(); cu.cuDeviceGet(ctypes.byref(d), 0)
c = ctypes.c_void_p(); cu.cuDevicePrimaryCtxRetain(ctypes.byref(c), d); cu.cuCtxSetCurrent(c)
p = ctypes.c_uint64(); print("native holder", cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(256 << 20)), flush=True)
time.sleep(90)
PY
  native_holder=$!
  sleep 2
  rm -f "$work/ready" "$work/done"
  through pynvml 150 "$py" "$root/tests/frameworks/nvml_compare.py" guest \
    "$out/guest.json" --alloc-mib 512 --ready "$work/ready" --done "$work/done" >"$out/guest.log" 2>&1 &
  guest=$!
  for _ in $(seq 600); do [ -e "$work/ready" ] || ! kill -0 $guest 2>/dev/null && break; sleep 0.1; done
  # The guests' workers, as the daemon's log names them (a warm entry's worker is its process's
  # child, and the next warm worker, which serves nobody, is no guest's).
  workers=$(grep -o "worker pid [0-9]*" "$log" | awk '{print $3}' | paste -sd, -)
  timeout 60 "$py" "$root/tests/frameworks/nvml_compare.py" dump "$out/during.json" 2>"$out/during.err" || rc=1
  # (b) while the guest holds its memory: ivcuda-smi is a guest process of its own (its own worker).
  if [ -x "$smi" ]; then
    i=0
    for args in "-L" "" "--query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,utilization.gpu,temperature.gpu,power.draw --format=csv"; do
      echo "\$ ivcuda-smi $args" >>"$out/ivcuda-smi.txt"
      # shellcheck disable=SC2086 # the arguments split on purpose
      through "smi$i" 60 "$smi" $args >>"$out/ivcuda-smi.txt" 2>&1
      echo "(exit $?)" >>"$out/ivcuda-smi.txt"
      i=$((i + 1))
    done
  fi
  nvsmi=$(command -v nvidia-smi || true)
  if [ -n "$nvsmi" ]; then
    for args in "-L" "" "--query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used --format=csv"; do
      echo "\$ nvidia-smi $args   (LD_LIBRARY_PATH=ivcuda's lib)" >>"$out/nvidia-smi-guest.txt"
      # shellcheck disable=SC2086
      "${guest_env[@]}" LD_DEBUG=libs timeout 60 "$nvsmi" $args >>"$out/nvidia-smi-guest.txt" 2>"$work/nvsmi-ld.txt"
      echo "(exit $?; libnvidia-ml loaded from: $(grep -o 'calling init: [^ ]*libnvidia-ml[^ ]*' "$work/nvsmi-ld.txt" | head -1))" \
        >>"$out/nvidia-smi-guest.txt"
    done
    "$nvsmi" >"$out/nvidia-smi-host.txt" 2>&1
  fi
  touch "$work/done"
  wait $guest || rc=1
  served_here pynvml || rc=1
  kill $native_holder 2>/dev/null; wait $native_holder 2>/dev/null; native_holder=
  cat "$out/guest.log"
  if [ $rc -eq 0 ]; then
    "$py" "$root/tests/frameworks/nvml_compare.py" compare "$out/native.json" "$out/guest.json" "$out/during.json" \
      --worker-pids "$workers" --alloc-mib 512 | tee "$out/compare.txt"
    rc=${PIPESTATUS[0]}
  fi
  verdict "pynvml through ivcuda matches the host's NVML (name, UUID, total, PCI id; used; the guest's processes only)" $rc
fi

# --- (b) ivcuda-smi and nvidia-smi ---------------------------------------------
if [ -x "$smi" ] && [ -f "$out/ivcuda-smi.txt" ]; then
  echo "ivcuda-smi (a process-mode guest of its own):"; cat "$out/ivcuda-smi.txt"
  rc=0
  for i in 0 1 2; do served_here "smi$i" || rc=1; done
  [ $rc -eq 0 ] && [ "$(grep -c "^(exit 0)" "$out/ivcuda-smi.txt")" -eq 3 ]
  verdict "ivcuda-smi -L, its table and --query-gpu succeed through ivcuda, each served by ivcudad" $?
  uuid=$("$py" -c "import json; print(json.load(open('$out/native.json'))['gpus'][0]['uuid'])" 2>/dev/null)
  [ $rc -eq 0 ] && [ -n "$uuid" ] && grep -q "$uuid" "$out/ivcuda-smi.txt"
  verdict "ivcuda-smi names GPU 0 by the host's UUID" $?
else
  not_run "ivcuda-smi -L, its table and --query-gpu succeed through ivcuda, each served by ivcudad" "no $smi (or no pynvml run)"
  not_run "ivcuda-smi names GPU 0 by the host's UUID" "no $smi (or no pynvml run)"
fi
if [ -f "$out/nvidia-smi-guest.txt" ]; then
  echo "the driver's nvidia-smi with ivcuda's libnvidia-ml.so.1 (recorded for a reader, not a case):"
  cat "$out/nvidia-smi-guest.txt"
fi

# --- (c) PyTorch ---------------------------------------------------------------
if "$py" -c "import torch" 2>/dev/null; then
  through torch 240 "$py" - >"$out/torch.txt" 2>"$out/torch.err" <<'PY'
import os, re, sys, torch
x = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
listing = torch.cuda.list_gpu_processes(0)
print(listing)
print("utilization", torch.cuda.utilization(0))
pids = [int(p) for p in re.findall(r"process\s+(\d+)", listing)]
print("own pid", os.getpid(), "listed", pids)
sys.exit(0 if pids == [os.getpid()] else 1)
PY
  rt=$?
  served=0
  served_here torch || served=1
  cat "$out/torch.txt"; [ $rt -ne 0 ] && tail -5 "$out/torch.err"
  verdict "torch.cuda.list_gpu_processes() through ivcuda lists the guest's own process alone" $((rt | served))
  [ $served -eq 0 ] && grep -q "^utilization [0-9]" "$out/torch.txt"
  verdict "torch.cuda.utilization() answers through ivcuda" $?
else
  not_run "torch.cuda.list_gpu_processes() through ivcuda lists the guest's own process alone" "$py has no torch"
  not_run "torch.cuda.utilization() answers through ivcuda" "$py has no torch"
fi

# --- (d) gpustat and nvitop, from wheels carried in .deps/wheels/tools ------------
# (tests/gpu/fetch-deps.sh: pip download there; this machine has no network.)
wheels=$root/.deps/wheels/tools
name=$("$py" -c "import json; print(json.load(open('$out/native.json'))['gpus'][0]['name'])" 2>/dev/null)
if [ -d "$wheels" ] && ls "$wheels"/nvitop-*.whl >/dev/null 2>&1; then
  site=$work/tools-site
  mkdir -p "$site"
  for w in "$wheels"/*.whl; do "$py" -m zipfile -e "$w" "$site" >/dev/null; done
  for t in "$wheels"/*.tar.gz; do tar xzf "$t" -C "$work" && cp -r "$work"/"$(basename "$t" .tar.gz)"/gpustat "$site"/; done
fi
for tool in "${tools[@]}"; do
  if [ ! -d "$wheels" ] || ! ls "$wheels"/nvitop-*.whl >/dev/null 2>&1; then
    not_run "$tool runs through ivcuda's NVML and names the GPU as natively" "no wheels in $wheels"
    continue
  fi
  read -r mod args <<<"$tool"
  # Each run judged on its own output: gpustat names the GPU in full, nvitop by its short name.
  want=$name
  [ "$mod" = nvitop ] && want="${name#NVIDIA }  "
  # shellcheck disable=SC2086
  PYTHONPATH=$site timeout 60 "$py" -m "$mod" $args >"$out/$mod.native" 2>&1 <<<""
  rn=$?
  # shellcheck disable=SC2086
  PYTHONPATH=$site through "$mod" 60 "$py" -m "$mod" $args >"$out/$mod.ivcuda" 2>&1 <<<""
  ri=$?
  served=0
  served_here "$mod" || served=1
  echo "\$ $tool (native, exit $rn):"; cat "$out/$mod.native"
  echo "\$ $tool (through ivcuda, exit $ri):"; cat "$out/$mod.ivcuda"
  [ -n "$name" ] && [ $rn -eq 0 ] && [ $ri -eq 0 ] && [ $served -eq 0 ] &&
    grep -qF "$want" "$out/$mod.native" && grep -qF "$want" "$out/$mod.ivcuda"
  verdict "$tool runs through ivcuda's NVML and names the GPU as natively" $?
done

# --- (e) NVML's long tail: every query pynvml offers, natively (twice) and through ivcuda -------
# (tests/frameworks/nvml_survey.py): the same return code for each, the same value where the
# host's is stable and names no tenant; the guest's NVML lists what it answered NOT_SUPPORTED.
if "$py" -c "import pynvml" 2>/dev/null; then
  "$py" "$root/tests/frameworks/nvml_survey.py" dump "$out/survey-native1.json" >"$out/survey-native.txt" 2>&1
  sleep 1
  "$py" "$root/tests/frameworks/nvml_survey.py" dump "$out/survey-native2.json" >>"$out/survey-native.txt" 2>&1
  IVCUDA_LOG_UNSUPPORTED=$out/survey-unsupported.txt through survey 180 "$py" "$root/tests/frameworks/nvml_survey.py" \
    dump "$out/survey-ivcuda.json" >"$out/survey-ivcuda.txt" 2>&1
  rs=$?
  served=0
  served_here survey || served=1
  cat "$out/survey-native.txt" "$out/survey-ivcuda.txt"
  "$py" "$root/tests/frameworks/nvml_survey.py" compare "$out/survey-native1.json" "$out/survey-native2.json" \
    "$out/survey-ivcuda.json" | tee "$out/survey-compare.txt"
  rc=${PIPESTATUS[0]}
  cat "$out/survey-unsupported.txt" 2>/dev/null
  verdict "every pynvml query answers through ivcuda as the host's NVML does (code; value where stable and the GPU's)" \
    $((rs | served | rc))
else
  not_run "every pynvml query answers through ivcuda as the host's NVML does (code; value where stable and the GPU's)" \
    "$py has no pynvml"
fi

# --- (f) JAX's start through ivcuda prints no NVML error line the native start lacks --------
if "$py" -c "import jax" 2>/dev/null; then
  prog="import jax, jax.numpy as jnp; print('sum', float(jnp.ones(4).sum()))"
  timeout 120 "$py" -c "$prog" >"$out/jax-native.txt" 2>&1
  rn=$?
  IVCUDA_LOG_UNSUPPORTED=$out/jax-unsupported.txt through jax 180 "$py" -c "$prog" >"$out/jax-ivcuda.txt" 2>&1
  ri=$?
  served=0
  served_here jax || served=1
  n_native=$(grep -ci "nvml" "$out/jax-native.txt")
  n_ivcuda=$(grep -ci "nvml" "$out/jax-ivcuda.txt")
  echo "JAX start: NVML lines natively $n_native, through ivcuda $n_ivcuda"
  grep -i "nvml" "$out/jax-ivcuda.txt" | head -5
  cat "$out/jax-unsupported.txt" 2>/dev/null
  [ $rn -eq 0 ] && [ $ri -eq 0 ] && [ $served -eq 0 ] && [ "$n_ivcuda" -le "$n_native" ] &&
    grep -q "^sum 4.0" "$out/jax-ivcuda.txt"
  verdict "JAX starts through ivcuda with no NVML error line its native start lacks" $?
else
  not_run "JAX starts through ivcuda with no NVML error line its native start lacks" "$py has no jax"
fi

grep -E "NVML|nvml" "$log" | head -20
# To the end: every guest process this script started through ivcuda was served, the daemon is
# still up, and no worker died of a signal (a run that served nobody is no such proof).
echo "guest processes started through ivcuda: $ran, not shown served: $unserved"
[ $ran -gt 0 ] && [ $unserved -eq 0 ] && kill -0 $daemon 2>/dev/null && ! grep -q "died of signal" "$log"
verdict "ivcudad served every guest to the end (sandboxed workers, NVML loaded before the sandbox)" $?
rm -rf "$work"
finish
