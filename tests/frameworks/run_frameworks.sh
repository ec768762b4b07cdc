#!/usr/bin/env bash
# Framework scripts on the GPU machine, each run natively and through ivcuda
# (process mode, the real driver behind ivcudad): a case passes when both exit
# 0, their deterministic stdout lines (all but TIME lines) are identical, ivcudad
# served the ivcuda run, and the ivcuda run made no call that answered
# NOT_SUPPORTED (IVCUDA_LOG_UNSUPPORTED lists them; the list is printed).
# IVCUDA_CALL_STATS tables (NAME.calls) say where a slow case's time went.
#   usage (repository root): bash tests/frameworks/run_frameworks.sh [BUILD_DIR]
#   IVCUDA_FRAMEWORKS="jax_train ..." runs only those cases.
set -u
root=$(pwd)
build=${1:-$root/build/gpu}
out=${OUT:-$root/out}/frameworks
mkdir -p "$out"
here=$root/tests/frameworks
# shellcheck source=../lib/verdicts.sh
. "$root/tests/lib/verdicts.sh"
py=${PYTHON:-python3}
sock=/tmp/ivcuda-fw.sock
rm -f "$sock"
"$build/host-daemon/ivcudad" --socket "$sock" --shm-size 8G --driver libcuda.so.1 --log-level "${IVCUDA_DAEMON_LOG:-info}" >"$out/ivcudad.log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done

# "name|script|environment (space-separated VAR=value)|GPUs needed (default 1)|seconds (default 120)"
cases=(
  "torch_eager|torch_eager.py|"
  "torch_graphs|torch_graphs.py|"
  "torch_expandable|torch_eager.py|PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
  "torch_mallocasync|torch_eager.py|PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync"
  "jax_train|jax_train.py|"
  "jax_platform_alloc|jax_train.py|XLA_PYTHON_CLIENT_ALLOCATOR=platform"
  "flax_cnn|flax_cnn.py|"
  "torch_compile_ro|torch_compile_ro.py|"
  "torch_mp|torch_mp.py|"
  "torch_nccl_one|torch_nccl_one.py|"
  "cupy_basic|cupy_basic.py|"
  "cupy_managed|cupy_managed.py|"
  "torch_libs|torch_libs.py|"
  "llm_serve|llm_serve.py|||300"
  "torch_green|torch_green.py|"
  "torch_two_gpus|torch_two_gpus.py||2"
  "torch_nccl_two|torch_nccl_two.py||2"
)
if [ -n "${IVCUDA_FRAMEWORKS:-}" ]; then
  kept=()
  for c in "${cases[@]}"; do
    case " $IVCUDA_FRAMEWORKS " in *" ${c%%|*} "*) kept+=("$c") ;; esac
  done
  cases=("${kept[@]}")
