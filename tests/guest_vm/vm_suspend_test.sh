#!/bin/bash
# ivcudactl suspend and resume of a VM (issue 34), under stock QEMU with the
# GPU test double, which models the driver's process checkpointing: two CUDA
# processes of the guest hold 48 and 32 MiB and call every 10 ms
# (drv_checkpoint --child). The operator suspends the VM: every worker of its
# supervisor (the two processes' and its spare) holds its calls and is
# checkpointed, the status shows the 80 MiB in host memory, and no call is
# served; a third program the guest starts meanwhile gets no worker until the
# resume, then runs. After the resume both processes find their memory
# intact at the same address, with no failed call and one that waited.
#
# The workers run without the sandbox here by default (--sandbox off: this
# machine's kernel is below the Landlock ABI that --sandbox on needs);
# run_suspend_test.sh checks a sandboxed worker's suspension in process mode.
#
# usage: vm_suspend_test.sh IMAGE_DIR BUILD_DIR DRIVER_LIB
# On the GPU machine (tests/gpu/run_all.sh vm-suspend), with the real driver
# (DRIVER_LIB libcuda.so.1): IVCUDA_VM_IMAGE_BUNDLE=DIR completes the image
# carried in DIR (tools/guest/bundle-image.sh pack) instead of building one,
# IVCUDA_VM_SUSPEND_SANDBOX picks the workers' sandbox (default off), and
# IVCUDA_GUEST_ACCEL=tcg keeps QEMU off a /dev/kvm that cannot run a guest.
# Exits 77 with the reason when QEMU or the kernel packages are missing: CTest
# counts that as a failure unless the build was configured with IVCUDA_ALLOW_SKIPS.
set -euo pipefail

image=$1 build=$2 driver=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
guest=$(cd "$here/../../tools/guest" && pwd)
# shellcheck source=../lib/daemon.sh
. "$here/../lib/daemon.sh"

if [[ -z ${IVCUDA_VM_IMAGE_BUNDLE:-} ]] && ! missing=$("$guest/build-guest-image.sh" --check); then
	echo "SKIP: the VM tests need:"
	echo "$missing"
	exit 77
fi
lib=$build/lib
bin=$build/tests/bin
ctl=$build/host-daemon/ivcudactl
for f in "$lib/libcuda.so.1" "$bin/drv_checkpoint" "$bin/drv_core" "$ctl"; do
	[[ -e $f ]] || { echo "FAIL: $f is not built"; exit 1; }
done
adds=(--add-bin "$lib/libcuda.so.1:/opt/ivcuda/lib/libcuda.so.1" --add-bin "$bin/drv_checkpoint:/usr/bin/drv_checkpoint"
	--add-bin "$bin/drv_core:/usr/bin/drv_core")
# ldd must find ivcuda's libcuda.so.1 for the programs, never a driver's.
if [[ -n ${IVCUDA_VM_IMAGE_BUNDLE:-} ]]; then
	LD_LIBRARY_PATH=$lib "$guest/bundle-image.sh" unpack "$IVCUDA_VM_IMAGE_BUNDLE" "$image" "${adds[@]}"
else
	LD_LIBRARY_PATH=$lib "$guest/build-guest-image.sh" "$image" "${adds[@]}"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ivcuda-vm-suspend.XXXXXX")
cleanup() {
	stop_ivcudad
	rm -rf "$tmp"
}
trap cleanup EXIT

sock=$tmp/ivcudad.sock
csock=$tmp/control.sock
log=$tmp/ivcudad.log
IVCUDA_DOUBLE_LEDGER=$tmp/ledger start_ivcudad --wait "$csock" "$log" --socket "$sock" --vectors 4 \
	--shm-size 256M --channels 8 --staging-size 4M --context-reserve 0 --driver "$driver" \
	--control-socket "$csock" --sandbox "${IVCUDA_VM_SUSPEND_SANDBOX:-off}" || { echo "FAIL: ivcudad did not start"; exit 1; }

# The VM's entry in the status: "ID PROCESSES MEM_USED CALLS STATE DEVICE HOST", or nothing.
vm_entry() {
	"$ctl" --socket "$csock" status --json 2>/dev/null | python3 -c '
import json, sys
for g in json.load(sys.stdin)["guests"]:
    if g["mode"].startswith("vm"):
        print(g["id"], g["processes"], g["mem_used_bytes"], g["calls"], g["state"], g["mem_device_bytes"],
              g["mem_host_bytes"])' || true
}

