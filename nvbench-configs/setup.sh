#!/usr/bin/env bash
# Fetches what nvbench-configs/ builds against, with pip, into folders git ignores:
#   .deps/wheels/   the NVBench wheel, cuda-bench[cu13] (pinned below), one per Python version:
#                   its C++ library, headers and CMake package are the same in each, its Python
#                   extension is built per version. .deps/ is what tests/gpu/ carries to the GPU
#                   machine, which has neither network nor pip.
#   .cache/cmake-*/ a CMake new enough for the wheel's CMake package (it asks for 3.30.4),
#                   only when the cmake on PATH is older (Debian 12 ships 3.25). Never carried.
# Nothing is installed: run.sh unpacks the wheel (a zip) into its build folder.
#
# usage: nvbench-configs/setup.sh [--python-version X.Y]... [--no-cmake]
#   --python-version X.Y  fetch the wheel for this CPython (repeatable); default: the python3 on
#                         PATH and 3.12 (the GPU machine's)
#   --no-cmake            do not fetch CMake (the GPU machine's list: it has CMake 4)
# Exit status 0 when everything asked for is there (already or now), 1 otherwise.
set -euo pipefail

# The one place these versions are named; run.sh reads them from here.
CUDA_BENCH_VERSION=0.3.0
CMAKE_VERSION=4.1.3
CMAKE_MINIMUM=3.30.4 # the wheel's nvbench-config.cmake: cmake_minimum_required(VERSION 3.30.4)

# When sourced (run.sh), only the versions above are wanted.
if [[ ${BASH_SOURCE[0]} != "$0" ]]; then return 0; fi

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
wheels=$root/.deps/wheels
cache=$root/.cache
prog=setup.sh

die() { echo "$prog: $*" >&2; exit 1; }

versions=()
fetch_cmake=1
while (($#)); do
  case $1 in
    --python-version)
      if (($# < 2)) || ! [[ $2 =~ ^3\.[0-9]+$ ]]; then die "--python-version needs X.Y, e.g. 3.12"; fi
      versions+=("$2"); shift 2 ;;
    --no-cmake) fetch_cmake=0; shift ;;
    -h | --help) sed -n "2,15p" "$0" | sed "s/^# \{0,1\}//"; exit 0 ;;
    *) die "unknown argument: $1 (--help explains)" ;;
  esac
done
if ((${#versions[@]} == 0)); then
  local_py=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) ||
    die "no python3 on PATH"
  versions=("$local_py")
  [[ $local_py == 3.12 ]] || versions+=(3.12)
fi

pip_download() { # DEST SPEC [pip options]: one wheel, no dependencies, for this machine's platform
  local dest=$1 spec=$2
  shift 2
  python3 -m pip --version >/dev/null 2>&1 ||
    die "python3 has no pip: apt-get install python3-pip (or use a python3 that has it)"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --dest "$dest" "$@" "$spec" ||
    die "pip could not download $spec (no network to PyPI?)"
}

mkdir -p "$wheels"
for v in "${versions[@]}"; do
  tag=cp${v/./}
  if compgen -G "$wheels/cuda_bench-$CUDA_BENCH_VERSION-$tag-$tag-*.whl" >/dev/null; then
    echo "$prog: cuda-bench $CUDA_BENCH_VERSION for Python $v already in .deps/wheels"
    continue
  fi
  # The manylinux tags the wheel may carry, so that a Python other than this machine's works.
  pip_download "$wheels" "cuda-bench[cu13]==$CUDA_BENCH_VERSION" --python-version "$v" \
    --implementation cp --abi "$tag" --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64
  compgen -G "$wheels/cuda_bench-$CUDA_BENCH_VERSION-$tag-$tag-*.whl" >/dev/null ||
    die "pip saved no cuda_bench-$CUDA_BENCH_VERSION-$tag wheel into $wheels"
  echo "$prog: fetched cuda-bench $CUDA_BENCH_VERSION for Python $v into .deps/wheels"
done

# version_ge A B: A >= B, dotted versions.
version_ge() { [[ $(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1) == "$2" ]]; }

if ((fetch_cmake)); then
  have=$(cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9.]*\).*/\1/p' || true)
  if [[ -n $have ]] && version_ge "$have" "$CMAKE_MINIMUM"; then
    echo "$prog: cmake $have on PATH is new enough (>= $CMAKE_MINIMUM)"
  elif [[ -x $cache/cmake-$CMAKE_VERSION/bin/cmake ]]; then
    echo "$prog: cmake $CMAKE_VERSION already in .cache/cmake-$CMAKE_VERSION"
  else
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    pip_download "$tmp" "cmake==$CMAKE_VERSION"
    # The wheel's cmake/data/ is a complete CMake prefix (bin/, share/cmake-X.Y/): the binary
    # finds its modules relative to itself, so it runs from wherever the prefix lies.
    python3 - "$tmp" "$cache/cmake-$CMAKE_VERSION" <<'EOF'
import glob, os, shutil, stat, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(os.path.join(tmp, "cmake-*.whl"))
stage = dest + ".partial"
shutil.rmtree(stage, ignore_errors=True)
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        name = info.filename
        if not name.startswith("cmake/data/") or name.endswith("/"):
            continue
        target = os.path.join(stage, name[len("cmake/data/"):])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(info) as src, open(target, "wb") as out:
            shutil.copyfileobj(src, out)
        mode = info.external_attr >> 16
        if mode & stat.S_IXUSR:
            os.chmod(target, 0o755)
shutil.rmtree(dest, ignore_errors=True)
os.rename(stage, dest)
EOF
    "$cache/cmake-$CMAKE_VERSION/bin/cmake" --version | head -n 1 >/dev/null ||
      die "the unpacked CMake in .cache/cmake-$CMAKE_VERSION does not run"
    echo "$prog: fetched cmake $CMAKE_VERSION into .cache/cmake-$CMAKE_VERSION (the cmake on PATH is ${have:-missing})"
  fi
fi
