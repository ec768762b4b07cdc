#!/usr/bin/env bash
# VM mode on the GPU machine: a stock QEMU guest (TCG: nested KVM does not work
# there) runs the unmodified driver-API programs through ivcuda's libcuda.so.1,
# over ivshmem, against ivcudad and the real driver. What
# tests/guest_vm/vm_ivcuda_test.sh does on a CPU machine, with nothing
# installed: QEMU and the guest's kernel side come from .deps/ (made on Debian
# 12 by tools/guest/bundle-qemu.sh and tools/guest/bundle-image.sh pack), the
# programs are built here and appended to the guest's initramfs.
#
# usage (repository root): bash tests/gpu/run_vm_on_gpu.sh [BUILD_DIR [DRIVER]]
#   BUILD_DIR  default build/gpu (run_gpu_suite.sh's); the targets it needs are
#              built when missing or stale (configured first if need be)
#   DRIVER     what ivcudad loads: default libcuda.so.1, the real driver; the
#              GPU test double's path (libivcuda_gpu_double.so) on a CPU machine
# Logs go to $OUT/vm (default out/vm). A program passes in the guest when it
# exits 0, ivcudad's log shows that very guest process said hello (so it went
# through ivcuda, not some other libcuda.so.1), and - for the programs whose
# output is deterministic - its output equals the same program's run natively
# on this host (with the test double: through ivcuda in process mode). The
# exit status is the verdict: every case expected from the lists below must
# pass. Guest timings are under TCG and labelled so: they show what the
# transport costs a software-emulated CPU, not what it costs under KVM.
set -u
root=$(pwd)
build=${1:-$root/build/gpu}
driver=${2:-libcuda.so.1}
out=${OUT:-$root/out}/vm
mkdir -p "$out"
[[ $build == /* ]] || build=$root/$build
guest=$root/tools/guest

die() { echo "FAIL: $*"; exit 1; }
[[ -x $root/.deps/qemu/qemu-system-x86_64 ]] || die "no QEMU bundle in .deps/qemu (tools/guest/bundle-qemu.sh .deps/qemu on Debian 12)"
[[ -s $root/.deps/guest/vmlinux.xz ]] || die "no guest image in .deps/guest (tools/guest/bundle-image.sh pack .deps/guest on Debian 12)"

echo "== QEMU from .deps/qemu"
export PATH=$root/.deps/qemu:$PATH
qemu-system-x86_64 --version | head -1 || die "the bundled QEMU does not start"

echo "== build ($build)"
# The same build dependencies as run_gpu_suite.sh, in case cmake reconfigures.
deps=/tmp/ivcuda-deps
if compgen -G "$root/.deps/*.deb" >/dev/null; then
  if [[ ! -d $deps/usr ]]; then
    mkdir -p "$deps"
    for f in "$root"/.deps/*.deb; do dpkg -x "$f" "$deps"; done
  fi
  export PKG_CONFIG_SYSROOT_DIR=$deps
  export PKG_CONFIG_PATH=$deps/usr/lib/x86_64-linux-gnu/pkgconfig
  export CPLUS_INCLUDE_PATH=$deps/usr/include
  export LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu
fi
if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$deps/usr" \
    >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; die "configure failed"; }
fi
targets="ivcuda-bench ivcudad ivcuda_guest drv_core drv_kernels drv_errors drv_roundtrip drv_hostreg drv_vmm drv_vmm_share drv_arrays drv_sparse drv_pools drv_pool_share drv_capture_modes drv_memops drv_isolation drv_ipc drv_graph_build rt_texture rt_ipc rt_graphs rt_nvbench_pattern ivcuda_gpu_double_kernels"
# shellcheck disable=SC2086 # one word per target
cmake --build "$build" -j "$(nproc)" --target $targets >"$out/build.log" 2>&1 ||
  { grep -E "error|Error" "$out/build.log" | head -30; die "build failed"; }

lib=$build/lib
bin=$build/tests/bin
kernels=$build/tests/gpu_double
# The guest's programs: "name|arguments|check". @PTX@ and @FAT@ stand for the
# test kernels' paths (in the guest /opt/ivcuda/..., on this host the build's).
# check: "diff" compares the output with the reference run, "timing" (figures
# that differ run to run) only the exit status and the daemon's log.
# drv_errors --fault leaves the VM's contexts broken: it runs last.
cases=(
  "drv_core||diff"
  "drv_kernels|--ptx @PTX@ --fatbin @FAT@|diff"
  "drv_roundtrip|--rounds 1000 --gap-us 1000|timing"
  "drv_hostreg|--ptx @PTX@|diff"
  "drv_vmm|--ptx @PTX@|diff"
  "drv_vmm_share||diff"
  "drv_arrays|--ptx @PTX@|diff"
  "drv_sparse||diff"
  "drv_pools|--ptx @PTX@|diff"
  "drv_pool_share|--ptx @PTX@|diff"
  "drv_capture_modes||diff"
  "drv_ipc|--ptx @PTX@|diff"
  "drv_graph_build|--ptx @PTX@|diff"
  "drv_memops||diff"
  "drv_isolation|--reclaim --mib 1024 --fault --ptx @PTX@|diff"
  "rt_texture_static||diff"
  "rt_ipc_static||diff"
  "rt_graphs_static||diff"
  "rt_nvbench_pattern_static||diff"
  "ivcuda-bench|--child solo --quick --ptx @PTX@|timing"
  "drv_errors|--ptx @PTX@ --fault|diff"
)
progs=()
for c in "${cases[@]}"; do
  p=${c%%|*}
  [[ $p == ivcuda-bench ]] || progs+=("$p")
done
for f in "$lib/libcuda.so.1" "$kernels/test_kernels.ptx" "$kernels/test_kernels.fatbin" "${progs[@]/#/$bin/}" \
         "$build/bench/ivcuda-bench"; do
  [[ -e $f ]] || die "$f is not built"
done
# shellcheck source=../lib/verdicts.sh
. "$root/tests/lib/verdicts.sh"
modes=(doorbell plain)
# per mode: each guest program, and the daemon alive after the guest; plus the process-mode run
expect_cases $((${#modes[@]} * (${#cases[@]} + 1) + 1))

echo "== guest image (.deps/guest + this machine's programs)"
image=/tmp/ivcuda-vm-image
add=()
for p in "${progs[@]}"; do add+=(--add-bin "$bin/$p:/usr/bin/$p"); done
# LD_LIBRARY_PATH: ldd must resolve the programs' libcuda.so.1 to ivcuda's,
# never to the machine's real driver. The image keeps host paths, so the guest
# finds it through the same variable.
LD_LIBRARY_PATH=$lib "$guest/bundle-image.sh" unpack "$root/.deps/guest" "$image" \
  --add-bin "$lib/libcuda.so.1" "${add[@]}" --add-bin "$build/bench/ivcuda-bench:/usr/bin/ivcuda-bench" \
  --add "$kernels/test_kernels.ptx:/opt/ivcuda/test_kernels.ptx" \
  --add "$kernels/test_kernels.fatbin:/opt/ivcuda/test_kernels.fatbin" || die "image unpack failed"
cmp -s "$lib/libcuda.so.1" "$image/extra-root$lib/libcuda.so.1" || die "the image's libcuda.so.1 is not ivcuda's"

tmp=$(mktemp -d /tmp/ivcuda-vm-gpu.XXXXXX)
daemon=
shm=
cleanup() {
  if [[ -n $daemon ]]; then
    # Seen once: a SIGTERM in the same millisecond as an ivshmem-plain
    # worker's start left that worker, and so the daemon, running. Give them
    # 10 s, then end the daemon's own children, by id, and the daemon.
    local kids
    kids=$(ps -o pid= --ppid "$daemon" 2>/dev/null || true)
    kill "$daemon" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$daemon" 2>/dev/null; then
      echo "WARN: ivcudad ($daemon) did not stop within 10 s of SIGTERM; killing it and its workers $kids"
      # shellcheck disable=SC2086 # one word per pid
      kill -KILL $kids "$daemon" 2>/dev/null
    fi
    wait "$daemon" 2>/dev/null
  fi
  daemon=
  if [[ -n $shm ]]; then rm -f "$shm"; fi
  shm=
}
trap 'cleanup; rm -rf "$tmp"' EXIT

vectors=4
sock=$tmp/ivcudad.sock
start_daemon() {  # mode, vectors, then extra ivcudad options
  local mode=$1 nvec=$2; shift 2
  rm -f "$sock"
  "$build/host-daemon/ivcudad" --socket "$sock" --vectors "$nvec" --shm-size 256M --channels 8 \
    --staging-size 4M --driver "$driver" "$@" >"$out/ivcudad-$mode.log" 2>&1 &
  daemon=$!
  for _ in $(seq 200); do [[ -S $sock ]] && return 0; sleep 0.05; done
  cat "$out/ivcudad-$mode.log"
  die "ivcudad did not start ($mode)"
}

# The guest script: every program runs even when one fails; each one's output
# is framed by GUEST_BEGIN and GUEST_RESULT, its first line its process id.
# (Short: it travels on the guest kernel's command line.)
guest_cmd="export LD_LIBRARY_PATH=$lib; rc=0; K=/opt/ivcuda
t() { echo GUEST_BEGIN \$1; sh -c 'echo GUEST_PID \$\$; exec \"\$@\"' g \"\$@\" >/tmp/o 2>&1; r=\$?; cat /tmp/o
echo GUEST_RESULT \$r \$1; [ \$r = 0 ] || rc=1; }"
for c in "${cases[@]}"; do
  IFS='|' read -r p args _ <<<"$c"
  args=${args//@PTX@/\$K/test_kernels.ptx}
  args=${args//@FAT@/\$K/test_kernels.fatbin}
  guest_cmd+="
t $p $args"
done
guest_cmd+="
exit \$rc"

# The reference each deterministic program's guest output is compared with:
# the same program and arguments on this host, natively with the real driver;
# with the test double, through ivcuda in process mode (the double is no
# libcuda.so.1 that cudart could use natively).
refdir=$out/reference
mkdir -p "$refdir"
reference_runs() {
  local c p args check
  for c in "${cases[@]}"; do
    IFS='|' read -r p args check <<<"$c"
    [[ $check == diff ]] || continue
    args=${args//@PTX@/$kernels/test_kernels.ptx}
    args=${args//@FAT@/$kernels/test_kernels.fatbin}
    # shellcheck disable=SC2086 # one word per argument
    if [[ $driver == libcuda.so.1 ]]; then
      timeout 300 "$bin/$p" $args >"$refdir/$p.out" 2>&1
    else
      IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$lib timeout 300 "$bin/$p" $args >"$refdir/$p.out" 2>&1
    fi
    echo "reference $p: exit $? ($(tail -1 "$refdir/$p.out"))"
  done
}

run_guest() {  # mode, then run-in-guest.sh device options
  local mode=$1; shift
  local log=$out/guest-$mode.log rc=0 c p check r pid
  "$guest/run-in-guest.sh" --image "$image" "$@" --accel tcg --timeout 200 --log "$log" \
    "$guest_cmd" >/dev/null 2>"$out/run-in-guest-$mode.err" || rc=$?
  echo "-- $mode: run-in-guest exit $rc ($(grep -a 'run-in-guest:' "$out/run-in-guest-$mode.err" | tail -1))"
  tr -d '\r' <"$log" >"$log.clean"
  for c in "${cases[@]}"; do
    IFS='|' read -r p _ check <<<"$c"
    # The program's section of the console: its pid line, its output, its result.
    awk -v b="GUEST_BEGIN $p" -v e="GUEST_RESULT " '$0 == b {on = 1; next} on && index($0, e) == 1 {print; exit}
         on {print}' "$log.clean" >"$out/$mode-$p.section"
    r=$(sed -n 's/^GUEST_RESULT \([0-9]*\) .*/\1/p' "$out/$mode-$p.section")
    pid=$(sed -n 's/^GUEST_PID \([0-9]*\)$/\1/p' "$out/$mode-$p.section" | head -1)
    grep -v -e '^GUEST_PID ' -e '^GUEST_RESULT ' "$out/$mode-$p.section" >"$out/$mode-$p.out"
    local why=
    if [[ -z $r ]]; then why="no result from the guest"
    elif [[ $r != 0 ]]; then why="exit $r"
    elif [[ -z $pid ]] || ! served_by "$out/ivcudad-$mode.log" "$pid"; then
      why="not served by ivcudad: no hello from guest process ${pid:-?} in its log"
    elif [[ $check == diff ]] && ! diff -q "$refdir/$p.out" "$out/$mode-$p.out" >/dev/null; then
      why="output differs from the reference run"
    fi
    if [[ -z $why ]]; then
      local how="output = reference run"
      [[ $check == diff ]] || how="timings: exit status and served only"
      verdict "vm-$mode $p (TCG guest, served, $how): $(tail -1 "$out/$mode-$p.out")" 0
    else
      echo "  $why"
      if [[ $why == output* ]]; then diff "$refdir/$p.out" "$out/$mode-$p.out" | head -10; else tail -5 "$out/$mode-$p.out"; fi
      verdict "vm-$mode $p (TCG guest)" 1
    fi
  done
  grep -a '^roundtrip ' "$log.clean" | sed "s/^/TCG guest, ivshmem-$mode: /"
  # ivcuda-bench child lines: "figure unit value"
  grep -aE '^(null|launch|sleep|htod|dtoh|dtod)[.][^ ]+ [^ ]+ [0-9.e+-]+' "$log.clean" |
    sed "s/^/TCG guest, ivshmem-$mode, ivcuda-bench: /"
  kill -0 "$daemon" 2>/dev/null
  verdict "vm-$mode: ivcudad still running after the guest" $?
  echo "-- ivcudad ($mode), last lines"
  tail -n 4 "$out/ivcudad-$mode.log"
}

echo "== for scale: the same round trips on this machine, outside any VM"
if [[ $driver == libcuda.so.1 ]]; then
  "$bin/drv_roundtrip" 2>&1 | grep '^roundtrip' | sed 's/^/native (no ivcuda): /'
fi
# Process mode: the guest library asks for 8 vectors, ivcudad's default.
start_daemon process 8
IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$lib "$bin/drv_roundtrip" >"$out/process-roundtrip.txt" 2>&1
verdict "process-mode drv_roundtrip" $?
grep '^roundtrip' "$out/process-roundtrip.txt" | sed 's/^/host process, ivcuda process mode: /'
echo "== reference runs of the deterministic guest programs ($([[ $driver == libcuda.so.1 ]] && echo native || echo "through ivcuda, process mode: $driver is a test double"))"
reference_runs
cleanup

echo "== doorbell mode: ivshmem-doorbell, $vectors MSI-X vectors, on ivcudad's socket"
start_daemon doorbell $vectors
run_guest doorbell --socket "$sock" --vectors $vectors
cleanup

echo "== plain mode: ivshmem-plain on a memory file (no interrupts, both sides poll)"
dir=/dev/shm
[[ -d $dir && -w $dir ]] || dir=$tmp
shm=$dir/ivcuda-vm-plain-$$
start_daemon plain $vectors --plain-file "$shm"
# The daemon formats the memory file as it starts, not necessarily before its
# socket listens.
for _ in $(seq 200); do grep -q "ivshmem-plain guest" "$out/ivcudad-plain.log" && break; sleep 0.05; done
grep -q "ivshmem-plain guest" "$out/ivcudad-plain.log" || { cat "$out/ivcudad-plain.log"; die "ivcudad did not format $shm"; }
run_guest plain --shm-file "$shm" --shm-size $((256 << 20))
cleanup

echo "== VM summary (guest figures: TCG, 1 vCPU; logs in $out):"
finish