# The operator: once both processes hold their memory, suspend, look twice
# (the third program arrives meanwhile), resume. Its findings go to $tmp/op.
operator() {
	local e=() id
	for _ in $(seq 1500); do
		read -r -a e < <(vm_entry) || true
		[[ ${#e[@]} -eq 7 && ${e[1]} -ge 2 && ${e[2]} -eq $((80 << 20)) ]] && break
		e=()
		sleep 0.1
	done
	[[ ${#e[@]} -eq 7 ]] || { echo "the VM never held its 80 MiB" >"$tmp/op"; return; }
	id=${e[0]}
	{
		"$ctl" --socket "$csock" suspend "$id" || echo "suspend exited $?"
		read -r -a e < <(vm_entry) || true
		echo "after suspend: ${e[*]}"
		# The guest starts its third program 3 s after both hold their memory; a slow
		# guest takes longer to get there: the resume waits until it is held back.
		for _ in $(seq 600); do
			grep -q "waits for the VM's resume for a worker" "$log" && break
			sleep 0.1
		done
		sleep 1
		read -r -a e < <(vm_entry) || true
		echo "while it waits: ${e[*]}"
		sleep 1
		read -r -a e < <(vm_entry) || true
		echo "1 s later: ${e[*]}"
		"$ctl" --socket "$csock" resume "$id" || echo "resume exited $?"
	} >"$tmp/op" 2>&1
}
operator &
op=$!

rc=0
"$guest/run-in-guest.sh" --image "$image" --socket "$sock" --vectors 4 --timeout 240 \
	"export LD_LIBRARY_PATH=/opt/ivcuda/lib &&
	 mkfifo /tmp/a.in /tmp/b.in &&
	 { drv_checkpoint --child --mib 48 </tmp/a.in >/tmp/a.out 2>&1 & } &&
	 { drv_checkpoint --child --mib 32 </tmp/b.in >/tmp/b.out 2>&1 & } &&
	 exec 3>/tmp/a.in 4>/tmp/b.in &&
	 until grep -q ^ready /tmp/a.out && grep -q ^ready /tmp/b.out; do sleep 0.2; done &&
	 sleep 3 && drv_core >/tmp/c.out 2>&1; echo third exited \$?; tail -n 1 /tmp/c.out;
	 sleep 1; echo check >&3; echo check >&4; wait; cat /tmp/a.out /tmp/b.out" >"$tmp/guest.out" 2>&1 || rc=$?
wait "$op" || true
cat "$tmp/guest.out"
echo "--- the operator"
cat "$tmp/op"
echo "--- ivcudad log (the suspension)"
grep -E "suspend|resum|waits for the VM|checkpointer" "$log" || true

fail=0
no() { echo "FAIL: $*"; fail=1; }
kill -0 "$ivcudad_pid" || no "ivcudad died"
[[ $rc -eq 0 ]] || no "the guest command exited $rc"
grep -qE "^guest [0-9]+: suspended: 80 MiB in host memory, none on the GPU" "$tmp/op" || no "ivcudactl suspend did not say the VM's 80 MiB left the GPU"
grep -qE "guest [0-9]+: suspended, [2-9] worker\(s\): its memory \(80 MiB charged\)" "$log" ||
	no "the daemon did not checkpoint the VM's workers"
# ID PROCESSES MEM_USED CALLS STATE DEVICE HOST
read -r -a s1 < <(sed -n 's/^while it waits: //p' "$tmp/op") || true
read -r -a s2 < <(sed -n 's/^1 s later: //p' "$tmp/op") || true
[[ ${s1[4]:-} == suspended && ${s1[5]:-} == 0 && ${s1[6]:-} == $((80 << 20)) ]] ||
	no "while suspended the status said: ${s1[*]:-nothing}"
[[ ${s1[1]:-} == 2 && ${s2[1]:-} == 2 ]] || no "a worker started while the VM was suspended (processes ${s1[1]:-?}, ${s2[1]:-?})"
[[ -n ${s1[3]:-} && ${s1[3]:-} == "${s2[3]:-}" ]] || no "calls were served while the VM was suspended (${s1[3]:-?} -> ${s2[3]:-?})"
grep -q "waits for the VM's resume for a worker" "$log" || no "the third program did not wait for the resume"
# At least the 80 MiB: the program that waited may allocate as soon as the VM resumes.
back=$(sed -n 's/^guest [0-9]*: serving again: \([0-9]*\) MiB back on the GPU.*/\1/p' "$tmp/op")
[[ ${back:-0} -ge 80 ]] || no "ivcudactl resume did not bring the 80 MiB back (${back:-nothing})"
grep -q "^third exited 0" "$tmp/guest.out" || no "the program started while suspended failed"
n=$(grep -cE "^checked intact=1 alloc=1 longest_call_ms=[0-9]{4,}\.[0-9] failed_calls=0" "$tmp/guest.out" || true)
[[ $n -eq 2 ]] || no "$n of the 2 processes found their memory intact with no failed call and a call held a second or more"
[[ $fail -eq 0 ]] || exit 1
echo "PASS: a VM suspended with its processes' workers and spare checkpointed (80 MiB in host memory, no call served, no worker started), resumed intact"
