#!/usr/bin/env bash
# nvcc, or the same output from another build tree of this source tree.
#   nvcc-reuse.sh FROM_BUILD THIS_BUILD NVCC ARGS...
# The test programs and images nvcc makes are the same in every preset (no
# preset's flags reach nvcc), so tools/test.sh builds them once, in the
# default preset, and the asan preset (configured with
# -DIVCUDA_NVCC_REUSE_FROM=build/default) copies them: the file ARGS' -o names,
# at the same place under FROM_BUILD, when it is there and newer than every
# input file ARGS names. Anything else runs NVCC ARGS. FROM_BUILD must be a
# build of the same source tree (its headers are not compared).
set -euo pipefail
from=$1 here=$2
shift 2
out= prev=
for a in "$@"; do
  [ "$prev" = -o ] && out=$a
  prev=$a
done
if [ -n "$out" ] && [[ $out == "$here"/* ]]; then
  src=$from/${out#"$here"/}
  fresh=1
  [ -f "$src" ] || fresh=0
  if [ $fresh -eq 1 ]; then
    for a in "${@:2}"; do
      [ "$a" != "$out" ] && [ -f "$a" ] && [ "$a" -nt "$src" ] && { fresh=0; break; }
    done
  fi
  if [ $fresh -eq 1 ]; then
    mkdir -p "$(dirname "$out")"
    cp "$src" "$out"
    exit 0
  fi
fi
exec "$@"
