#!/usr/bin/env bash
# One command from a checkout to the comparison: builds ivcuda's NVBench benchmarks against the
# cuda-bench wheel if need be, runs them natively, through ivcuda in process mode and inside a
# guest, each with --json and a fixed sample count, and compares the runs with compare.py (a
# table, comparison.json and a plot). See README.md in this folder.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
prog=$(basename "$0")
# shellcheck source=nvbench-configs/setup.sh disable=SC1091
. "$here/setup.sh" # CUDA_BENCH_VERSION, CMAKE_VERSION, CMAKE_MINIMUM
# shellcheck source=tests/lib/verdicts.sh disable=SC1091
. "$root/tests/lib/verdicts.sh" # log_mark, served_by: the proof that ivcudad served a run

synopsis="usage: $prog [options] [-- NVBENCH_ARGS...]"

usage() {
  cat <<EOF
$synopsis

Builds ivcuda's NVBench benchmarks (nvbench-configs/benchmarks, against the wheel
cuda-bench[cu13]==$CUDA_BENCH_VERSION that setup.sh fetches) if need be, runs them
  native    natively, with the machine's driver
  process   through ivcuda in process mode: ivcudad started from ivcuda's build,
            ivcuda's libcuda.so.1 first on LD_LIBRARY_PATH
  guest     inside a guest: the test guest (tools/guest, under QEMU; TCG where
            KVM cannot be used) next to an ivcudad started here, or an existing
            VM over ssh (--guest-ssh)
each with --stopping-criterion sample-count --target-samples N --json FILE,
then compares them (compare.py): per-state ratios to native of cold GPU time,
cold CPU time, batch GPU time and bandwidth, the overhead per task, a plot.

