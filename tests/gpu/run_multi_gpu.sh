#!/usr/bin/env bash
# Several GPUs (issue 8), on a machine with two or more: one guest given two
# GPUs (peer access and a peer copy, checked against the same program run
# natively), and two guests at once, each given a different GPU on its own
# socket (each sees only its GPU, with the real UUID and PCI address).
#   usage (repository root): bash tests/gpu/run_multi_gpu.sh [BUILD_DIR]
# BUILD_DIR defaults to build/gpu (run_gpu_suite.sh's); missing targets are built.
set -u
root=$(pwd)
build=${1:-$root/build/gpu}
out=${OUT:-$root/out}/multi
mkdir -p "$out"
deps=/tmp/ivcuda-deps
if [[ ! -d $deps/usr ]]; then
  mkdir -p "$deps"
  for f in "$root"/.deps/*.deb; do dpkg -x "$f" "$deps"; done
fi
export PKG_CONFIG_SYSROOT_DIR=$deps PKG_CONFIG_PATH=$deps/usr/lib/x86_64-linux-gnu/pkgconfig
export CPLUS_INCLUDE_PATH=$deps/usr/include LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu
[[ -f $build/CMakeCache.txt ]] || cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_PREFIX_PATH="$deps/usr" >"$out/configure.log" 2>&1
cmake --build "$build" -j "$(nproc)" --target ivcudad ivcuda_guest drv_peer drv_devices drv_core \
  >"$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head -20; exit 1; }
bin=$build/tests/bin
ngpu=$(nvidia-smi -L | wc -l)
echo "== $ngpu GPU(s)"
nvidia-smi -L
nvidia-smi topo -m 2>/dev/null | head -5
daemon=
# shellcheck source=../lib/verdicts.sh
. "$root/tests/lib/verdicts.sh"
expect_cases 7
stop() { [ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null; daemon=; }
start() {  # ivcudad arguments
  stop
  rm -f /tmp/ivm-*.sock
  "$build/host-daemon/ivcudad" --socket /tmp/ivm-0.sock --shm-size 1G --driver libcuda.so.1 "$@" \
    >>"$out/ivcudad.log" 2>&1 &
  daemon=$!
  for _ in $(seq 200); do [ -S /tmp/ivm-0.sock ] && break; sleep 0.05; done
  sleep 0.2
}
log=$out/ivcudad.log
# via SOCKET NAME CMD...: CMD through ivcuda; served NAME then says whether ivcudad's log shows
# that very process (a run that found this machine's libcuda.so.1 agrees with native too).
via() {
  local s=$1 name=$2; shift 2
  log_mark "$log" >"$out/$name.mark"
  rm -f "$out/$name.pid"
  IVCUDA_SOCKET=$s LD_LIBRARY_PATH=$build/lib timeout 300 "${tagged[@]}" "$out/$name.pid" "$@"
}
served() {
  served_by "$log" "$(cat "$out/$1.pid" 2>/dev/null || echo 0)" "$(cat "$out/$1.mark")" && return 0
  echo "$1: not served by ivcudad (no hello from its process in $log)"
  return 1
}
if [ "$ngpu" -lt 2 ]; then
  not_run "every multi-GPU case" "this machine has $ngpu GPU(s); run it on nvidia-h200-x2"
  expect_cases 1
  finish; exit
fi

echo "== one guest, GPUs 0 and 1: peer access and copies, native vs ivcuda"
"$bin/drv_peer" >"$out/peer.native" 2>&1; rn=$?
start --gpus 0,1
via /tmp/ivm-0.sock peer "$bin/drv_peer" >"$out/peer.ivcuda" 2>&1; ri=$?
cat "$out/peer.ivcuda"
diff "$out/peer.native" "$out/peer.ivcuda" && same=0 || same=1
served peer; sp=$?
verdict "drv_peer on two GPUs: native rc=$rn, ivcuda rc=$ri, identical output, served by ivcudad" $((rn | ri | same | sp))
[ $sp -eq 0 ] && grep -q "^peer copy of .* verified" "$out/peer.ivcuda"
verdict "a peer copy between the two GPUs, verified byte for byte" $?
"$bin/drv_devices" >"$out/devices.native" 2>&1; rn=$?
via /tmp/ivm-0.sock devices "$bin/drv_devices" >"$out/devices.ivcuda" 2>&1; ri=$?
# Both succeed, both list every GPU of this machine, the lists agree, and ivcudad served it.
[ $rn -eq 0 ] && [ $ri -eq 0 ] && served devices && [ "$(grep -c '^device' "$out/devices.native")" -eq "$ngpu" ] &&
  diff <(grep '^device' "$out/devices.native") <(grep '^device' "$out/devices.ivcuda") >/dev/null
verdict "both GPUs granted: the guest sees the same UUIDs and PCI addresses as the host (rc $rn/$ri)" $?

echo "== two guests at once, each on its own socket with its own GPU"
start --gpus 0 --guest-socket /tmp/ivm-1.sock=1
for _ in $(seq 100); do [ -S /tmp/ivm-1.sock ] && break; sleep 0.05; done
via /tmp/ivm-0.sock core.g0 "$bin/drv_core" >"$out/core.g0" 2>&1 & c0=$!
via /tmp/ivm-1.sock core.g1 "$bin/drv_core" >"$out/core.g1" 2>&1 & c1=$!
via /tmp/ivm-0.sock dev.g0 "$bin/drv_devices" --try-ordinal 1 >"$out/dev.g0" 2>&1; rd0=$?
via /tmp/ivm-1.sock dev.g1 "$bin/drv_devices" --try-ordinal 1 >"$out/dev.g1" 2>&1; rd1=$?
served dev.g0 || rd0=99
served dev.g1 || rd1=99
echo "drv_devices exit status: socket 0 $rd0, socket 1 $rd1"
wait $c0; r0=$?; wait $c1; r1=$?
served core.g0 || r0=99
served core.g1 || r1=99
cat "$out/dev.g0" "$out/dev.g1"
tail -1 "$out/core.g0"; tail -1 "$out/core.g1"
verdict "both guests run drv_core at the same time, each on its own GPU" $((r0 | r1))
want0=$(grep '^device 0 ' "$out/devices.native" | cut -d' ' -f3-)
want1=$(grep '^device 1 ' "$out/devices.native" | cut -d' ' -f3-)
[ $rd0 -eq 0 ] && [ -n "$want0" ] && [ "$(grep -c '^device' "$out/dev.g0")" = 1 ] &&
  [ "$(grep '^device 0 ' "$out/dev.g0" | cut -d' ' -f3-)" = "$want0" ]
verdict "guest on socket 0 sees host GPU 0 only, as device 0" $?
[ $rd1 -eq 0 ] && [ -n "$want1" ] && [ "$(grep -c '^device' "$out/dev.g1")" = 1 ] &&
  [ "$(grep '^device 0 ' "$out/dev.g1" | cut -d' ' -f3-)" = "$want1" ]
verdict "guest on socket 1 sees host GPU 1 only, as device 0" $?
grep -q "cuDeviceGet(1): CUDA_ERROR_INVALID_DEVICE" "$out/dev.g1"
verdict "guest on socket 1 cannot reach a second GPU" $?
stop
echo "== multi-GPU summary:"
finish
