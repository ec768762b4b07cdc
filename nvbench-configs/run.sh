#!/usr/bin/env bash
# Run one NVBench executable natively and through ivcuda with the same fixed sample count, then
# compare the two --json results with compare.py. See README.md in this folder.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
prog=$(basename "$0")

synopsis="usage: $prog [options] EXECUTABLE OUTDIR IVCUDA_LIBDIR [SOCKET] [-- NVBENCH_ARGS...]"

usage() {
  cat <<EOF
$synopsis

Runs the benchmarks of the NVBench executable EXECUTABLE twice with
  --stopping-criterion sample-count --target-samples N --json FILE
first natively, then through ivcuda's libcuda.so.1 found in IVCUDA_LIBDIR, and
compares the two results with compare.py.

  EXECUTABLE     an NVBench benchmark executable (e.g. nvbench.example.axes)
  OUTDIR         where native.json, guest.json, comparison.json and the logs go
                 (created if missing; earlier results there are overwritten)
  IVCUDA_LIBDIR  the folder holding ivcuda's libcuda.so.1
  SOCKET         ivcudad's socket (process mode: sets IVCUDA_SOCKET); leave it out
                 inside a VM, where the library finds the ivcuda device itself
  NVBENCH_ARGS   passed to both runs after the fixed ones, e.g. -- -b simple

options:
  --samples N         samples per measurement, both runs (default 100)
  --preload           load ivcuda with LD_PRELOAD instead of LD_LIBRARY_PATH
  --native-json FILE  skip the native run and compare against FILE (a native
                      result taken earlier, e.g. on the host before a VM run)
  -h, --help          show this help

Both runs get CUDA_MODULE_LOADING=EAGER unless it is already set.
Exit status: that of compare.py; 2 on bad usage; 1 if a run fails.
EOF
}

die_usage() {
  echo "$prog: $*" >&2
  echo "$synopsis" >&2
  echo "('$prog --help' explains the arguments)" >&2
  exit 2
}

samples=100
preload=0
native_json=
positional=()
extra=()
while (($#)); do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --samples)
      (($# >= 2)) || die_usage "--samples needs a value"
      samples=$2; shift 2 ;;
    --preload) preload=1; shift ;;
    --native-json)
      (($# >= 2)) || die_usage "--native-json needs a file"
      native_json=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -*) die_usage "unknown option: $1" ;;
    *) positional+=("$1"); shift ;;
  esac
done

((${#positional[@]} >= 3 && ${#positional[@]} <= 4)) ||
  die_usage "expected EXECUTABLE OUTDIR IVCUDA_LIBDIR [SOCKET], got ${#positional[@]} argument(s)"
exe=${positional[0]}
outdir=${positional[1]}
libdir=${positional[2]}
socket=${positional[3]:-}

# A leading zero or a sign would reach NVBench as something other than what was meant.
[[ $samples =~ ^[1-9][0-9]{0,8}$ ]] || die_usage "--samples must be a positive integer, got '$samples'"
[[ -f $exe && -x $exe ]] || die_usage "not an executable file: $exe"
[[ $exe == */* ]] || exe=./$exe # so that a bare name is not looked up on PATH
[[ -e $libdir/libcuda.so.1 ]] || die_usage "no libcuda.so.1 in $libdir"
libdir=$(cd "$libdir" && pwd)
if [[ -n $socket && ! -S $socket ]]; then
  die_usage "not a socket: $socket (is ivcudad running?)"
fi
if [[ -n $native_json && ! -r $native_json ]]; then
  die_usage "cannot read $native_json"
fi

mkdir -p "$outdir"
fixed=(--stopping-criterion sample-count --target-samples "$samples")
export CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-EAGER}

# run NAME [ENV ARGS...]: one NVBench run under `env ENV ARGS`; its output goes to OUTDIR/NAME.log.
run() {
  local name=$1
  shift
  local json=$outdir/$name.json log=$outdir/$name.log
  rm -f "$json"
  echo "$prog: $name run: $exe ${fixed[*]} --json $json ${extra[*]}"
  if ! env "$@" "$exe" "${fixed[@]}" --json "$json" "${extra[@]}" >"$log" 2>&1; then
    echo "$prog: the $name run failed; last lines of $log:" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
  [[ -s $json ]] || { echo "$prog: the $name run wrote no $json (see $log)" >&2; exit 1; }
}

if [[ -z $native_json ]]; then
  # The native run must not pick up ivcuda from the caller's environment.
  run native -u LD_PRELOAD -u IVCUDA_SOCKET
  native_json=$outdir/native.json
fi

guest_env=()
if ((preload)); then
  guest_env+=("LD_PRELOAD=$libdir/libcuda.so.1")
else
  guest_env+=("LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
fi
[[ -z $socket ]] || guest_env+=("IVCUDA_SOCKET=$socket")
run guest "${guest_env[@]}"

echo "$prog: native results: $native_json"
echo "$prog: guest results:  $outdir/guest.json"
echo
exec python3 "$here/compare.py" --json "$outdir/comparison.json" "$native_json" "$outdir/guest.json"