options:
  --out DIR           results and logs (default out/nvbench; files there are replaced)
  --modes LIST        runs to make, from native,process,guest (default all three)
  --samples N         samples per measurement, every run (default 100)
  --sets LIST         which sets: cpp (the executable built here, or --exe), python
                      (python/ivcuda_nvbench.py: cuda.bench and CuPy); default cpp.
                      The test guest has no Python: the python set runs in a guest
                      over --guest-ssh only
  --python            the same as --sets cpp,python
  --guest-ssh HOST    the guest run in an existing VM, reached as 'ssh HOST'; it needs
                      ivcuda's guest library there (see --guest-lib) and its driver
                      loaded; the benchmark and libnvbench.so are copied over
  --guest-lib DIR     where ivcuda's libcuda.so.1 lies in that VM (default /opt/ivcuda/lib)
  --guest-bundle DIR  the test guest's bundle (default .deps/guest, made by
                      tools/guest/bundle-image.sh pack); without one the image is
                      built here (tools/guest/build-guest-image.sh, Debian packages)
  --guest-timeout S   seconds the test guest may take (default 1800)
  --vfio JSON         a VFIO passthrough guest's --json of the same set: a third column
  --native-json FILE  compare against this native result instead of a native run
  --exe FILE          run this NVBench executable instead of building the set (e.g.
                      one built from NVBench's sources with NVML off)
  --ivcuda-build DIR  ivcuda's build: host-daemon/ivcudad, lib/libcuda.so.1
                      (default build/default)
  --driver LIB        the driver ivcudad loads (default libcuda.so.1)
  --build-dir DIR     where the set is built and the wheel unpacked (default build/nvbench)
  --wheels DIR        where setup.sh put the cuda-bench wheels (default .deps/wheels)
  --cuda-arch LIST    CMAKE_CUDA_ARCHITECTURES (default: native when nvidia-smi sees a GPU,
                      else 90)
  --build-only        build the set and stop (no GPU needed)
  -h, --help          show this help

Every run gets CUDA_MODULE_LOADING=EAGER unless it is set already.
Exit status: 0 when every run passed and the comparison is complete (every state
the native run measured was measured by every other run: compare.py); 1 when a
build or a run failed, a run was not served by ivcudad, or the comparison is
incomplete or missing; 2 on bad usage; 3 when something the runs need is
missing (the wheel, a GPU, ivcuda's build, a guest).
EOF
}

die_usage() {
  echo "$prog: $*" >&2
  echo "$synopsis" >&2
  echo "('$prog --help' explains the options)" >&2
  exit 2
}
missing() { # a prerequisite is not there: say which and how to get it
  echo "$prog: $*" >&2
  exit 3
}
fail() {
  echo "$prog: $*" >&2
  exit 1
}

out=$root/out/nvbench
modes=native,process,guest
samples=100
sets_arg=cpp
guest_ssh=
guest_lib=/opt/ivcuda/lib
guest_bundle=
guest_timeout=1800
vfio=
native_json=
exe=
ivcuda_build=$root/build/default
driver=libcuda.so.1
build_dir=$root/build/nvbench
wheels=$root/.deps/wheels
cuda_arch=
build_only=0
extra=()
need_value() { (($1 >= 2)) || die_usage "$2 needs a value"; }
while (($#)); do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --out) need_value $# "$1"; out=$2; shift 2 ;;
    --modes) need_value $# "$1"; modes=$2; shift 2 ;;
    --samples) need_value $# "$1"; samples=$2; shift 2 ;;
    --sets) need_value $# "$1"; sets_arg=$2; shift 2 ;;
    --python) sets_arg=cpp,python; shift ;;
    --guest-ssh) need_value $# "$1"; guest_ssh=$2; shift 2 ;;
    --guest-lib) need_value $# "$1"; guest_lib=$2; shift 2 ;;
    --guest-bundle) need_value $# "$1"; guest_bundle=$2; shift 2 ;;
    --guest-timeout) need_value $# "$1"; guest_timeout=$2; shift 2 ;;
    --vfio) need_value $# "$1"; vfio=$2; shift 2 ;;
    --native-json) need_value $# "$1"; native_json=$2; shift 2 ;;
    --exe) need_value $# "$1"; exe=$2; shift 2 ;;
    --ivcuda-build) need_value $# "$1"; ivcuda_build=$2; shift 2 ;;
    --driver) need_value $# "$1"; driver=$2; shift 2 ;;
    --build-dir) need_value $# "$1"; build_dir=$2; shift 2 ;;
    --wheels) need_value $# "$1"; wheels=$2; shift 2 ;;
    --cuda-arch) need_value $# "$1"; cuda_arch=$2; shift 2 ;;
    --build-only) build_only=1; shift ;;
    --) shift; extra=("$@"); break ;;
    *) die_usage "unknown argument: $1" ;;
  esac
done

# --- the arguments, checked before anything runs ---------------------------------------------
run_native=0 run_process=0 run_guest=0
IFS=, read -r -a mode_list <<<"$modes"
((${#mode_list[@]})) || die_usage "--modes is empty"
for m in "${mode_list[@]}"; do
  case $m in
    native) run_native=1 ;;
    process) run_process=1 ;;
    guest) run_guest=1 ;;
    *) die_usage "unknown mode '$m' in --modes (native, process, guest)" ;;
  esac
done
cpp=0 python=0
IFS=, read -r -a set_list <<<"$sets_arg"
((${#set_list[@]})) || die_usage "--sets is empty"
for s in "${set_list[@]}"; do
  case $s in
    cpp) cpp=1 ;;
    python) python=1 ;;
    *) die_usage "unknown set '$s' in --sets (cpp, python)" ;;
  esac
done
if ((!cpp && run_guest)) && [[ -z $guest_ssh ]]; then
  die_usage "the python set runs in a guest over --guest-ssh only (the test guest has no Python)"
