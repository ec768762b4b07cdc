#!/usr/bin/env bash
# GPU selection: ivcudad --gpus picks and orders the host's GPUs for a guest,
# the guest numbers them from 0 with their real UUIDs and PCI addresses,
# CUDA_VISIBLE_DEVICES narrows them further as on bare metal, and GPUs not
# granted cannot be reached. Runs against the GPU test double with four
# devices, whose own answers (through its libcuda.so.1 name) are the truth.
#   run_device_selection_tests.sh BUILD_DIR DOUBLE_LIB
set -u
build=$(cd "$1" && pwd)
double=$2
prog=$build/tests/bin/drv_devices
work=$(mktemp -d /tmp/ivcuda-gpus.XXXXXX)
# shellcheck source=../lib/verdicts.sh
. "$(dirname "$0")/../lib/verdicts.sh"
# shellcheck source=../lib/daemon.sh
. "$(dirname "$0")/../lib/daemon.sh"
expect_cases 19
export IVCUDA_GPU_DOUBLE_DEVICES=4
cleanup() { stop_ivcudad; rm -rf "$work"; }
trap cleanup EXIT

start() {  # [start_ivcudad's options] ivcudad arguments
  local waits=()
  [ "${1:-}" = --wait ] && { waits=("$1" "$2"); shift 2; }
  stop_ivcudad
  start_ivcudad "${waits[@]}" --append "$work/log" --socket "$work/s" --shm-size 256M --channels 4 --staging-size 4M \
    --driver "$double" "$@" || exit 1
}
guest() { IVCUDA_SOCKET=$work/s LD_LIBRARY_PATH=$build/lib timeout 60 "$prog" "$@" 2>&1; }
line() { grep "^device $1 " | cut -d' ' -f3-; }   # "UUID BUS NAME" of ordinal $1

# The truth: the double as the program's own libcuda.so.1.
mkdir -p "$work/direct" && ln -s "$(readlink -f "$double")" "$work/direct/libcuda.so.1"
LD_LIBRARY_PATH=$work/direct timeout 60 "$prog" >"$work/direct.out" 2>&1
direct() { line "$1" <"$work/direct.out"; }
judge "the double alone shows 4 devices" grep -q "^count 4" "$work/direct.out"

start
guest >"$work/all.out"
judge "all GPUs granted: the same 4 devices, same UUIDs and PCI ids" \
  bash -c "for i in 0 1 2 3; do [ \"\$(grep \"^device \$i \" '$work/all.out' | cut -d' ' -f3-)\" = \"\$(grep \"^device \$i \" '$work/direct.out' | cut -d' ' -f3-)\" ] || exit 1; done"

judge "all GPUs granted: the driver's atomic capabilities to the host and between GPUs, as the driver gives them" \
  bash -c "grep 'atomics of device' '$work/direct.out' >'$work/atomics.direct' && [ \$(wc -l <'$work/atomics.direct') -eq 7 ] && grep 'atomics of device' '$work/all.out' | diff - '$work/atomics.direct'"

start --gpus 3,1
guest --try-ordinal 2 >"$work/sel.out"
judge "--gpus 3,1: two devices, numbered 0 and 1" grep -q "^count 2" "$work/sel.out"
judge "--gpus 3,1: device 0 is host GPU 3" test "$(line 0 <"$work/sel.out")" = "$(direct 3)"
judge "--gpus 3,1: device 1 is host GPU 1" test "$(line 1 <"$work/sel.out")" = "$(direct 1)"
judge "--gpus 3,1: a third GPU is refused" grep -q "cuDeviceGet(2): CUDA_ERROR_INVALID_DEVICE" "$work/sel.out"

peer=$build/tests/bin/drv_peer
IVCUDA_SOCKET=$work/s LD_LIBRARY_PATH=$build/lib timeout 120 "$peer" >"$work/peer2.out" 2>&1
judge "--gpus 3,1: peer access and a peer copy between the two granted GPUs, 4 threads on 2 contexts" \
  bash -c "grep -q '^peer copy of .* verified' '$work/peer2.out' && grep -q '^enable peer access: CUDA_SUCCESS' '$work/peer2.out' && grep -q 'checks, 0 failed' '$work/peer2.out'"
