#!/usr/bin/env bash
# VM mode on the GPU machine: a stock QEMU guest (TCG: nested KVM does not work
# there) runs the unmodified driver-API programs through ivcuda's libcuda.so.1,
# over ivshmem, against ivcudad and the real driver. What
# tests/guest_vm/vm_ivcuda_test.sh does on a CPU machine, with nothing
# installed: QEMU and the guest's kernel side come from .deps/ (made on Debian
# 12 by tools/guest/bundle-qemu.sh and tools/guest/bundle-image.sh pack), the
# programs are built here and appended to the guest's initramfs.
#
# usage (repository root): bash tests/gpu/run_vm_on_gpu.sh [BUILD_DIR [DRIVER [NVML]]]
#   BUILD_DIR  default build/gpu (run_gpu_suite.sh's); the targets it needs are
#              built when missing or stale (configured first if need be)
#   DRIVER     what ivcudad loads: default libcuda.so.1, the real driver; the
#              GPU test double's path (libivcuda-gpu-double.so) on a CPU machine
#   NVML       the host's NVML, which ivcudad's workers load (--nvml) and the
#              host-side reference asks natively: default libnvidia-ml.so.1
#              with the real driver, the build's NVML test double
#              (tests/nvml_double/libivcuda-nvml-double.so) with the GPU double
# PYTHON=PATH picks the python3 staged into the guest (default /usr/bin/python3).
# Logs go to $OUT/vm (default out/vm). A program passes in the guest when it
# exits 0, ivcudad's log shows that very guest process said hello (so it went
# through ivcuda, not some other libcuda.so.1), and - for the programs whose
# output is deterministic - its output equals the same program's run natively
# on this host. With the test double, "natively" is the double as the program's
# own libcuda.so.1 (as run_device_selection_tests.sh does), where the program
# allows: the runtime-API programs need the driver's export tables, which the
# double lacks, so theirs is a run through ivcuda in process mode, and their
# case says so (ivcuda compared with ivcuda: a check of the VM transport only). The
# exit status is the verdict: every case expected from the lists below must
# pass. Guest timings are under TCG and labelled so: they show what the
# transport costs a software-emulated CPU, not what it costs under KVM.
#
# NVML in the guest (doorbell mode, first): ivcuda's libnvidia-ml.so.1 sits
# next to its libcuda.so.1, and ivcuda-smi (table, -L, --query-gpu), nvml_api,
# a pynvml script (tests/guest_vm/nvml_view.py), gpustat and nvitop -1 run in
# the guest, on this machine's own python3 with only the standard modules they
# load (tools/guest/stage-python.sh) and the wheels carried in .deps/wheels.
# The guest's name, UUID, memory total and PCI bus id must be the host's NVML's
# (nvml_view.py natively, and nvidia-smi where there is one), and its process
# list its own process alone while another tenant (nvml_api --hold in process
# mode) holds memory on the same GPU. PyTorch is not among them: the guest
# image has no torch, and under TCG it would take far too long to load
# (run_nvml_on_gpu.sh checks torch.cuda.list_gpu_processes() in process mode).
set -u
root=$(pwd)
build=${1:-$root/build/gpu}
driver=${2:-libcuda.so.1}
out=${OUT:-$root/out}/vm
mkdir -p "$out"
[[ $build == /* ]] || build=$root/$build
if [[ $driver == libcuda.so.1 ]]; then
  nvml=${3:-libnvidia-ml.so.1}
else
  nvml=${3:-$build/tests/nvml_double/libivcuda-nvml-double.so}
fi
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
targets="ivcuda-bench ivcudad ivcuda_guest drv_core drv_kernels drv_errors drv_roundtrip drv_hostreg drv_vmm drv_vmm_share drv_arrays drv_sparse drv_pools drv_pool_share drv_capture_modes drv_memops drv_isolation drv_ipc drv_graph_build drv_managed rt_texture rt_ipc rt_graphs rt_nvbench_pattern ivcuda_gpu_double_kernels"
# The guest's NVML, ivcuda-smi and the NVML test program (and the NVML double, when it is the host's NVML).
targets+=" ivcuda_nvml ivcuda-smi nvml_api"
[[ $nvml != "$build/tests/nvml_double/libivcuda-nvml-double.so" ]] || targets+=" ivcuda_nvml_double"
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
  "drv_managed|--ptx @PTX@|diff"
  "drv_isolation|--reclaim --mib 1024 --allow-mib @ALLOW@ --fault --ptx @PTX@|diff"
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
         "$build/bench/ivcuda-bench" "$lib/libnvidia-ml.so.1" "$build/bin/ivcuda-smi" "$bin/nvml_api"; do
  [[ -e $f ]] || die "$f is not built"
done
[[ $nvml != */* || -e $nvml ]] || die "no NVML library $nvml"
# shellcheck source=../lib/verdicts.sh
. "$root/tests/lib/verdicts.sh"
modes=(doorbell plain)
# The NVML checks after the doorbell guest (nvml_verdicts below).
nvml_checks=9
# per mode: each guest program, and the daemon alive after the guest; plus the process-mode run
expect_cases $((${#modes[@]} * (${#cases[@]} + 1) + 1 + nvml_checks))

tmp=$(mktemp -d /tmp/ivcuda-vm-gpu.XXXXXX)
daemon=
shm=
holder=
keep=
cleanup() {
  if [[ -n $keep ]]; then kill "$keep" 2>/dev/null; wait "$holder" 2>/dev/null; fi
  keep='' holder=''
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
# The GPU double's processes share one "GPU" through a ledger, from which the
# NVML double lists the processes that hold memory (the real driver ignores it).
[[ $driver == libcuda.so.1 ]] || export IVCUDA_DOUBLE_LEDGER=$tmp/ledger

# What the NVML checks need beyond the build: this machine's python3 and the
# wheels carried in .deps/wheels. Without them the checks report why.
nvml_why=
py=$(readlink -f "${PYTHON:-/usr/bin/python3}")
pywheel=$(compgen -G "$root/.deps/wheels/nvidia_ml_py-*.whl" | head -1)
tools=$root/.deps/wheels/tools
if [[ ! -x $py ]]; then
  nvml_why="no python3 at ${PYTHON:-/usr/bin/python3}"
elif [[ -z $pywheel ]]; then
  nvml_why="no nvidia-ml-py wheel in .deps/wheels (tools/install-deps.sh fetches it)"
elif ! compgen -G "$tools/nvitop-*.whl" >/dev/null || ! compgen -G "$tools/gpustat-*.tar.gz" >/dev/null; then
  nvml_why="no gpustat and nvitop in $tools (tests/gpu/fetch-deps.sh)"
fi
# The host's NVML as this machine's programs load it natively: the real
# libnvidia-ml.so.1 as the loader finds it, or the NVML double under that name.
host_env=(env)
if [[ $nvml == */* ]]; then
  mkdir -p "$tmp/host-nvml"
  ln -s "$nvml" "$tmp/host-nvml/libnvidia-ml.so.1"
  host_env=(env "LD_LIBRARY_PATH=$tmp/host-nvml${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
fi
pystage=$tmp/python
# host_view FILE: what the host's NVML says natively, through pynvml (nvml_view.py).
host_view() {
  "${host_env[@]}" PYTHONPATH="$pystage/site" timeout 60 "$py" -S "$root/tests/guest_vm/nvml_view.py" >"$1" 2>&1
}

vectors=4
sock=$tmp/ivcudad.sock
start_daemon() {  # mode, vectors, then extra ivcudad options
  local mode=$1 nvec=$2; shift 2
  rm -f "$sock"
  "$build/host-daemon/ivcudad" --socket "$sock" --vectors "$nvec" --shm-size 256M --channels 8 \
    --staging-size 4M --driver "$driver" --nvml "$nvml" "$@" >"$out/ivcudad-$mode.log" 2>&1 &
  daemon=$!
  for _ in $(seq 200); do [[ -S $sock ]] && return 0; sleep 0.05; done
  cat "$out/ivcudad-$mode.log"
  die "ivcudad did not start ($mode)"
}

# The guest script: every program runs even when one fails; each one's output
# is framed by GUEST_BEGIN and GUEST_RESULT, its first line its process id.
# (Short: it travels on the guest kernel's command line, which is nearly
# full; the NVML checks are a script in the image, nvml_checks.sh below.)
guest_head="export LD_LIBRARY_PATH=$lib; rc=0; K=/opt/ivcuda
t() { echo GUEST_BEGIN \$1; sh -c 'echo GUEST_PID \$\$; exec \"\$@\"' g \"\$@\" >/tmp/o 2>&1; r=\$?; cat /tmp/o
echo GUEST_RESULT \$r \$1; [ \$r = 0 ] || rc=1; }"
guest_cmd=
for c in "${cases[@]}"; do
  IFS='|' read -r p args _ <<<"$c"
  args=${args//@PTX@/\$K/test_kernels.ptx}
  args=${args//@FAT@/\$K/test_kernels.fatbin}
  guest_cmd+="
t $p $args"
done
guest_cmd+="
exit \$rc"

# The NVML checks in the guest, sourced by the doorbell guest's command before
# the programs: each framed as the programs are, under its own label.
write_nvml_checks() {  # FILE, the guest's python3
  cat >"$1" <<CHECKS
# run_vm_on_gpu.sh's NVML checks (the guest's busybox sh sources this).
n() { l=\$1; shift; echo GUEST_BEGIN \$l; sh -c 'echo GUEST_PID \$\$; exec "\$@"' g "\$@" >/tmp/o 2>&1; r=\$?
cat /tmp/o; echo GUEST_RESULT \$r \$l; [ \$r = 0 ] || rc=1; }
export PYTHONPATH=/opt/ivcuda/python
n nvml-smi ivcuda-smi
n nvml-smi-L ivcuda-smi -L
n nvml-smi-query ivcuda-smi --query-gpu=name,uuid,memory.total,pci.bus_id --format=csv,noheader
n nvml-api nvml_api --same-tenant-child
n nvml-pynvml $2 -S /opt/ivcuda/nvml_view.py --alloc-mib 64
n nvml-gpustat $2 -S -m gpustat
n nvml-nvitop $2 -S -m nvitop -1
unset PYTHONPATH
echo GUEST_NVML_DONE
CHECKS
}

# The reference each deterministic program's guest output is compared with:
# the same program and arguments on this host, natively with the real driver;
# with the test double, the double as the program's own libcuda.so.1 for the
# programs it can run so (it lacks the file-based entry points such as
# cuModuleLoad, and cudart's export tables); the others run through ivcuda in
# process mode, which only checks the VM's transport. $refdir/PROGRAM.how says which.
# (Seen with the double: drv_pools' zero-byte pool allocations answer
# INVALID_VALUE on the double itself and SUCCESS through ivcuda.)
double_direct=" drv_core drv_vmm drv_vmm_share drv_pools drv_capture_modes "
refdir=$out/reference
mkdir -p "$refdir" "$tmp/double-direct"
[[ $driver == libcuda.so.1 ]] || ln -sf "$(readlink -f "$driver")" "$tmp/double-direct/libcuda.so.1"
reference_runs() {
  local c p args check rc how
  for c in "${cases[@]}"; do
    IFS='|' read -r p args check <<<"$c"
    [[ $check == diff ]] || continue
    args=${args//@PTX@/$kernels/test_kernels.ptx}
    args=${args//@FAT@/$kernels/test_kernels.fatbin}
    args=${args//@ALLOW@/$reclaim_allow}
    # shellcheck disable=SC2086 # one word per argument
    if [[ $driver == libcuda.so.1 ]]; then
      timeout 300 "$bin/$p" $args >"$refdir/$p.out" 2>&1; rc=$?
      how="native"
    elif [[ $double_direct == *" $p "* ]]; then
      LD_LIBRARY_PATH=$tmp/double-direct timeout 300 "$bin/$p" $args >"$refdir/$p.out" 2>&1; rc=$?
      how="the double as its own libcuda.so.1"
    else
      IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$lib timeout 300 "$bin/$p" $args >"$refdir/$p.out" 2>&1; rc=$?
      how="ivcuda in process mode: a transport check, ivcuda against ivcuda"
    fi
    echo "$how" >"$refdir/$p.how"
    echo "reference $p ($how): exit $rc ($(tail -1 "$refdir/$p.out"))"
  done
}

# guest_section MODE LABEL: one program's part of MODE's console, into
# $out/MODE-LABEL.out; sets sec_r (its exit status, empty if it never
# finished) and sec_pid (its guest process id).
guest_section() {
  local mode=$1 label=$2 s=$out/$1-$2.section
  # The program's section of the console: its pid line, its output, its result.
  awk -v b="GUEST_BEGIN $label" -v e="GUEST_RESULT " '$0 == b {on = 1; next} on && index($0, e) == 1 {print; exit}
       on {print}' "$out/guest-$mode.log.clean" >"$s"
  sec_r=$(sed -n 's/^GUEST_RESULT \([0-9]*\) .*/\1/p' "$s")
  sec_pid=$(sed -n 's/^GUEST_PID \([0-9]*\)$/\1/p' "$s" | head -1)
  grep -v -e '^GUEST_PID ' -e '^GUEST_RESULT ' "$s" >"$out/$mode-$label.out"
}

run_guest() {  # mode, then run-in-guest.sh device options
  local mode=$1; shift
  local log=$out/guest-$mode.log rc=0 c p check cmd=$guest_head$guest_cmd
  [[ $mode != doorbell || -n $nvml_why ]] || cmd="$guest_head
. \$K/nvml_checks.sh$guest_cmd"
  cmd=${cmd//@ALLOW@/$reclaim_allow}
  "$guest/run-in-guest.sh" --image "$image" "$@" --accel tcg --timeout 200 --log "$log" \
    "$cmd" >/dev/null 2>"$out/run-in-guest-$mode.err" || rc=$?
  echo "-- $mode: run-in-guest exit $rc ($(grep -a 'run-in-guest:' "$out/run-in-guest-$mode.err" | tail -1))"
  tr -d '\r' <"$log" >"$log.clean"
  [[ $mode != doorbell ]] || nvml_verdicts
  for c in "${cases[@]}"; do
    IFS='|' read -r p _ check <<<"$c"
    guest_section "$mode" "$p"
    local why="" how="timings: exit status and served by ivcudad only"
    [[ $check != diff ]] || how="served by ivcudad, output = reference run ($(cat "$refdir/$p.how" 2>/dev/null))"
    # (mark 0: this mode's daemon has a log of its own, which served this one guest boot)
    if [[ -z $sec_r ]]; then why="no result from the guest"
    elif [[ $sec_r != 0 ]]; then why="exit $sec_r"
    elif [[ -z $sec_pid ]] || ! served_by "$out/ivcudad-$mode.log" "$sec_pid" 0; then
      why="not served by ivcudad: no hello from guest process ${sec_pid:-?} in its log"
    elif [[ $check == diff ]] && ! diff -q "$refdir/$p.out" "$out/$mode-$p.out" >/dev/null; then
      why="output differs from the reference run"
    fi
    if [[ -n $why ]]; then
      echo "  $why"
      if [[ $why == output* ]]; then diff "$refdir/$p.out" "$out/$mode-$p.out" | head -10; else tail -5 "$out/$mode-$p.out"; fi
    fi
    [[ -z $why ]]; local rc=$?
    verdict "vm-$mode $p (TCG guest; $how): $(tail -1 "$out/$mode-$p.out")" $rc
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

# nvml_ran LABEL: LABEL's section of the doorbell guest exited 0 and ivcudad
# served that process (its NVML went through ivcuda); says why not otherwise.
nvml_ran() {
  guest_section doorbell "$1"
  local why=
  if [[ -z $sec_r ]]; then why="no result from the guest"
  elif [[ $sec_r != 0 ]]; then why="exit $sec_r"
  elif [[ -z $sec_pid ]] || ! served_by "$out/ivcudad-doorbell.log" "$sec_pid" 0; then  # the doorbell daemon's own log
    why="not served by ivcudad: no hello from guest process ${sec_pid:-?} in its log"
  fi
  [[ -z $why ]] && return 0
  echo "  $1: $why"
  tail -8 "$out/doorbell-$1.out"
  return 1
}
# field FILE KEY: the value of "KEY: VALUE" in nvml_view.py's output.
field() { sed -n "s/^$2: //p" "$1" | head -1; }

# The NVML checks' verdicts, from the doorbell guest's console and the host's
# NVML asked natively (host-nvml.txt before the guest, host-nvml-tenant.txt
# while the other tenant held its memory).
nvml_verdicts() {
  local d=$out/doorbell host=$out/host-nvml.txt ok n i
  if [[ -n $nvml_why ]]; then
    for n in "ivcuda-smi" "ivcuda-smi -L" "ivcuda-smi --query-gpu" "nvml_api" "pynvml: identity" \
             "pynvml: processes" "gpustat" "nvitop -1" "python3 staged"; do
      not_run "vm-doorbell NVML: $n" "$nvml_why"
    done
    return
  fi
  echo "-- NVML in the doorbell guest, against the host's NVML ($nvml; pynvml natively: $(field "$host" library))"
  local count name0 bus0 total0
  count=$(grep -c '^gpu [0-9]*: ' "$host")
  name0=$(field "$host" "name 0") bus0=$(field "$host" "bus_id 0") total0=$(field "$host" "total 0")
  local mib0=$((${total0:-0} >> 20))

  ok=1; nvml_ran nvml-smi || ok=0
  if [[ $ok == 1 ]] && ! grep -qF "$bus0" "$d-nvml-smi.out"; then ok=0; echo "  the table does not show the host's bus id $bus0"; fi
  cat "$d-nvml-smi.out"
  verdict "vm-doorbell NVML: ivcuda-smi's table (TCG guest, served; GPU 0 at the host's bus id $bus0)" $((1 - ok))

  # -L and --query-gpu: what the host's NVML says, in nvidia-smi's formats;
  # and nvidia-smi's own answer, where this machine has one.
  : >"$tmp/want-L"; : >"$tmp/want-query"
  for ((i = 0; i < count; i++)); do
    echo "GPU $i: $(field "$host" "name $i") (UUID: $(field "$host" "uuid $i"))" >>"$tmp/want-L"
    field "$host" "gpu $i" >>"$tmp/want-query"
  done
  local smi_ref="the host's NVML (pynvml)"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi -L >"$out/nvidia-smi-L.txt" 2>&1
    nvidia-smi --query-gpu=name,uuid,memory.total,pci.bus_id --format=csv,noheader >"$out/nvidia-smi-query.txt" 2>&1
    smi_ref+=" and nvidia-smi"
  fi
  for n in L query; do
    ok=1; nvml_ran nvml-smi-$n || ok=0
    echo "  guest:"; sed 's/^/    /' "$d-nvml-smi-$n.out"
    if ! diff -q "$tmp/want-$n" "$d-nvml-smi-$n.out" >/dev/null; then
      ok=0; echo "  the host's NVML says:"; sed 's/^/    /' "$tmp/want-$n"
    fi
    if [[ -f $out/nvidia-smi-$n.txt ]] && ! diff -q "$out/nvidia-smi-$n.txt" "$d-nvml-smi-$n.out" >/dev/null; then
      ok=0; echo "  nvidia-smi says:"; sed 's/^/    /' "$out/nvidia-smi-$n.txt"
    fi
    if [[ $n == L ]]; then
      verdict "vm-doorbell NVML: ivcuda-smi -L = $smi_ref (every GPU's name and UUID)" $((1 - ok))
    else
      verdict "vm-doorbell NVML: ivcuda-smi --query-gpu=name,uuid,memory.total,pci.bus_id = $smi_ref" $((1 - ok))
    fi
  done

  ok=1; nvml_ran nvml-api || ok=0
  grep -q '^nvml_api: [0-9]* checks, 0 failed$' "$d-nvml-api.out" || ok=0
  [[ $ok == 1 ]] || grep -a 'FAIL' "$d-nvml-api.out" | head -10
  verdict "vm-doorbell NVML: nvml_api --same-tenant-child (identity as the guest's libcuda says it; this VM's two processes listed by guest pid with their memory; setters refused): $(tail -1 "$d-nvml-api.out")" $((1 - ok))

  # pynvml in the guest vs pynvml natively, line by line: name, UUID, total
  # (MiB and bytes), bus id of every GPU; the host's side from its own library.
  local py_ran=1
  nvml_ran nvml-pynvml || py_ran=0
  ok=$py_ran
  local keys='^(gpu|name|uuid|bus_id|total) '
  echo "  guest ($(field "$d-nvml-pynvml.out" library)):"; grep -E "$keys" "$d-nvml-pynvml.out" | sed 's/^/    /'
  if ! diff <(grep -E "$keys" "$host") <(grep -E "$keys" "$d-nvml-pynvml.out") >"$tmp/pynvml.diff"; then
    ok=0; echo "  differs from the host's NVML:"; sed 's/^/    /' "$tmp/pynvml.diff"
  fi
  if [[ $(field "$host" library) == "$lib"/* || $(field "$host" library) == [?]* ]]; then
    ok=0; echo "  the host's side did not load the host's NVML"
  fi
  verdict "vm-doorbell NVML: pynvml in the guest = the host's NVML natively ($count GPU(s): name, UUID, memory total, PCI bus id)" $((1 - ok))

  # Its process list: itself alone, by its guest pid, with at least the 64 MiB
  # it holds; meanwhile another tenant held memory on the same GPU, which the
  # host's NVML listed.
  local gpid procs others
  gpid=$(field "$d-nvml-pynvml.out" pid)
  procs=$(field "$d-nvml-pynvml.out" "processes 0")
  others=$(field "$out/host-nvml-tenant.txt" "processes 0")
  echo "  guest process $gpid sees on GPU 0: $procs; the host's NVML, while the other tenant held 100 MiB: $others"
  ok=$py_ran
  [[ -n $gpid && $procs =~ ^$gpid=([0-9]+)$ ]] && ((BASH_REMATCH[1] >= 64 << 20)) || ok=0
  [[ -n $others && $others != none ]] || { ok=0; echo "  the host's NVML listed no other tenant's process"; }
  verdict "vm-doorbell NVML: pynvml's process list is the guest's own process alone (its guest pid, >= 64 MiB; the host listed $others)" $((1 - ok))

  ok=1; nvml_ran nvml-gpustat || ok=0
  cat "$d-nvml-gpustat.out"
  grep -qF "[0] $name0 |" "$d-nvml-gpustat.out" && grep -Eq "/ +$mib0 MB \|" "$d-nvml-gpustat.out" || ok=0
  verdict "vm-doorbell NVML: gpustat names GPU 0 and its memory as the host's NVML does ($name0, $mib0 MB)" $((1 - ok))

  ok=1; nvml_ran nvml-nvitop || ok=0
  cat "$d-nvml-nvitop.out"
  grep -qF "$bus0" "$d-nvml-nvitop.out" || ok=0
  verdict "vm-doorbell NVML: nvitop -1 shows GPU 0 at the host's bus id ($bus0)" $((1 - ok))

  # Every staged interpreter started: no module or library missing in the guest.
  ! grep -aqE "ModuleNotFoundError|ImportError|error while loading shared libraries|Could not find platform" \
    "$d-nvml-pynvml.out" "$d-nvml-gpustat.out" "$d-nvml-nvitop.out"
  verdict "vm-doorbell NVML: python3 ($py) staged with only the modules it loads: nothing missing in the guest" $?
}

echo "== for scale: the same round trips on this machine, outside any VM"
if [[ $driver == libcuda.so.1 ]]; then
  "$bin/drv_roundtrip" 2>&1 | grep '^roundtrip' | sed 's/^/native (no ivcuda): /'
fi
# Process mode: the guest library asks for 8 vectors, ivcudad's default.
start_daemon process 8
rm -f "$tmp/roundtrip.pid"
IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$lib "${tagged[@]}" "$tmp/roundtrip.pid" "$bin/drv_roundtrip" \
  >"$out/process-roundtrip.txt" 2>&1
rc=$?
[ $rc -eq 0 ] && ! served_by "$out/ivcudad-process.log" "$(cat "$tmp/roundtrip.pid" 2>/dev/null || echo 0)" 0 &&
  { echo "  not served by ivcudad"; rc=1; }
verdict "process-mode drv_roundtrip (served by ivcudad)" $rc
# What a worker's context takes on the GPU (MiB), as nvidia-smi lists the daemon's processes
# (its workers are ivcudad, forked): drv_isolation --reclaim lets that much stay taken, for
# each of the two workers the daemon starts for its two processes, after its child died (a VM
# starts a spare for its next process; process mode, the next warm worker). The double's
# contexts cost nothing: there all of the child's memory must come back.
for _ in $(seq 100); do grep -q "started ahead for" "$out/ivcudad-process.log" && break; sleep 0.1; done
reclaim_allow=$((2 * $(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits \
  2>/dev/null | awk -F', *' '$2 ~ /ivcudad$/ && $3 > m { m = $3 } END { print m + 0 }')))
echo "drv_isolation --reclaim --allow-mib $reclaim_allow (two workers' contexts)"
grep '^roundtrip' "$out/process-roundtrip.txt" | sed 's/^/host process, ivcuda process mode: /'
echo "== reference runs of the deterministic guest programs ($([[ $driver == libcuda.so.1 ]] && echo native || echo "$driver is a test double: itself as the program's libcuda.so.1, or ivcuda in process mode for cudart"))"
reference_runs
python_adds=() python_guest=
if [[ -z $nvml_why ]]; then
  # The guest's python3: this machine's, with the standard modules that
  # gpustat, nvitop and nvml_view.py load when they run here through ivcuda
  # (process mode: the same NVML library the guest gets), and the wheels.
  echo "== python3 for the guest: $py, with what gpustat, nvitop -1 and nvml_view.py load through ivcuda here"
  # shellcheck source=../../tools/guest/stage-python.sh
  . "$guest/stage-python.sh"
  if ! python_unpack "$py" "$pystage" "$pywheel" "$tools"/*.whl "$tools"/gpustat-*.tar.gz; then
    nvml_why="the wheels in .deps/wheels did not unpack"
  elif ! TERM=dumb IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$lib stage_python "$py" "$pystage" /opt/ivcuda/python \
      "-m gpustat" "-m nvitop -1" "$root/tests/guest_vm/nvml_view.py --alloc-mib 64" 2>&1; then
    nvml_why="python3 could not be staged for the guest"
  fi
fi
cleanup

echo "== guest image (.deps/guest + this machine's programs)"
image=/tmp/ivcuda-vm-image
add=()
for p in "${progs[@]}"; do add+=(--add-bin "$bin/$p:/usr/bin/$p"); done
if [[ -z $nvml_why ]]; then
  write_nvml_checks "$tmp/nvml_checks.sh" "$python_guest"
  add+=(--add-bin "$lib/libnvidia-ml.so.1" --add-bin "$build/bin/ivcuda-smi:/usr/bin/ivcuda-smi"
        --add-bin "$bin/nvml_api:/usr/bin/nvml_api" --add "$tmp/nvml_checks.sh:/opt/ivcuda/nvml_checks.sh"
        --add "$root/tests/guest_vm/nvml_view.py:/opt/ivcuda/nvml_view.py" "${python_adds[@]}")
fi
# LD_LIBRARY_PATH: ldd must resolve the programs' libcuda.so.1 (and
# libnvidia-ml.so.1) to ivcuda's, never to the machine's real driver's. The
# image keeps host paths, so the guest finds them through the same variable.
LD_LIBRARY_PATH=$lib "$guest/bundle-image.sh" unpack "$root/.deps/guest" "$image" \
  --add-bin "$lib/libcuda.so.1" "${add[@]}" --add-bin "$build/bench/ivcuda-bench:/usr/bin/ivcuda-bench" \
  --add "$kernels/test_kernels.ptx:/opt/ivcuda/test_kernels.ptx" \
  --add "$kernels/test_kernels.fatbin:/opt/ivcuda/test_kernels.fatbin" || die "image unpack failed"
cmp -s "$lib/libcuda.so.1" "$image/extra-root$lib/libcuda.so.1" || die "the image's libcuda.so.1 is not ivcuda's"
if [[ -z $nvml_why ]] && ! cmp -s "$lib/libnvidia-ml.so.1" "$image/extra-root$lib/libnvidia-ml.so.1"; then
  die "the image's libnvidia-ml.so.1 is not ivcuda's"
fi

echo "== doorbell mode: ivshmem-doorbell, $vectors MSI-X vectors, on ivcudad's socket"
start_daemon doorbell $vectors
if [[ -z $nvml_why ]]; then
  host_view "$out/host-nvml.txt" || nvml_why="pynvml natively failed: $(tail -1 "$out/host-nvml.txt")"
fi
if [[ -z $nvml_why ]]; then
  # Another tenant of this daemon (a process-mode guest) holds 100 MiB until
  # the guest's NVML checks are done; the host's NVML lists it meanwhile.
  mkfifo "$tmp/hold_in"
  sleep 600 >"$tmp/hold_in" &
  keep=$!
  IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$lib "$bin/nvml_api" --hold 100 <"$tmp/hold_in" >"$out/tenant-hold.txt" 2>&1 &
  holder=$!
  for _ in $(seq 600); do grep -q '^ready' "$out/tenant-hold.txt" && break; sleep 0.05; done
  host_view "$out/host-nvml-tenant.txt"
  echo "the other tenant: $(head -1 "$out/tenant-hold.txt"); the host's NVML lists on GPU 0: $(field "$out/host-nvml-tenant.txt" "processes 0")"
  (
    for _ in $(seq 1200); do
      grep -aq GUEST_NVML_DONE "$out/run-in-guest-doorbell.err" 2>/dev/null && break
      sleep 0.2
    done
    kill "$keep" 2>/dev/null
  ) &
  watcher=$!
fi
run_guest doorbell --socket "$sock" --vectors $vectors
[[ -z ${watcher:-} ]] || { kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null; }
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
