#!/usr/bin/env bash
# Issue 31's figures on the GPU machine, native against ivcuda in one run (figures, not cases:
# each part fails only when a run fails or was not served):
#   profile  the LLM's generate under cProfile, natively and through ivcuda (not by default)
#   idle     tests/process/run_idle_streams_test.sh on the real driver: idle streams answered
#            in the guest, every answer the driver's (the one part with cases of its own)
#   nvbench  ivcuda's NVBench set (C++), 100 samples: native, process mode, and process mode
#            with IVCUDA_HOST_POLLS=off (posted calls never wait to be taken: the old way)
#   bench    ivcuda-bench --only solo: round trips, short chains, queries, copies
#   trace    the round trip by stage: drv_roundtrip natively, through ivcuda, and through ivcuda
#            with IVCUDA_TRACE_STAGES (the guest's and the worker's stages, medians), twice; and
#            the ring alone on this host (ivcuda-ring-bench)
#   probe    tests/frameworks/speed_probe.py natively and through ivcuda: a JAX jitted small
#            step, torch.cuda.mem_get_info idle and busy, an LLM's first prefill at a new
#            shape (with IVCUDA_CALL_STATS: where the ivcuda run's time went), and the LLM a
#            second time on each side, with what the first run left in the on-disk compile caches
#   usage (repository root): bash tests/gpu/run_speed3.sh BUILD_DIR   (IVCUDA_SPEED_PARTS picks)
set -u -o pipefail
root=$(pwd)
build=$(cd "${1:-$root/build/gpu}" && pwd)
out=${OUT:-$root/out}
mkdir -p "$out"
work=$(mktemp -d /tmp/ivcuda-speed3.XXXXXX)
parts=${IVCUDA_SPEED_PARTS:-idle nvbench bench probe}
py=${PYTHON:-python3}
# shellcheck source=../lib/verdicts.sh
. "$root/tests/lib/verdicts.sh"
# One verdict a part: every run in it exited 0 and every ivcuda run was served.
# shellcheck disable=SC2086 # one word a part
expect_cases $(echo $parts | wc -w)