fi
# A leading zero or a sign would reach NVBench as something other than what was meant.
[[ $samples =~ ^[1-9][0-9]{0,8}$ ]] || die_usage "--samples must be a positive integer, got '$samples'"
[[ $guest_timeout =~ ^[1-9][0-9]{0,6}$ ]] || die_usage "--guest-timeout must be a positive number of seconds"
[[ -z $native_json || -r $native_json ]] || die_usage "cannot read --native-json $native_json"
[[ -z $vfio || -r $vfio ]] || die_usage "cannot read --vfio $vfio"
if [[ -n $exe ]]; then
  [[ -f $exe && -x $exe ]] || die_usage "--exe: not an executable file: $exe"
  exe=$(cd "$(dirname "$exe")" && pwd)/$(basename "$exe")
fi
[[ -z $guest_bundle || $run_guest == 1 ]] || die_usage "--guest-bundle without the guest mode"
[[ -z $guest_ssh || $run_guest == 1 ]] || die_usage "--guest-ssh without the guest mode"
[[ -z $guest_ssh || -z $guest_bundle ]] || die_usage "--guest-ssh and --guest-bundle exclude each other"
if ((!build_only)) && ((run_native)) && [[ -n $native_json ]]; then
  die_usage "--native-json replaces the native run: leave native out of --modes"
fi
if ((!build_only)) && ((!run_native)) && [[ -z $native_json ]]; then
  die_usage "nothing to compare with: run native too, or give --native-json FILE"
