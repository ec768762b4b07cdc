#!/usr/bin/env bash
# Everything the GPU machine is needed for, in one device-tool call:
#   suite   the driver-API/runtime/library programs native vs ivcuda (run_gpu_suite.sh)
#   vm      the TCG guest next to the real GPU (run_vm_on_gpu.sh): the driver-API programs, and
#           NVML in the guest (ivcuda-smi, nvml_api, pynvml, gpustat, nvitop) against the host's
#   double  the GPU test double's own tests against the real driver (real_driver_check.sh)
#   multi   several GPUs (run_multi_gpu.sh; nvidia-h200-x2)
#   frameworks  PyTorch and JAX scripts native vs ivcuda (tests/frameworks/run_frameworks.sh)
#   bench   ivcuda-bench: native vs ivcuda table, JSON and PNG (figures, not cases; the bench
#           fails unless ivcudad's log shows each of its ivcuda children served, --daemon-log);
#           IVCUDA_BENCH_PARTS picks its parts (default solo,crowd; "managed" for those figures alone)
#   startup ivcuda-bench's start-up figures (a program's start to its first result and exit,
#           native vs ivcuda), with ivcudad's warm workers and without (--warm-workers 0),
#           --shm-size 4G as in bench; and the workers' own start-up costs from ivcudad's log
#   quota   PyTorch and JAX guests at once under 20 GiB quotas (run_quota_on_gpu.sh)
#   share   exported, released and IPC-opened memory on the GPU and in the quota (run_share_on_gpu.sh)
#   mps     compute shares: a compute-bound loop alone and two at once, time-sliced and under MPS
#           at 50/50 and 75/25, natively and through ivcudad --mps (run_mps_share.sh)
#   kill    1000 process-mode guests SIGKILLed mid-run (run_kill_loop.sh;
#           IVCUDA_KILLS overrides the count)
#   nvbench NVBench from the pip wheel (.deps/wheels, tests/gpu/fetch-deps.sh): ivcuda's set,
#           C++ and Python, natively and in process mode (nvbench-configs/run.sh); the table in
#           nvbench.txt, nvbench.json/.png and nvbench-python.json/.png, the raw results in logs
#   nvml    NVML for guests in process mode (run_nvml_on_gpu.sh): pynvml through ivcuda vs the
#           host's NVML, ivcuda-smi and the driver's nvidia-smi on the guest library, PyTorch's
#           list_gpu_processes(), gpustat and nvitop, every pynvml query against the host's
#           (nvml_survey.py), JAX's start without NVML error lines
#   before-after  ivcuda-bench --only solo through an earlier build (IVCUDA_BENCH_BASELINE) and
#           this one, alternately, twice each (a refactoring's "no measurable change")
#   lifecycle  issue 30's figures with ivcudad's defaults: start-up after idle, back-to-back,
#           in a burst and spread, and death with work under way (SIGKILL to memory back), native
#           vs ivcuda (ivcuda-bench --only startup,starts,death, or IVCUDA_LIFECYCLE_PARTS; lifecycle.txt/.json);
#           and a recycled worker's next guest sees nothing of the last (drv_recycle, natively too)
#   speed   issue 31's figures (run_speed3.sh): NVBench 100 samples native / process mode / process
#           mode with IVCUDA_HOST_POLLS=off, ivcuda-bench solo, JAX step, mem_get_info, an LLM's
#           first prefill, idle streams answered in the guest on the real driver
#           (IVCUDA_SPEED_PARTS picks among idle nvbench bench trace probe profile; the round trip by stage: trace)
#   absent  what the driver answers to each export the guest library has no feature for (its
#           generated stubs, nm type W), every argument zero (tests/programs/drv_absent.cc), natively
#           and through ivcuda: absent-native.txt, absent-ivcuda.txt and their differences
#   checkpoint  issue 34's first question: the driver's process checkpointing (cuCheckpointProcess*)
#           on a running process, natively (1 and 4 GiB, by another process and by itself, --self)
#           and on a guest's sandboxed worker: lock,
#           checkpoint, restore and unlock times, the GPU's used memory at each step, another
#           process allocating the freed memory meanwhile, the target's pattern intact at the same
#           address and its calls waiting meanwhile (tests/programs/drv_checkpoint.cc; checkpoint.txt)
#   suspend issue 34: ivcudactl suspend/resume on the real driver under each sandbox, a 4 GiB
#           guest, the cost per GiB, a drain with three guests, and PyTorch and JAX training guests
#           suspended mid-run (run_suspend_on_gpu.sh)
#   vm-suspend  issue 34: a TCG VM next to the real GPU suspended and resumed as a whole
#           (tests/guest_vm/vm_suspend_test.sh with QEMU and the guest image from .deps/qemu and
#           .deps/guest; IVCUDA_VM_SUSPEND_SANDBOX, default off, the workers' sandbox)
#   vm-starts  issue 30 for a VM's processes: a TCG VM next to the real GPU starts a program 20 times
#           back to back, 8 at once and 64 over 10 s (one VM each, ivcudad's defaults); each
#           process's wait for its worker and what served it, from ivcudad's log, and the same
#           program natively for scale (tests/guest_vm/vm_starts.sh; vm-starts.txt/.json)
#   ckpt-trace  issue 34: what the driver's checkpoint does inside a guest's worker and what the
#           worker's sandbox refuses of it, under strace (trace_checkpoint_syscalls.sh)
#   cost    natively, what the driver holds beyond allocations - a context, each limit ivcudad
#           charges, a kernel's stack frame, a pool's reserve - and whether it records a pageable
#           copy in a stream capture (tests/programs/drv_context_cost.cc; figures in cost.txt,
#           the figures behind ivcudad's --context-reserve and its capture rule)
# The device tool returns at most 8 files: the parts' outputs go to $OUT as
# text, every log into one tarball. Each part's exit status is its verdict;
# the last line sums them, and the exit status is 0 only if every part passed.
#   usage (repository root): bash tests/gpu/run_all.sh [suite|vm|double|multi|bench|nvbench ...]
set -u -o pipefail
root=$(pwd)
final=${OUT:-$root/out}
mkdir -p "$final"
work=$(mktemp -d /tmp/ivcuda-all.XXXXXX)
. "$root/tests/gpu/sandbox_mode.sh"  # --sandbox degraded below Landlock ABI 6, said here
parts=${*:-suite vm double bench}
start=$SECONDS
ok=() bad=()
# part NAME STATUS: records one part's verdict.
part() {
  if [ "$2" -eq 0 ]; then ok+=("$1"); echo "-- $1: passed at +$((SECONDS - start)) s"
  else bad+=("$1 (exit $2)"); echo "-- $1: FAILED (exit $2) at +$((SECONDS - start)) s"; fi
}
deps_env() {  # the build dependencies from .deps, unpacked once
  local deps=/tmp/ivcuda-deps
  if [ ! -d "$deps/usr" ]; then
    mkdir -p "$deps" && for f in "$root"/.deps/*.deb; do dpkg -x "$f" "$deps"; done
  fi
  export PKG_CONFIG_SYSROOT_DIR=$deps PKG_CONFIG_PATH=$deps/usr/lib/x86_64-linux-gnu/pkgconfig
  export CPLUS_INCLUDE_PATH=$deps/usr/include LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu
  DEPS=$deps
}
# build_gpu TARGETS...: configures build/gpu as the suite does, if need be, and builds them.
build_gpu() {
  local build=$root/build/gpu
  deps_env  # also for a rebuild on a machine still warm: the compiler finds .deps' headers through it
  if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$DEPS/usr" \
      >"$work/configure.log" 2>&1 || { tail -20 "$work/configure.log"; return 1; }
  fi
  cmake --build "$build" -j "$(nproc)" --target "$@" >"$work/build-$1.log" 2>&1 ||
    { tail -20 "$work/build-$1.log"; return 1; }
}

# IVCUDA_GPU_PREBUILT=DIR: a bundle tools/gpu-bundle.sh built elsewhere stands for build/gpu, and
# no part builds (for a lease too short to build in; run_gpu_suite.sh says so too).
if [ -n "${IVCUDA_GPU_PREBUILT:-}" ]; then
  [ -e "$root/build/gpu" ] || ln -s "$(cd "$IVCUDA_GPU_PREBUILT" && pwd)" "$root/build/gpu"
  build_gpu() { echo "(prebuilt bundle: $(cat "$root/build/gpu/BUNDLE" 2>/dev/null); nothing built for $*)"; }
fi

for p in $parts; do
  case $p in
  suite)
    OUT=$work/suite timeout 480 bash tests/gpu/run_gpu_suite.sh 2>&1 | tee "$final/suite.txt"
    part suite $? ;;
  vm)
    OUT=$work timeout 400 bash tests/gpu/run_vm_on_gpu.sh build/gpu 2>&1 | tee "$final/vm.txt"
    part vm $? ;;
  double)
    deps_env
    CATCH2_V2_INCLUDE=$DEPS/usr/include timeout 400 bash tests/gpu_double/real_driver_check.sh 2>&1 |
      tee "$final/double.txt"
    part double $? ;;
  multi)
    OUT=$work timeout 400 bash tests/gpu/run_multi_gpu.sh build/gpu 2>&1 | tee "$final/multi.txt"
    part multi $? ;;
  frameworks)
    if build_gpu ivcudad ivcuda_guest; then
      OUT=$work timeout 540 bash tests/frameworks/run_frameworks.sh build/gpu 2>&1 | tee "$final/frameworks.txt"
      part frameworks $?
    else
      part frameworks 1
    fi ;;
  quota)
    if build_gpu ivcudad ivcudactl ivcuda_guest; then
      OUT=$work timeout 400 bash tests/gpu/run_quota_on_gpu.sh build/gpu 2>&1 | tee "$final/quota.txt"
      part quota "${PIPESTATUS[0]}"
    else
      part quota 1
    fi ;;
  share)
    if build_gpu ivcudad ivcuda_guest; then
      OUT=$work timeout 300 bash tests/gpu/run_share_on_gpu.sh build/gpu 2>&1 | tee "$final/share.txt"
      part share "${PIPESTATUS[0]}"
    else
      part share 1
    fi ;;
  mps)
    if build_gpu ivcudad ivcudactl ivcuda_guest ivcuda-compute-share ivcuda_gpu_double_kernels; then
      OUT=$work timeout 400 bash tests/gpu/run_mps_share.sh build/gpu 2>&1 | tee "$final/mps.txt"
      part mps "${PIPESTATUS[0]}"
    else
      part mps 1
    fi ;;
  kill)
    if build_gpu ivcudad ivcuda_guest drv_isolation drv_core; then
      OUT=$work timeout 540 bash tests/gpu/run_kill_loop.sh build/gpu libcuda.so.1 "${IVCUDA_KILLS:-1000}" 8 2>&1 |
        grep -v " Killed " | tee "$final/kill.txt"
      part kill "${PIPESTATUS[0]}"
    else
      part kill 1
    fi ;;
  nvml)
    if build_gpu ivcudad ivcuda_guest ivcuda_nvml ivcuda-smi; then
      OUT=$work timeout 400 bash tests/gpu/run_nvml_on_gpu.sh build/gpu 2>&1 | tee "$final/nvml.txt"
      part nvml "${PIPESTATUS[0]}"
    else
      part nvml 1
    fi ;;
  nvbench)
    # The guest leg needs libnvidia-ml.so.1 in the guest (the wheel's libnvbench.so loads it):
    # it runs where build/gpu/lib has ivcuda's guest NVML library (the nvml part builds it).
    rc=0
    build_gpu ivcudad ivcuda_guest ivcuda_nvml || rc=1
    if [ $rc -eq 0 ]; then
      modes=native,process
      if [ -e "$root/build/gpu/lib/libnvidia-ml.so.1" ]; then
        modes=$modes,guest
      else
        echo "nvbench: no TCG guest run: the wheel's libnvbench.so needs libnvidia-ml.so.1 (build target ivcuda_nvml, or run the nvml part first)"
      fi
      # C++ first, then Python, each compared apart: a failing Python run keeps the C++ table.
      timeout 330 bash nvbench-configs/run.sh --sets cpp --modes "$modes" --ivcuda-build build/gpu \
        --build-dir build/gpu-nvbench --out "$work/nvbench" 2>&1 | tee "$final/nvbench.txt"
      rc=${PIPESTATUS[0]}
      timeout 240 bash nvbench-configs/run.sh --sets python --modes native,process --ivcuda-build build/gpu \
        --build-dir build/gpu-nvbench --out "$work/nvbench" 2>&1 | tee -a "$final/nvbench.txt"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      for f in comparison.json:nvbench.json comparison.png:nvbench.png \
               python-comparison.json:nvbench-python.json python-comparison.png:nvbench-python.png; do
        [ ! -f "$work/nvbench/${f%%:*}" ] || cp "$work/nvbench/${f%%:*}" "$final/${f##*:}"
      done
    fi
    part nvbench $rc ;;
  speed)
    rc=0
    build_gpu ivcudad ivcuda_guest ivcuda-bench ivcuda-ring-bench ivcuda_gpu_double_kernels drv_idle_streams drv_roundtrip || rc=1
    if [ $rc -eq 0 ]; then
      OUT=$final timeout 560 bash tests/gpu/run_speed3.sh build/gpu 2>&1 | tee "$final/speed3.txt"
      rc=${PIPESTATUS[0]}
    fi
    part speed $rc ;;
  bench)
    build=$root/build/gpu
    rc=0
    # A second bench in one call (for the spread between runs) writes bench2.*.
    tag=bench
    [ ! -e "$final/bench.txt" ] || tag=bench2
    build_gpu ivcuda-bench ivcudad ivcuda_guest ivcuda_gpu_double_kernels || rc=1
    if [ $rc -eq 0 ]; then
      sock=/tmp/ivcuda-bench.sock
      rm -f "$sock"
      "$build/host-daemon/ivcudad" --socket "$sock" --shm-size 4G --channels 8 --driver libcuda.so.1 \
        >"$work/bench-ivcudad.log" 2>&1 &
      daemon=$!
      for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
      timeout 300 "$build/bench/ivcuda-bench" --ptx "$build/tests/gpu_double/test_kernels.ptx" --only "${IVCUDA_BENCH_PARTS:-solo,crowd}" \
        --ivcuda-lib "$build/lib" --socket "$sock" --daemon-log "$work/bench-ivcudad.log" --json "$final/$tag.json" 2>&1 |
        tee "$final/$tag.txt"
      rc=$?
      kill $daemon; wait $daemon 2>/dev/null
      # The plot needs matplotlib, which this machine's python3 may lack: then
      # draw it where the JSON lands (python3 bench/plot.py bench.json bench.png).
      if [ $rc -eq 0 ] && [ -s "$final/$tag.json" ] && python3 -c "import matplotlib" 2>/dev/null; then
        python3 "$root/bench/plot.py" "$final/$tag.json" "$final/$tag.png" || rc=1
      fi
    fi
    part bench $rc ;;
  before-after)
    # ivcuda-bench --only solo through an earlier build (IVCUDA_BENCH_BASELINE: a folder with its
    # host-daemon/ivcudad and lib/libcuda.so.1) and through this one, alternately, twice each, the
    # same bench binary (this build's) and the same native runs: "no measurable change" for a
    # refactoring (issue 33), figure by figure (before-after.txt: each run's ivcuda column).
    build=$root/build/gpu
    base=${IVCUDA_BENCH_BASELINE:-}
    rc=0
    [ -n "$base" ] && [ -x "$base/host-daemon/ivcudad" ] || { echo "before-after: IVCUDA_BENCH_BASELINE has no ivcudad"; rc=1; }
    build_gpu ivcuda-bench ivcudad ivcuda_guest ivcuda_gpu_double_kernels || rc=1
    if [ $rc -eq 0 ]; then
      for run in before1 after1 before2 after2; do
        b=$build
        case $run in before*) b=$(cd "$base" && pwd) ;; esac
        sock=/tmp/ivcuda-ab.sock
        rm -f "$sock"
        "$b/host-daemon/ivcudad" --socket "$sock" --shm-size 4G --channels 8 --driver libcuda.so.1 \
          >"$work/ab-$run-ivcudad.log" 2>&1 &
        daemon=$!
        for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
        timeout 200 "$build/bench/ivcuda-bench" --ptx "$build/tests/gpu_double/test_kernels.ptx" --only solo \
          --ivcuda-lib "$b/lib" --socket "$sock" --daemon-log "$work/ab-$run-ivcudad.log" \
          >"$work/ab-$run.txt" 2>&1 || rc=1
        kill $daemon; wait $daemon 2>/dev/null
      done
      { echo "figure unit native(after1) before1 after1 before2 after2  after/before (means of two)"
        join <(awk 'NF == 5 && $1 ~ /\./ { print $1, $2, $3, $4 }' "$work/ab-after1.txt" | sort) \
             <(for r in before1 before2 after2; do awk -v r=$r 'NF == 5 && $1 ~ /\./ { print $1, $4 }' "$work/ab-$r.txt"; done |
               awk '{ v[$1] = v[$1] " " $2 } END { for (k in v) print k v[k] }' | sort) |
          awk '{ b = ($5 + $6) / 2; a = ($4 + $7) / 2; printf "%-34s %-10s %10s %10s %10s %10s %10s  %.3f\n", $1, $2, $3, $5, $4, $6, $7, (b > 0 ? a / b : 0) }'
      } | tee "$final/before-after.txt"
    fi
    part before-after $rc ;;
  lifecycle)
    # Issue 30: a guest's start in each arrival pattern (after idle, 20 back-to-back, a burst of 8,
    # 64 over 10 s) and its death with work under way (SIGKILL to its memory back in NVML: idle,
    # 10,000 posted 1 ms launches, inside a 2 s kernel), native vs ivcuda, with ivcudad's defaults;
    # first the driver's own context times, natively (tests/programs/drv_ctx_timing.cc).
    build=$root/build/gpu
    rc=0
    build_gpu ivcuda-bench ivcudad ivcuda_guest ivcuda_gpu_double_kernels drv_recycle drv_ctx_timing || rc=1
    if [ $rc -eq 0 ]; then
      : >"$final/lifecycle.txt"
      if [ "${IVCUDA_LIFECYCLE_CTX_ROUNDS:-5}" != 0 ]; then  # 0: no driver figures (an A/B's second lease)
        timeout 120 "$build/tests/bin/drv_ctx_timing" --rounds "${IVCUDA_LIFECYCLE_CTX_ROUNDS:-5}" 2>&1 |
          tee -a "$final/lifecycle.txt"
        [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      fi
      # IVCUDA_LIFECYCLE_CONFIGS: "NAME=ivcudad options;NAME=options..." - an A/B of pool settings in
      # one lease, each with a daemon of its own, native measured beside each (lifecycle-NAME.json);
      # else IVCUDA_LIFECYCLE_ARGS (options beyond the defaults; lifecycle.json). The recycling
      # checks below run against the first.
      configs=${IVCUDA_LIFECYCLE_CONFIGS:-=${IVCUDA_LIFECYCLE_ARGS:-}}
      sock=/tmp/ivcuda-lifecycle.sock
      first=1
      IFS=';' read -r -a config_list <<<"$configs"
      for config in "${config_list[@]}"; do
        name=${config%%=*} args=${config#*=}
        log=$work/lifecycle-ivcudad${name:+-$name}.log
        echo "=== ivcudad ${args:-(defaults)}${name:+ ($name)}" | tee -a "$final/lifecycle.txt"
        rm -f "$sock"
        # shellcheck disable=SC2086 # one word per option
        "$build/host-daemon/ivcudad" --socket "$sock" --driver libcuda.so.1 $args >"$log" 2>&1 &
        daemon=$!
        for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
        timeout 420 "$build/bench/ivcuda-bench" --only "${IVCUDA_LIFECYCLE_PARTS:-startup,starts,death}" \
          --startup-runs 5 --startup-gap-ms 3000 \
          --ptx "$build/tests/gpu_double/test_kernels.ptx" --ivcuda-lib "$build/lib" --socket "$sock" \
          --daemon-log "$log" --json "$final/lifecycle${name:+-$name}.json" 2>&1 | tee -a "$final/lifecycle.txt"
        [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
        if [ $first = 1 ]; then
          # A recycled worker's next guest sees nothing of the last one on the real driver too
          # (tests/programs/drv_recycle; CI: tests/process/run_recycle_test.sh), and natively.
          # Three leavers: one that uses pools and page-locked memory (a worker resets its contexts
          # after it), a plain one whose kernels also leave the pattern in shared and local memory
          # (--recycle-workers keep keeps its context, scrubbed), and a plain one whose kernel
          # leaves it in the device heap (keep resets the context: the heap is beyond the scrub).
          kptx=$build/tests/gpu_double/test_kernels.ptx
          timeout 60 "$build/tests/bin/drv_recycle" --self --ptx "$kptx" --mib 64 2>&1 | grep -E "own past|checks|^limits" |
            sed 's/^/recycle (native, one context): /' | tee -a "$final/lifecycle.txt"
          for variant in full plain heap; do
            extra=() probe_extra=()
            [ $variant = plain ] && extra=(--plain --kernels) probe_extra=(--plain --kernels)
            [ $variant = heap ] && extra=(--plain --heap) probe_extra=(--plain --kernels)
            for how in native ivcuda; do
              env=() handles=
              [ $how = ivcuda ] && env=(IVCUDA_SOCKET="$sock" LD_LIBRARY_PATH="$build/lib") handles=--handles
              env "${env[@]}" "$build/tests/bin/drv_recycle" --leave --mib 1024 --ptx "$kptx" "${extra[@]}" \
                >"$work/recycle-$how-leave.txt" 2>&1
              lrc=$?
              line=$(grep '^left ' "$work/recycle-$how-leave.txt")
              sleep 1
              mark=$(stat -c %s "$log")
              env "${env[@]}" "$build/tests/bin/drv_recycle" --probe "$line" --mib 1024 --allow-mib 4096 $handles \
                --ptx "$kptx" "${probe_extra[@]}" >"$work/recycle-$how-probe.txt" 2>&1
              prc=$?
              echo "recycle ($how, $variant): leave status $lrc, probe status $prc: $(grep -E "^(free|the leaver|drv_recycle)" \
                "$work/recycle-$how-probe.txt" | tr '\n' ';')" | tee -a "$final/lifecycle.txt"
              [ $lrc -eq 0 ] && [ $prc -eq 0 ] || { rc=1; cat "$work/recycle-$how-leave.txt" "$work/recycle-$how-probe.txt"; }
              if [ $how = ivcuda ]; then  # both were ivcudad's guests, the second on a recycled worker
                leaver=$(sed -n 's/.*pid=\([0-9]*\) .*/\1/p' "$work/recycle-$how-leave.txt")
                prober=$(sed -n 's/^probe pid=\([0-9]*\)$/\1/p' "$work/recycle-$how-probe.txt")
                grep -q "process $leaver says hello" "$log" && grep -q "process ${prober:-none} says hello" "$log" &&
                  grep -q "is kept for the next guest" "$log" ||
                  { echo "recycle (ivcuda): ivcudad's log does not show the leaver and the probe served and a worker kept"; rc=1; }
                head -c "$mark" "$log" | grep -o "releasing .* for the tenant's next guest.*" | tail -1 |
                  sed 's/^/recycle (ivcuda, '$variant'): /' | tee -a "$final/lifecycle.txt"
                head -c "$mark" "$log" | grep -o "context kept for the next guest, scrubbed in [0-9]* ms" | tail -1 |
                  sed 's/^/recycle (ivcuda, '$variant'): /' | tee -a "$final/lifecycle.txt"
              fi
            done
          done
          first=0
        fi
        { echo "workers recycled: $(grep -c "is kept for the next guest" "$log");" \
            "guests refused: $(grep -c "refusing a guest" "$log")"
          grep "refusing a guest" "$log" | head -2
          grep -o "releasing .* for the tenant's next guest" "$log" | head -1
        } | tee -a "$final/lifecycle.txt"
        grep -o 'recycled for guest [0-9]*: [^(]*(driver start [^)]*)' "$log" | head -3 |
          tee -a "$final/lifecycle.txt"
        kill $daemon; wait $daemon 2>/dev/null
        { echo "ivcudad's workers: $(grep -o '(driver start [^)]*)' "$log" |
            sort | uniq -c | sort -rn | head -6 | tr '\n' ';')"
          echo "contexts (ms, of which waiting a turn), in order: $(grep -o 'context [0-9]* ms of which [0-9]*' "$log" |
            awk '{printf "%s/%s ", $2, $6}')"
          echo "resets (ms, of which waiting a turn): $(grep -o 'reset [0-9]* ms of which [0-9]*' "$log" |
            awk '{printf "%s/%s ", $2, $6}')"
          echo "contexts kept for the next guest (scrub ms): $(grep -o 'context kept for the next guest, scrubbed in [0-9]*' "$log" |
            awk '{printf "%s ", $NF}')"
          echo "kept contexts' scrub failures: $(grep -c 'scrubbing the kept context failed' "$log");" \
            "not kept, why: $(grep -o 'not kept: [^;]*$' "$log" | sort | uniq -c | sort -rn | head -4 | tr '\n' ';')"
          echo "workers ended on their guest's death: $(grep -c 'its worker ends now' "$log")"
        } | tee -a "$final/lifecycle.txt"
      done
    fi
    part lifecycle $rc ;;
  checkpoint)
    build=$root/build/gpu
    rc=0
    build_gpu ivcudad ivcuda_guest drv_checkpoint || rc=1
    if [ $rc -eq 0 ]; then
      : >"$final/checkpoint.txt"
      # Natively: by another process, with the target calling meanwhile and quiet, and by itself
      # (what the driver does with each; no verdict).
      # IVCUDA_CHECKPOINT_NATIVE=0 skips these (a short lease)
      [ "${IVCUDA_CHECKPOINT_NATIVE:-1}" = 0 ] && natives="" || natives='"" --quiet --self'
      eval "set -- $natives"
      for how in "$@"; do
        echo "=== natively, 1024 MiB, ${how:-by another process}" | tee -a "$final/checkpoint.txt"
        timeout 60 stdbuf -oL "$build/tests/bin/drv_checkpoint" --mib 1024 --hold-ms 1000 $how 2>&1 |
          tee -a "$final/checkpoint.txt"
        echo "exit ${PIPESTATUS[0]}" | tee -a "$final/checkpoint.txt"
      done
      # A guest's worker under each sandbox, checkpointed by a process of root's and of the
      # workers' user. Under --sandbox audit what the allowlist lacks is made and the kernel
      # logs it (seccomp's audit type 1326, Landlock's denials): the calls and files the
      # driver's checkpointing needs in the worker. Verdicts: the default sandbox's run only.
      for how in "on:root" "audit:root" "audit:nobody" "off:root"; do
        mode=${how%%:*} who=${how#*:}
        # in /tmp, where the workers' user reads it ($work is root's alone)
        sock=/tmp/ivcuda-checkpoint-$mode-$who.sock log=/tmp/ivcuda-checkpoint-$mode-$who.log
        rm -f "$sock" "$log"
        user=() as=()
        [ "$who" = root ] || { user=(--user "$who"); as=(setpriv --reuid="$who" --regid="$(id -g "$who")" --clear-groups); }
        marks=$(dmesg 2>/dev/null | wc -l)
        IVCUDA_SANDBOX=$mode "$build/host-daemon/ivcudad" --socket "$sock" --driver libcuda.so.1 "${user[@]}" >"$log" 2>&1 &
        daemon=$!
        for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
        chmod a+rw "$sock" "$log"
        echo "=== a guest's worker, --sandbox $mode, workers' user $who, checkpointed by $who, 1024 MiB" |
          tee -a "$final/checkpoint.txt"
        IVCUDA_SOCKET=$sock timeout 60 "${as[@]}" stdbuf -oL "$build/tests/bin/drv_checkpoint" --mib 1024 --hold-ms 1000 --quiet \
          --child-lib "$build/lib" --daemon-log "$log" 2>&1 | tee -a "$final/checkpoint.txt"
        st=${PIPESTATUS[0]}
        [ "$mode" != on ] || [ "$st" -eq 0 ] || rc=1
        kill $daemon; wait $daemon 2>/dev/null
        cp "$log" "$work/"
        grep -iE "warn|error|denied" "$log" | grep -vE "no control socket|SANDBOX (AUDIT|OFF)|sandbox OFF" | head -6 |
          tee -a "$final/checkpoint.txt"
        dmesg 2>/dev/null | tail -n +$((marks + 1)) | grep -E "type=1326|landlock|audit" | sed -E 's/^\[[^]]*\] //' |
          sed -E 's/ (pid|ses|auid|uid|gid)=[0-9]+//g' | sort | uniq -c | sort -rn | head -20 | tee -a "$final/checkpoint.txt"
      done
    fi
    part checkpoint $rc ;;
  suspend)
    if build_gpu ivcudad ivcudactl ivcuda_guest drv_checkpoint; then
      OUT=$work timeout 540 bash tests/gpu/run_suspend_on_gpu.sh build/gpu 2>&1 | tee "$final/suspend.txt"
      part suspend "${PIPESTATUS[0]}"
    else
      part suspend 1
    fi ;;
  vm-suspend)
    if build_gpu ivcudad ivcudactl ivcuda_guest drv_checkpoint drv_core; then
      PATH=$root/.deps/qemu:$PATH IVCUDA_VM_IMAGE_BUNDLE=$root/.deps/guest IVCUDA_GUEST_ACCEL=tcg \
        IVCUDA_VM_SUSPEND_SANDBOX=${IVCUDA_VM_SUSPEND_SANDBOX:-off} timeout 400 \
        bash tests/guest_vm/vm_suspend_test.sh /tmp/ivcuda-vm-suspend-image build/gpu libcuda.so.1 2>&1 |
        tee "$final/vm-suspend.txt"
      part vm-suspend "${PIPESTATUS[0]}"
    else
      part vm-suspend 1
    fi ;;
  vm-starts)
    if build_gpu ivcudad ivcuda_guest ivcuda-bench; then
      PATH=$root/.deps/qemu:$PATH IVCUDA_VM_IMAGE_BUNDLE=$root/.deps/guest IVCUDA_GUEST_ACCEL=tcg OUT=$work \
        timeout 500 bash tests/guest_vm/vm_starts.sh /tmp/ivcuda-vm-starts-image build/gpu libcuda.so.1 2>&1 |
        tee "$final/vm-starts.txt"
      rc=${PIPESTATUS[0]}
      cp "$work/vm-starts.json" "$final/" 2>/dev/null
      part vm-starts "$rc"
    else
      part vm-starts 1
    fi ;;
  ckpt-trace)
    if build_gpu ivcudad ivcuda_guest drv_checkpoint; then
      OUT=$work timeout 400 bash tests/gpu/trace_checkpoint_syscalls.sh build/gpu 2>&1 | tee "$final/ckpt-trace.txt"
      part ckpt-trace "${PIPESTATUS[0]}"
    else
      part ckpt-trace 1
    fi ;;
  startup)
    build=$root/build/gpu
    rc=0
    build_gpu ivcuda-bench ivcudad ivcuda_guest || rc=1
    for warm in 1 0; do
      [ $rc -eq 0 ] || break
      sock=/tmp/ivcuda-startup.sock
      rm -f "$sock"
      "$build/host-daemon/ivcudad" --socket "$sock" --shm-size 4G --channels 8 --driver libcuda.so.1 \
        --warm-workers $warm >"$work/startup-warm$warm-ivcudad.log" 2>&1 &
      daemon=$!
      for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
      echo "== start-up, --warm-workers $warm (--shm-size 4G)" | tee -a "$final/startup.txt"
      # With warm workers also a quick solo run: its copies compare with the huge-page run below.
      bparts=startup
      [ $warm = 0 ] || bparts=startup,solo
      timeout 200 "$build/bench/ivcuda-bench" --only $bparts --quick --startup-runs "${IVCUDA_STARTUP_RUNS:-5}" \
        --startup-gap-ms 4000 --settle-ms 4000 --ptx "$build/tests/gpu_double/test_kernels.ptx" \
        --ivcuda-lib "$build/lib" --socket "$sock" --daemon-log "$work/startup-warm$warm-ivcudad.log" \
        --json "$work/startup-warm$warm.json" 2>&1 |
        grep -E "^(figure|startup|htod|dtoh)" | tee -a "$final/startup.txt"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      kill $daemon; wait $daemon 2>/dev/null
      echo "ivcudad's workers (warm $warm): $(grep -o '(driver start [^)]*)' "$work/startup-warm$warm-ivcudad.log" |
        sort | uniq -c | sort -rn | head -4 | tr '\n' ';')" | tee -a "$final/startup.txt"
    done
    # The same on 2 MiB huge pages (--huge-pages on): the pool reserved for two 4 GiB guests (the
    # one served and the warm one) and given back after; registration time and, from a quick solo
    # run, the staged (pageable) copies.
    before=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null || echo 0)
    if [ $rc -eq 0 ] && echo $((before + 4200)) >/proc/sys/vm/nr_hugepages 2>/dev/null; then
      sock=/tmp/ivcuda-startup.sock
      rm -f "$sock"
      "$build/host-daemon/ivcudad" --socket "$sock" --shm-size 4G --channels 8 --driver libcuda.so.1 \
        --warm-workers 1 --huge-pages on >"$work/startup-huge-ivcudad.log" 2>&1 &
      daemon=$!
      for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
      echo "== start-up, --warm-workers 1 --huge-pages on (--shm-size 4G; $(grep HugePages_Free /proc/meminfo))" |
        tee -a "$final/startup.txt"
      timeout 200 "$build/bench/ivcuda-bench" --only startup,solo --quick --startup-runs "${IVCUDA_STARTUP_RUNS:-5}" \
        --startup-gap-ms 4000 --settle-ms 4000 --ptx "$build/tests/gpu_double/test_kernels.ptx" \
        --ivcuda-lib "$build/lib" --socket "$sock" --daemon-log "$work/startup-huge-ivcudad.log" \
        --json "$work/startup-huge.json" 2>&1 |
        grep -E "^(figure|startup|htod|dtoh)" | tee -a "$final/startup.txt"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      kill $daemon; wait $daemon 2>/dev/null
      echo "ivcudad's workers (huge pages): $(grep -c 'on 2 MiB huge pages' "$work/startup-huge-ivcudad.log") guests on huge pages; $(grep -o '(driver start [^)]*)' "$work/startup-huge-ivcudad.log" |
        sort | uniq -c | sort -rn | head -4 | tr '\n' ';')" | tee -a "$final/startup.txt"
      echo "$before" >/proc/sys/vm/nr_hugepages
    else
      echo "no huge-page run: vm.nr_hugepages cannot be raised here" | tee -a "$final/startup.txt"
    fi
    # What this host offers for huge pages (the arena's, issue 19): reserved 2 MiB pages, shmem THP.
    { echo "huge pages: $(grep -E 'HugePages_(Total|Free)|Hugepagesize' /proc/meminfo | tr -s ' ' | tr '\n' ';')" \
        "shmem THP: $(cat /sys/kernel/mm/transparent_hugepage/shmem_enabled 2>&1)"
      before=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null)
      if echo $((before + 16)) >/proc/sys/vm/nr_hugepages 2>/dev/null; then
        echo "nr_hugepages can be raised here ($before -> $(cat /proc/sys/vm/nr_hugepages))"
        echo "$before" >/proc/sys/vm/nr_hugepages
      else
        echo "nr_hugepages cannot be raised here"
      fi; } 2>&1 | tee -a "$final/startup.txt"
    part startup $rc ;;
  cost)
    if build_gpu drv_context_cost; then
      timeout 300 "$root/build/gpu/tests/bin/drv_context_cost" 2>&1 | tee "$final/cost.txt"
      part cost "${PIPESTATUS[0]}"
    else
      part cost 1
    fi ;;
  absent)
    rc=0
    b=${IVCUDA_GPU_PREBUILT:-$root/build/gpu}
    [ -n "${IVCUDA_GPU_PREBUILT:-}" ] || build_gpu drv_absent ivcudad ivcuda_guest || rc=1
    if [ $rc -eq 0 ]; then
      nm -D --defined-only "$b/lib/libcuda.so.1" | awk '$2 == "W" { print $3 }' | sort >"$work/absent.names"
      timeout 120 "$b/tests/bin/drv_absent" "$work/absent.names" >"$final/absent-native.txt" 2>"$work/absent-native.err"
      rn=$?
      sock=$work/absent.sock
      "$b/host-daemon/ivcudad" --socket "$sock" --control-socket none --driver libcuda.so.1 >"$work/absent-ivcudad.log" 2>&1 &
      daemon=$!
      for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
      IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$b/lib timeout 120 "$b/tests/bin/drv_absent" "$work/absent.names" \
        >"$final/absent-ivcuda.txt" 2>"$work/absent-ivcuda.err"
      ri=$?
      kill $daemon; wait $daemon 2>/dev/null
      echo "absent: $(wc -l <"$work/absent.names") exports; native exit $rn, ivcuda exit $ri; answers that differ:"
      diff "$final/absent-native.txt" "$final/absent-ivcuda.txt" | grep -c '^<'
      [ $rn -eq 0 ] && [ $ri -eq 0 ] || rc=1
    fi
    part absent $rc ;;
  *) echo "unknown part $p"; part "$p" 2 ;;
  esac
done
tar czf "$final/logs.tgz" -C "$work" . 2>/dev/null
echo "== run_all: ${#ok[@]} of $((${#ok[@]} + ${#bad[@]})) parts passed (${ok[*]:-none})${bad:+; failed: ${bad[*]}}; $((SECONDS - start)) s"
[ ${#bad[@]} -eq 0 ]