for p in $parts; do
  rc=0
  case $p in
  nvbench)
    nb=$work/nvbench
    timeout 300 bash nvbench-configs/run.sh --sets cpp --modes native,process --samples 100 \
      --ivcuda-build "$build" --build-dir "$root/build/gpu-nvbench" --out "$nb" >"$work/nvbench.log" 2>&1 || rc=1
    grep -v "^run.sh: \|^nvbench\|^ivcuda-nvbench" "$work/nvbench.log" | tail -30
    [ -s "$nb/native.json" ] && cp "$nb/comparison.json" "$out/speed3-nvbench.json" 2>/dev/null
    if [ -s "$nb/native.json" ]; then
      echo "-- the same with IVCUDA_HOST_POLLS=off (posted calls never wait to be taken)"
      IVCUDA_HOST_POLLS=off timeout 200 bash nvbench-configs/run.sh --sets cpp --modes process --samples 100 \
        --native-json "$nb/native.json" --ivcuda-build "$build" --build-dir "$root/build/gpu-nvbench" \
        --out "$work/nvbench-off" >"$work/nvbench-off.log" 2>&1 || rc=1
      grep -v "^run.sh: \|^nvbench\|^ivcuda-nvbench" "$work/nvbench-off.log" | tail -30
    fi ;;
  bench)
    sock=/tmp/ivcuda-speed3-bench.sock
    rm -f "$sock"
    "$build/host-daemon/ivcudad" --socket "$sock" --shm-size 4G --channels 8 --driver libcuda.so.1 \
      >"$work/bench-ivcudad.log" 2>&1 &
    daemon=$!
    for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
    timeout 240 "$build/bench/ivcuda-bench" --ptx "$build/tests/gpu_double/test_kernels.ptx" --only solo \
      --ivcuda-lib "$build/lib" --socket "$sock" --daemon-log "$work/bench-ivcudad.log" \
      --json "$out/speed3-bench.json" 2>&1 | tee "$out/speed3-bench.txt" || rc=1
    kill $daemon; wait $daemon 2>/dev/null ;;
  trace)
    sock=/tmp/ivcuda-speed3-trace.sock
    rm -f "$sock"
    "$build/host-daemon/ivcudad" --socket "$sock" --driver libcuda.so.1 >"$work/trace-ivcudad.log" 2>&1 &
    daemon=$!
    for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
    sleep 3  # the warm worker's context and arena, made ahead, are ready
    for round in 1 2; do
      for k in native ivcuda traced; do
        rt=("$build/tests/bin/drv_roundtrip" --rounds 20000 --gap-us 1)
        case $k in
          native) timeout 60 "${rt[@]}" >"$work/rt-$k.txt" 2>&1 || rc=1 ;;
          *) # through ivcudad, which must have served it (its log's hello from this process)
            trace=()
            [ $k = traced ] && trace=(IVCUDA_TRACE_STAGES="$work/stages-$round.txt")
            rm -f "$work/rt.pid"
            mark=$(log_mark "$work/trace-ivcudad.log")
            env "${trace[@]}" IVCUDA_SOCKET="$sock" LD_LIBRARY_PATH="$build/lib" \
              timeout 60 "${tagged[@]}" "$work/rt.pid" "${rt[@]}" >"$work/rt-$k.txt" 2>&1 || rc=1
            served_by "$work/trace-ivcudad.log" "$(cat "$work/rt.pid" 2>/dev/null || echo 0)" "$mark" ||
              { rc=1; echo "drv_roundtrip ($k, round $round): not served by ivcudad"; } ;;
        esac
        grep "^roundtrip" "$work/rt-$k.txt" | sed "s/^/$round $k: /"
      done
      grep -E "by stage|request|EventQuery|StreamQuery|CtxSynchronize" "$work/stages-$round.txt"
    done
    kill $daemon; wait $daemon 2>/dev/null
    [ -x "$build/bench/ivcuda-ring-bench" ] && timeout 60 "$build/bench/ivcuda-ring-bench" 2>&1 | head -8 ;;
  probe)
    sock=/tmp/ivcuda-speed3-probe.sock
    rm -f "$sock"
    "$build/host-daemon/ivcudad" --socket "$sock" --shm-size 8G --driver libcuda.so.1 \
      >"$work/probe-ivcudad.log" 2>&1 &
    daemon=$!
    for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
    # "part|run": the prefill a second time on each side ("again") finds what the first one
    # compiled in the on-disk caches (the driver's ComputeCache natively, the guest's compile
    # cache directory through ivcuda: guest/compile_cache.cc), as a user's next run does.
    for entry in "jax_step|" "mem_info|" "prefill|" "prefill|again"; do
      part=${entry%%|*} again=${entry#*|} envs= name=${entry%%|*}${again:+-again}
      [ -s "$work/$name.native" ] ||
        timeout 150 "$py" tests/frameworks/speed_probe.py "$part" >"$work/$name.native" 2>"$work/$name.native.err" ||
        { rc=1; tail -5 "$work/$name.native.err"; }
      rm -f "$work/$name.pid"
      mark=$(log_mark "$work/probe-ivcudad.log")
      # shellcheck disable=SC2086 # one word per variable
      env $envs IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib IVCUDA_CALL_STATS="$work/$name.calls" \
        timeout 150 "${tagged[@]}" "$work/$name.pid" "$py" tests/frameworks/speed_probe.py "$part" \
        >"$work/$name.ivcuda" 2>"$work/$name.ivcuda.err" || { rc=1; tail -5 "$work/$name.ivcuda.err"; }
      echo "== $name${envs:+ (ivcuda run with $envs)}"
      [ "$part" = prefill ] && echo "  compile caches on disk: $(du -sh ~/.nv/ComputeCache 2>/dev/null | cut -f1) in" \
        "~/.nv/ComputeCache, $(find ~/.nv/ComputeCache/ivcuda-nvrtc -name '*.ivc' 2>/dev/null | wc -l) files of ivcuda's"
      served_by "$work/probe-ivcudad.log" "$(cat "$work/$name.pid" 2>/dev/null || echo 0)" "$mark" ||
        { rc=1; echo "$name: the ivcuda run was not served by ivcudad"; }
      grep -h "^OK\|^BAD" "$work/$name.native" "$work/$name.ivcuda" | sort | uniq -c
      join <(sed -n 's/^FIG //p' "$work/$name.native" | sort) <(sed -n 's/^FIG //p' "$work/$name.ivcuda" | sort) |
        awk '{ printf "%-36s native %10.3f %-3s ivcuda %10.3f  x%.3f\n", $1, $2, $3, $4, ($2 > 0 ? $4 / $2 : 0) }'
      echo "  $name: the ivcuda run's costliest requests, and its time in API calls (IVCUDA_CALL_STATS)"
      grep -A12 "requests by kind" "$work/$name.calls" 2>/dev/null | head -14 | sed 's/^/    /'
      grep -A16 "in API calls" "$work/$name.calls" 2>/dev/null | head -18 | sed 's/^/    /'
    done
    kill $daemon; wait $daemon 2>/dev/null ;;
  profile)
    # Where the LLM's generate spends its time natively and through ivcuda (cProfile, by each
    # function's own time): what the API-call table cannot see.
    sock=/tmp/ivcuda-speed3-profile.sock
    rm -f "$sock"
    "$build/host-daemon/ivcudad" --socket "$sock" --shm-size 8G --driver libcuda.so.1 \
      >"$work/profile-ivcudad.log" 2>&1 &
    daemon=$!
    for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
    # "name|environment": as it comes, and with cuDNN kept out of attention.
    for entry in "default|" "no-cudnn-sdpa|SPEED_PROBE_NO_CUDNN_SDPA=1"; do
      name=${entry%%|*} envs=${entry#*|}
      # shellcheck disable=SC2086 # one word per variable
      env $envs SPEED_PROBE_PROFILE=1 timeout 150 "$py" tests/frameworks/speed_probe.py prefill \
        >"$work/profile-$name.native" 2>&1 || rc=1
      mark=$(log_mark "$work/profile-ivcudad.log")
      # shellcheck disable=SC2086
      env $envs SPEED_PROBE_PROFILE=1 IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib \
        IVCUDA_LOG_ERRORS="$work/profile-$name.errors" \
        timeout 150 "${tagged[@]}" "$work/profile.pid" "$py" tests/frameworks/speed_probe.py prefill \
        >"$work/profile-$name.ivcuda" 2>&1 || rc=1
      served_by "$work/profile-ivcudad.log" "$(cat "$work/profile.pid" 2>/dev/null || echo 0)" "$mark" || rc=1
      for k in native ivcuda; do
        echo "== generate under cProfile, $name, $k"
        grep "^FIG prefill" "$work/profile-$name.$k"
        sed -n 's/^PROF //p' "$work/profile-$name.$k" | sed -n '4,22p'
      done
      grep "FAILED" "$work/profile-$name.errors" 2>/dev/null | sed 's/^/  /'
    done
    kill $daemon; wait $daemon 2>/dev/null ;;
  idle)
    # Idle streams answered in the guest, on the real driver: every answer the driver's.
    timeout 200 bash tests/process/run_idle_streams_test.sh "$build" libcuda.so.1 2>&1 | tail -8 || rc=1 ;;
  *) echo "run_speed3.sh: no part '$p'"; rc=2 ;;
  esac
  verdict "speed part $p: its runs exited 0, the ivcuda ones served by ivcudad" $rc
done
tar -C "$work" -czf "$out/speed3-logs.tgz" . 2>/dev/null
finish