fi
[[ $build_dir == /* ]] || build_dir=$PWD/$build_dir
[[ $ivcuda_build == /* ]] || ivcuda_build=$PWD/$ivcuda_build

# --- prerequisites: each missing one named, with how to get it --------------------------------
cmake_bin=
find_cmake() {
  local have
  have=$(cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9.]*\).*/\1/p' || true)
  if [[ -n $have && $(printf '%s\n%s\n' "$CMAKE_MINIMUM" "$have" | sort -V | head -n 1) == "$CMAKE_MINIMUM" ]]; then
    cmake_bin=cmake
  elif [[ -x $root/.cache/cmake-$CMAKE_VERSION/bin/cmake ]]; then
    cmake_bin=$root/.cache/cmake-$CMAKE_VERSION/bin/cmake
  else
    missing "no CMake >= $CMAKE_MINIMUM (the wheel's CMake package asks for it; the cmake on PATH is ${have:-missing}): run nvbench-configs/setup.sh, which fetches CMake $CMAKE_VERSION into .cache/"
  fi
}

py_tag=$(python3 -c 'import sys; print("cp%d%d" % sys.version_info[:2])' 2>/dev/null || echo none)
wheel=
find_wheel() { # the wheel for this python3 if there is one, else any (the C++ part is the same)
  local w
  for w in "$wheels"/cuda_bench-"$CUDA_BENCH_VERSION"-"$py_tag"-*.whl \
           "$wheels"/cuda_bench-"$CUDA_BENCH_VERSION"-*.whl; do
    [[ -f $w ]] && { wheel=$w; return 0; }
  done
  missing "no cuda-bench wheel: $wheels holds no cuda_bench-$CUDA_BENCH_VERSION-*.whl. Run nvbench-configs/setup.sh (pip downloads cuda-bench[cu13]==$CUDA_BENCH_VERSION; tools/install-deps.sh and tests/gpu/fetch-deps.sh run it)"
}

# unpack_wheel WHEEL DIR: the wheel's files under DIR (a wheel is a zip), once.
unpack_wheel() {
  local whl=$1 dir=$2
  [[ -f $dir/.unpacked && $(cat "$dir/.unpacked") == "$(basename "$whl")" ]] && return 0
  rm -rf "$dir"
  python3 -m zipfile -e "$whl" "$dir" || fail "cannot unpack $whl"
  # zipfile keeps no modes: the libraries must be loadable, nothing more.
  basename "$whl" >"$dir/.unpacked"
}

have_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

ivcuda_ready() {
  [[ -x $ivcuda_build/host-daemon/ivcudad && -e $ivcuda_build/lib/libcuda.so.1 ]] ||
    missing "ivcuda is not built in $ivcuda_build (no host-daemon/ivcudad or lib/libcuda.so.1): cmake --preset default && cmake --build build/default --target ivcudad ivcuda_guest, or pass --ivcuda-build DIR"
}

if ((!build_only)); then
  # The GPU first: without one nothing below can run (the guest over ssh uses its host's).
  if ((run_native)) || { ((run_process || (run_guest && ${#guest_ssh} == 0))) && [[ $driver == libcuda.so.1 ]]; }; then
    have_gpu || missing "no GPU: nvidia-smi -L lists none on this machine (the runs need an NVIDIA GPU and its driver; --build-only builds without one)"
  fi
  if ((run_process)) || { ((run_guest)) && [[ -z $guest_ssh ]]; }; then ivcuda_ready; fi
fi

# --- build --------------------------------------------------------------------------------------
nvbench_lib=
((cpp)) || exe=none # no executable wanted
if [[ -z $exe ]] || ((python)); then
  find_wheel
  unpack_wheel "$wheel" "$build_dir/wheel"
  nvbench_lib=$build_dir/wheel/cuda/bench/cu13/nvbench/lib
fi
if [[ -z $exe ]]; then
  find_cmake
  if [[ -z $cuda_arch ]]; then
    if have_gpu; then cuda_arch=native; else cuda_arch=90; fi
  fi
  [[ -x ${CUDACXX:-} ]] || command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] ||
    missing "no nvcc: the CUDA toolkit is expected in /usr/local/cuda (or nvcc on PATH, or CUDACXX)"
  gen=()
  [[ -f $build_dir/cmake/CMakeCache.txt ]] || ! command -v ninja >/dev/null || gen=(-G Ninja)
  echo "$prog: building the set in $build_dir/cmake (NVBench from $(basename "$wheel"), CUDA architectures $cuda_arch)"
  mkdir -p "$build_dir"
  if ! "$cmake_bin" -S "$here" -B "$build_dir/cmake" "${gen[@]}" \
      -Dnvbench_DIR="$nvbench_lib/cmake/nvbench" -DCMAKE_CUDA_ARCHITECTURES="$cuda_arch" \
      >"$build_dir/configure.log" 2>&1; then
    tail -n 30 "$build_dir/configure.log" >&2
    fail "configuring the benchmarks failed (log: $build_dir/configure.log)"
  fi
  if ! "$cmake_bin" --build "$build_dir/cmake" -j "$(nproc)" >"$build_dir/build.log" 2>&1; then
    grep -E "error|Error" "$build_dir/build.log" | head -n 30 >&2
    fail "building the benchmarks failed (log: $build_dir/build.log)"
  fi
  exe=$build_dir/cmake/bin/ivcuda-nvbench
  [[ -x $exe ]] || fail "the build made no $exe"
  echo "$prog: built $exe"
fi
((!build_only)) || exit 0

# --- runs ---------------------------------------------------------------------------------------
# sh_quote ARGS...: the arguments as one POSIX shell line, each single-quoted (for the guest's
# busybox sh and the VM's login shell, where an axis like 'Duration=[0:1e-4:5e-6]' must stay one word).
sh_quote() {
  local a line=''
  for a in "$@"; do line+=" '${a//\'/\'\\\'\'}'"; done
  printf '%s' "${line# }"
}
mkdir -p "$out"
out=$(cd "$out" && pwd)
fixed=(--stopping-criterion sample-count --target-samples "$samples")
export CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-EAGER}
pyset=$here/python/ivcuda_nvbench.py
pypath=
if ((python)); then
  wheel_dir=$build_dir/wheel
  [[ $(basename "$wheel") == *-"$py_tag"-* ]] ||
    missing "the Python set needs the wheel for this python3 ($py_tag): nvbench-configs/setup.sh --python-version $(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  pypath=$wheel_dir${PYTHONPATH:+:$PYTHONPATH}
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ivcuda-nvbench.XXXXXX")
daemon=
stop_daemon() {
  if [[ -n $daemon ]]; then
    kill "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
  fi
  daemon=
}
trap 'stop_daemon; rm -rf "$tmp"' EXIT
trap 'exit 143' TERM INT # so that a timeout's signal still stops ivcudad (the EXIT trap)

# start_daemon NAME [ivcudad options]: ivcudad on $tmp/NAME.sock, log in OUT/ivcudad-NAME.log.
sock=
start_daemon() {
  local name=$1
  shift
  sock=$tmp/$name.sock
  "$ivcuda_build/host-daemon/ivcudad" --socket "$sock" --driver "$driver" "$@" \
    >"$out/ivcudad-$name.log" 2>&1 &
  daemon=$!
  for _ in $(seq 200); do
    [[ -S $sock ]] && return 0
    kill -0 "$daemon" 2>/dev/null || break
    sleep 0.05
  done
  tail -n 20 "$out/ivcudad-$name.log" >&2
  fail "ivcudad did not start (log: $out/ivcudad-$name.log)"
}

# run_set SET NAME [ENV ARGS...]: one run of a set (cpp: the executable; python: the script)
# under `env ENV ARGS`, writing OUT/[python-]NAME.json and .log. Prints the process id.
run_set() {
  local set=$1 name=$2
  shift 2
  local file=$name cmd=("$exe")
  if [[ $set == python ]]; then
    file=python-$name
    cmd=(python3 "$pyset")
  fi
  local json=$out/$file.json log=$out/$file.log
  rm -f "$json"
  echo "$prog: $file run: ${cmd[*]} ${fixed[*]} --json $json ${extra[*]}" >&2
  env "$@" "${cmd[@]}" "${fixed[@]}" --json "$json" "${extra[@]}" >"$log" 2>&1 &
  local pid=$! rc=0
  wait "$pid" || rc=$?
  if ((rc)); then
    echo "$prog: the $file run failed (exit $rc); last lines of $log:" >&2
    tail -n 20 "$log" >&2
    if [[ $name != native ]] && grep -qi 'nvml' "$log"; then
      echo "$prog: (NVML in that log: the wheel's libnvbench.so asks the driver's NVML for the device at start-up; with ivcuda's libcuda.so.1 loaded, the driver's NVML calls into it privately and ivcuda refuses; put ivcuda's own libnvidia-ml.so.1 first on the library path)" >&2
    fi
    exit 1
  fi
  [[ -s $json ]] || fail "the $file run wrote no $json (see $log)"
  echo "$pid"
}

# The guest leg: the test guest under QEMU, or a VM over ssh.
guest_libs_ok() { # the benchmark's NVML, if it needs one, must be ivcuda's guest library
  local line
  line=$(LD_LIBRARY_PATH=$ivcuda_build/lib ldd "$exe" 2>/dev/null | grep 'libnvidia-ml.so.1' || true)
  [[ -z $line || $line == *"=> $ivcuda_build/lib/"* ]] && return 0
  missing "no guest NVML: the wheel's libnvbench.so needs libnvidia-ml.so.1 when it loads, and a guest has no NVIDIA driver; $ivcuda_build/lib has no libnvidia-ml.so.1 (ivcuda's guest NVML library: build the ivcuda_nvml target). Otherwise run the guest leg with an NVBench built from source with NVML off (--exe FILE; README.md), or leave guest out of --modes"
}

tcg_bundle=
guest_tcg_check() { # before any run: what the test guest needs is all here
  guest_libs_ok
  local bundle=$guest_bundle qemu_dir=$root/.deps/qemu
  [[ -z $bundle && -s $root/.deps/guest/vmlinux.xz ]] && bundle=$root/.deps/guest
  if [[ -n $bundle ]]; then
    [[ -s $bundle/vmlinux.xz && -s $bundle/initramfs-base.cpio.gz ]] ||
      missing "no guest: $bundle holds no test-guest bundle (tools/guest/bundle-image.sh pack $bundle, on Debian 12)"
  elif ! "$root/tools/guest/build-guest-image.sh" --check >/dev/null 2>&1; then
    missing "no guest: no test-guest bundle in .deps/guest, and this machine cannot build the image ($("$root/tools/guest/build-guest-image.sh" --check 2>&1 | tr '\n' ' ')); or use --guest-ssh HOST for a VM of your own"
  fi
  [[ -x $qemu_dir/qemu-system-x86_64 ]] && export PATH=$qemu_dir:$PATH
  command -v qemu-system-x86_64 >/dev/null ||
    missing "no guest: qemu-system-x86_64 is not installed (apt-get install qemu-system-x86, or tools/guest/bundle-qemu.sh .deps/qemu)"
  tcg_bundle=$bundle
}

guest_tcg() {
  local bundle=$tcg_bundle image=$tmp/guest-image lib=$ivcuda_build/lib adds
  # ldd must resolve the benchmark's libraries as the guest will: ivcuda's libcuda.so.1 (cudart
  # loads it by name, so it is added by hand) and its libnvidia-ml.so.1 when there is one.
  adds=(--add-bin "$exe:/opt/ivcuda-nvbench/ivcuda-nvbench" --add-bin "$lib/libcuda.so.1")
  [[ ! -e $lib/libnvidia-ml.so.1 ]] || adds+=(--add-bin "$lib/libnvidia-ml.so.1")
  echo "$prog: guest image (test guest + the benchmark) in $image" >&2
  if [[ -n $bundle ]]; then
    LD_LIBRARY_PATH=$lib "$root/tools/guest/bundle-image.sh" unpack "$bundle" "$image" "${adds[@]}" \
      >"$out/guest-image.log" 2>&1 || { tail -n 20 "$out/guest-image.log" >&2; fail "the guest image could not be made"; }
  else
    LD_LIBRARY_PATH=$lib "$root/tools/guest/build-guest-image.sh" "$image" "${adds[@]}" \
      >"$out/guest-image.log" 2>&1 || { tail -n 20 "$out/guest-image.log" >&2; fail "the guest image could not be built"; }
  fi

  ((!python)) || echo "$prog: the python set does not run in the test guest (it has no Python): cpp set only" >&2
  start_daemon guest --shm-size 1G --channels 8 --vectors 4
  # The result comes back on the console, between markers (the guest has no other way out).
  local gcmd
  gcmd="export LD_LIBRARY_PATH=$lib CUDA_MODULE_LOADING=$CUDA_MODULE_LOADING
/opt/ivcuda-nvbench/ivcuda-nvbench ${fixed[*]} --json /tmp/g.json $(sh_quote "${extra[@]}") >/tmp/g.log 2>&1; r=\$?
cat /tmp/g.log; echo IVCUDA_NVBENCH_JSON_BEGIN; cat /tmp/g.json; echo; echo IVCUDA_NVBENCH_JSON_END; exit \$r"
  local rc=0
  echo "$prog: guest run (test guest, QEMU; $guest_timeout s at most): ivcuda-nvbench ${fixed[*]} --json ${extra[*]}" >&2
  "$root/tools/guest/run-in-guest.sh" --image "$image" --socket "$sock" --vectors 4 --mem 2G \
    --timeout "$guest_timeout" --log "$out/guest.log" "$gcmd" >/dev/null 2>"$out/run-in-guest.err" || rc=$?
  stop_daemon
  tr -d '\r' <"$out/guest.log" |
    sed -n '/^IVCUDA_NVBENCH_JSON_BEGIN$/,/^IVCUDA_NVBENCH_JSON_END$/p' | sed '1d;$d' >"$out/guest.json"
  if ((rc)); then
    grep -a 'run-in-guest:' "$out/run-in-guest.err" | tail -n 3 >&2 || true
    tr -d '\r' <"$out/guest.log" | grep -av '^IVCUDA_NVBENCH_JSON' | tail -n 20 >&2
    fail "the guest run failed (exit $rc; console: $out/guest.log)"
  fi
  python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$out/guest.json" 2>/dev/null ||
    fail "the guest's JSON did not come back whole (console: $out/guest.log)"
  # A served hello (not a refused one) from some process of the guest: its pids are the VM's own.
  grep -Eq " info: guest [0-9]+: process [0-9]+ says hello \(parent [0-9]+\)$" "$out/ivcudad-guest.log" ||
    fail "the guest run never reached ivcudad (see $out/ivcudad-guest.log)"
  if grep -q "(accel tcg)" "$out/run-in-guest.err"; then
    echo "$prog: the guest ran under TCG (QEMU emulating the CPU): its CPU-side figures are the emulator's, not a KVM guest's" >&2
  fi
  return 0
}

ssh_opts=(-o BatchMode=yes -o ConnectTimeout=15)
guest_ssh_check() { # before any run: the VM answers and has ivcuda's guest library
  ssh "${ssh_opts[@]}" "$guest_ssh" true >"$out/ssh.log" 2>&1 ||
    missing "no guest: ssh $guest_ssh does not answer ($(tail -n 1 "$out/ssh.log")); the VM must accept key logins (BatchMode)"
  ssh "${ssh_opts[@]}" "$guest_ssh" test -e "$guest_lib/libcuda.so.1" ||
    missing "no guest: $guest_ssh has no $guest_lib/libcuda.so.1 (install ivcuda's guest library there, or pass --guest-lib DIR)"
}

guest_ssh_run() {
  local dir rc=0
  dir=$(ssh "${ssh_opts[@]}" "$guest_ssh" mktemp -d /tmp/ivcuda-nvbench.XXXXXX) || fail "ssh $guest_ssh: mktemp failed"
  local files=() lp="$guest_lib:$dir"
  ((cpp)) && files+=("$exe")
  [[ -z $nvbench_lib ]] || files+=("$nvbench_lib/libnvbench.so")
  ((python)) && files+=("$pyset")
  scp -q "${ssh_opts[@]}" "${files[@]}" "$guest_ssh:$dir/" || fail "scp to $guest_ssh:$dir failed"
  local s remote
  for s in "${sets[@]}"; do
    local file=guest
    remote="$dir/$(basename "$exe")"
    if [[ $s == python ]]; then
      file="python-guest"
      remote="python3 $dir/ivcuda_nvbench.py"
    fi
    echo "$prog: $file run on $guest_ssh: $remote ${fixed[*]} --json $dir/$file.json ${extra[*]}" >&2
    # shellcheck disable=SC2029 # expanded here on purpose: the VM gets the finished command
    ssh "${ssh_opts[@]}" "$guest_ssh" "LD_LIBRARY_PATH=$lp CUDA_MODULE_LOADING=$CUDA_MODULE_LOADING $remote ${fixed[*]} --json $dir/$file.json $(sh_quote "${extra[@]}")" \
      >"$out/$file.log" 2>&1 || rc=$?
    if ((rc)); then
      tail -n 20 "$out/$file.log" >&2
      fail "the $file run on $guest_ssh failed (exit $rc; log: $out/$file.log)"
    fi
    scp -q "${ssh_opts[@]}" "$guest_ssh:$dir/$file.json" "$out/$file.json" || fail "scp of $file.json from $guest_ssh failed"
  done
  ssh "${ssh_opts[@]}" "$guest_ssh" rm -rf "$dir" || true
}

if ((run_guest)); then
  if [[ -n $guest_ssh ]]; then guest_ssh_check; else guest_tcg_check; fi
fi

sets=()
((cpp)) && sets+=(cpp)
((python)) && sets+=(python)
native_env=(-u LD_PRELOAD -u IVCUDA_SOCKET)
[[ -z $pypath ]] || native_env+=("PYTHONPATH=$pypath")

if ((run_native)); then
  for s in "${sets[@]}"; do run_set "$s" native "${native_env[@]}" >/dev/null; done
fi

if ((run_process)); then
  # 2 GiB per guest: the page-locked copies (64 MiB each) and NVBench's host registrations come
  # from the arena; every benchmark process is its own guest with its own arena.
  start_daemon process --shm-size 2G --channels 8
  penv=(-u LD_PRELOAD "IVCUDA_SOCKET=$sock" "LD_LIBRARY_PATH=$ivcuda_build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
  [[ -z $pypath ]] || penv+=("PYTHONPATH=$pypath")
  for s in "${sets[@]}"; do
    pre=${s/cpp/}
    pre=${pre:+$pre-}
    mark=$(log_mark "$out/ivcudad-process.log")
    # Every call ivcuda refused or that failed, by function, written when the process ends.
    pid=$(run_set "$s" process "${penv[@]}" "IVCUDA_LOG_UNSUPPORTED=$out/${pre}process-unsupported.txt" \
      "IVCUDA_LOG_ERRORS=$out/${pre}process-errors.txt")
    for f in "$out/${pre}process-unsupported.txt" "$out/${pre}process-errors.txt"; do
      [[ ! -s $f ]] || echo "$prog: the $s set through ivcuda: $(basename "$f" .txt | sed 's/.*process-//') calls listed in $f" >&2
    done
    # Through ivcuda, not some other libcuda.so.1: ivcudad saw that very process.
    served_by "$out/ivcudad-process.log" "$pid" "$mark" ||
      fail "the process-mode run (pid $pid) never reached ivcudad: it did not load ivcuda's libcuda.so.1 (see $out/ivcudad-process.log)"
  done
  stop_daemon
fi

if ((run_guest)); then
  if [[ -n $guest_ssh ]]; then guest_ssh_run; else guest_tcg; fi
fi

# --- comparison ---------------------------------------------------------------------------------
compare_set() { # SET: compare.py over the runs of one set; every run asked for must be there
  local set=$1 prefix='' nat=$native_json runs=() m
  [[ $set == python ]] && prefix=python-
  [[ -n $nat && $set == cpp ]] || nat=$out/${prefix}native.json
  for m in process guest; do
    local asked=run_$m
    ((${!asked})) || continue
    # (the test guest has no Python: no python set there, and run.sh said so)
    [[ $m == guest && $set == python && -z $guest_ssh ]] && continue
    if [[ -f $out/${prefix}$m.json ]]; then runs+=("$m=$out/${prefix}$m.json")
    else echo "$prog: the $m run of the $set set left no result: not compared" >&2; return 1; fi
  done
  [[ $set == cpp && -n $vfio ]] && runs+=("vfio=$vfio")
  if ((${#runs[@]} == 0)); then
    echo "$prog: no run but the native one for the $set set: nothing compared" >&2
    return 0
  fi
  [[ -f $nat ]] || { echo "$prog: no native result for the $set set: not compared" >&2; return 1; }
  echo
  echo "== $set set: ${runs[*]%%=*} against native"
  local rc=0
  python3 "$here/compare.py" --json "$out/${prefix}comparison.json" --plot "$out/${prefix}comparison.png" \
    "$nat" "${runs[@]}" | tee "$out/${prefix}comparison.txt" || rc=$?
  # compare.py's 3 (incomplete: a state native measured missing or skipped elsewhere) is a
  # failed comparison here; run.sh's own 3 means a missing prerequisite.
  ((rc != 3)) || rc=1
  return $rc
}
status=0
for s in "${sets[@]}"; do compare_set "$s" || status=$?; done
echo
echo "$prog: results in $out"
exit $status