fi
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
expect_cases ${#cases[@]}
for c in "${cases[@]}"; do
  IFS='|' read -r name script envs gpus secs <<<"$c"
  secs=${secs:-120}
  if [ "${gpus:-1}" -gt "$ngpu" ]; then
    not_run "$name" "needs ${gpus} GPUs, this machine has $ngpu (nvidia-h200-x2 runs it)"
    continue
  fi
  # shellcheck disable=SC2086 # one word per variable
  env $envs timeout "$secs" "$py" "$here/$script" >"$out/$name.native" 2>"$out/$name.native.err"; rn=$?
  rm -f "$out/$name.pid" "$out/$name.unsupported"
  mark=$(log_mark "$out/ivcudad.log")
  # shellcheck disable=SC2086
  env $envs IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib IVCUDA_LOG_UNSUPPORTED="$out/$name.unsupported" \
    IVCUDA_LOG_ERRORS="$out/$name.errors" IVCUDA_CALL_STATS="$out/$name.calls" \
    timeout "$secs" "${tagged[@]}" "$out/$name.pid" "$py" "$here/$script" >"$out/$name.ivcuda" 2>"$out/$name.ivcuda.err"
  ri=$?
  tn=$(sed -n 's/^TIME //p' "$out/$name.native"); ti=$(sed -n 's/^TIME //p' "$out/$name.ivcuda")
  why=
  [ $rn -eq 0 ] || why="native exit $rn"
  [ $ri -eq 0 ] || why="${why:+$why, }ivcuda exit $ri"
  served_by "$out/ivcudad.log" "$(cat "$out/$name.pid" 2>/dev/null || echo 0)" "$mark" ||
    why="${why:+$why, }not served by ivcudad"
  # TIME and FIG lines are figures (FIG: a case's own rate, printed beside the verdict), not output.
  diff <(grep -Ev '^(TIME|FIG) ' "$out/$name.native") <(grep -Ev '^(TIME|FIG) ' "$out/$name.ivcuda") >"$out/$name.diff" ||
    why="${why:+$why, }outputs differ"
  # libcuda's NOT_SUPPORTED answers, and NVML functions ivcuda does not forward (NVML's own
  # NOT_SUPPORTED for what the GPU lacks - fans on an H200 - is the host's answer, passed on).
  grep -qE "^ivcuda: NOT_SUPPORTED .*call|^ivcuda-nvml: NOT_SUPPORTED .*\(not forwarded\)" "$out/$name.unsupported" \
    2>/dev/null && why="${why:+$why, }NOT_SUPPORTED calls"
  # Error lines the framework printed through ivcuda and not natively (XLA's "Stream not idle on
  # destroy: ... CUDA_ERROR_INVALID_VALUE", its "Nvml call failed"): the failed calls are listed.
  errpat='CUDA_ERROR_|Nvml call failed|Stream not idle'
  if [ "$(grep -cE "$errpat" "$out/$name.ivcuda.err")" -gt "$(grep -cE "$errpat" "$out/$name.native.err")" ]; then
    why="${why:+$why, }error lines native lacks"
    grep -E "$errpat" "$out/$name.ivcuda.err" | sort | uniq -c | head -5 | sed 's/^/  ivcuda stderr> /'
  fi
  ratio=
  [ -n "$tn" ] && [ -n "$ti" ] && ratio=$(awk -v a="$ti" -v b="$tn" 'BEGIN { printf "%.2f", a / b }')
  if [ -z "$why" ]; then
    echo "  $name: identical output, served, time native ${tn}s ivcuda ${ti}s (x$ratio)"
    paste <(sed -n 's/^FIG //p' "$out/$name.native") <(sed -n 's/^FIG //p' "$out/$name.ivcuda") |
      awk -F'\t' 'NF == 2 { split($1, a, " "); split($2, b, " "); printf "  %s: %s native, %s ivcuda\n", a[1], a[2], b[2] }' 
    # Where a slow case's time went: its costliest requests (IVCUDA_CALL_STATS).
    if awk -v r="${ratio:-0}" 'BEGIN { exit !(r > 1.5) }'; then
      grep -A6 "requests by kind" "$out/$name.calls" 2>/dev/null | sed 's/^/  calls> /' | head -14
    fi
  else
    echo "  $name: $why"
    grep -v '^  File\|^    ' "$out/$name.ivcuda.err" | tail -4 | sed 's/^/  ivcuda stderr> /'
    head -6 "$out/$name.diff" | sed 's/^/  diff> /'
    grep "NOT_SUPPORTED" "$out/$name.unsupported" 2>/dev/null | sed 's/^/  /' | head -30
    grep "FAILED" "$out/$name.errors" 2>/dev/null | sed 's/^/  /' | head -30
    # What the worker refused, as its log says (the first 100 errors of each guest).
    pid=$(cat "$out/$name.pid" 2>/dev/null || echo 0)
    guest=$(sed -n "s/.* info: guest \([0-9]*\): process $pid says hello .*/\1/p" "$out/ivcudad.log" | head -1)
    [ -n "$guest" ] && grep -E "guest $guest( channel [0-9]+)?: .*(-> CUDA_ERROR|refused|failed|is not device memory)" "$out/ivcudad.log" |
      sort | uniq -c | sort -rn | head -12 | sed 's/^/  worker> /'
  fi
  [ -z "$why" ]; rc=$?
  verdict "$name" $rc
done
echo "== frameworks summary:"
finish