CUDA_VISIBLE_DEVICES=0 IVCUDA_SOCKET=$work/s LD_LIBRARY_PATH=$build/lib timeout 120 "$peer" >"$work/peer1.out" 2>&1
judge "one visible GPU: no peer of itself, a copy between two of its contexts" \
  bash -c "grep -q '^devices 1' '$work/peer1.out' && grep -q 'link 0->0 canAccessPeer CUDA_SUCCESS 0' '$work/peer1.out' && grep -q 'checks, 0 failed' '$work/peer1.out'"

CUDA_VISIBLE_DEVICES=1 guest >"$work/cvd1.out"
judge "CUDA_VISIBLE_DEVICES=1 inside the grant: host GPU 1 only" \
  bash -c "grep -q '^count 1' '$work/cvd1.out' && [ \"\$(grep '^device 0 ' '$work/cvd1.out' | cut -d' ' -f3-)\" = '$(direct 1)' ]"
uuid3=$(direct 3 | cut -d' ' -f1)
CUDA_VISIBLE_DEVICES=$uuid3 guest >"$work/cvdu.out"
judge "CUDA_VISIBLE_DEVICES by UUID" \
  bash -c "grep -q '^count 1' '$work/cvdu.out' && grep -q '^device 0 $uuid3' '$work/cvdu.out'"
# The double's UUIDs differ only at the end: a short prefix names no single GPU.
CUDA_VISIBLE_DEVICES=${uuid3:0:12} guest >"$work/cvda.out"
judge "CUDA_VISIBLE_DEVICES with an ambiguous UUID prefix: no device" \
  grep -q "cuInit: CUDA_ERROR_NO_DEVICE" "$work/cvda.out"
CUDA_VISIBLE_DEVICES=1,7,0 guest >"$work/cvdt.out"
judge "CUDA_VISIBLE_DEVICES stops at the first invalid entry" grep -q "^count 1" "$work/cvdt.out"
CUDA_VISIBLE_DEVICES= guest >"$work/cvde.out"
judge "CUDA_VISIBLE_DEVICES empty: no device" grep -q "cuInit: CUDA_ERROR_NO_DEVICE" "$work/cvde.out"

# One socket per VM, each with its own grant; given in a config file, as an
# operator would. Two guests at once, one on each socket.
cat >"$work/ivcudad.toml" <<CONF
gpus = "0"
guest-socket = ["$work/s2=2", "$work/s3=3,1"]
CONF
start --wait "$work/s3" --config "$work/ivcudad.toml"
guest >"$work/g0.out" &
g0=$!
IVCUDA_SOCKET=$work/s2 LD_LIBRARY_PATH=$build/lib timeout 60 "$prog" >"$work/g2.out" 2>&1 &
g2=$!
IVCUDA_SOCKET=$work/s3 LD_LIBRARY_PATH=$build/lib timeout 60 "$prog" >"$work/g3.out" 2>&1
wait "$g0" "$g2"
judge "config: the main socket's guest sees host GPU 0 only" \
  bash -c "grep -q '^count 1' '$work/g0.out' && [ \"\$(grep '^device 0 ' '$work/g0.out' | cut -d' ' -f3-)\" = '$(direct 0)' ]"
judge "config: a guest on the second socket sees host GPU 2 only" \
  bash -c "grep -q '^count 1' '$work/g2.out' && [ \"\$(grep '^device 0 ' '$work/g2.out' | cut -d' ' -f3-)\" = '$(direct 2)' ]"
judge "config: a guest on the third socket sees host GPUs 3 and 1 as 0 and 1" \
  bash -c "grep -q '^count 2' '$work/g3.out' && [ \"\$(grep '^device 1 ' '$work/g3.out' | cut -d' ' -f3-)\" = '$(direct 1)' ]"
judge "a malformed --guest-socket is refused with a message" \
  bash -c "timeout 10 '$build/host-daemon/ivcudad' --socket '$work/bad' --driver '$double' --guest-socket nogpus 2>&1 | grep -q 'expected SOCKET=GPUS'"

start --gpus 9
guest >"$work/none.out"
judge "--gpus naming a GPU the host lacks: the guest gets no device, the daemon serves on" \
  bash -c "grep -q 'cuInit: CUDA_ERROR' '$work/none.out' && kill -0 $ivcudad_pid"

finish
