#!/bin/bash
# VM mode end to end: ivcudad (with the GPU test double standing in for the
# driver) serves a stock QEMU guest through ivshmem-doorbell; inside the
# guest, the unmodified driver-API test programs run through ivcuda's
# libcuda.so.1 over BAR2 with MSI-X doorbells (uio-driver/). Each guest
# process has a worker of its own (host-daemon/daemon/vm_supervisor.h): drv_ipc and
# rt_ipc share memory and events between two guest processes, drv_pool_share
# a pool and its pointer; drv_isolation checks that a process that faults
# leaves the other unharmed, that a SIGKILLed process's memory is back
# within a second (the double's processes share one "GPU" through
# IVCUDA_DOUBLE_LEDGER), and that another process's handles are refused;
# drv_quota that the VM's processes share its quota (--mem-limit 2G), and
# that a SIGKILLed process's memory returns to it; last, ivcudactl shows the
# VM and evicts it, and its program sees clean errors.
#
# With NVML_DOUBLE_LIB (the NVML test double as the host's NVML, --nvml), the
# guest's libnvidia-ml.so.1 sits next to libcuda.so.1 and ivcuda-smi and
# nvml_api run in the guest first: the VM is one tenant, so the second
# process nvml_api starts is listed, by its guest pid, with its memory; and
# pynvml (nvidia-ml-py, unchanged) on a minimal python3 sees the VM's own
# processes, each with its worker's context, and its quota (pynvml_check.py).
#
# usage: vm_ivcuda_test.sh doorbell|plain IMAGE_DIR BUILD_DIR DRIVER_LIB [NVML_DOUBLE_LIB]
#   doorbell: ivshmem-doorbell on ivcudad's socket (MSI-X wake-ups)
#   plain:    ivshmem-plain on a memory file ivcudad formats (both sides poll)
# Exits 77 with the reason when QEMU or the kernel packages are missing: CTest counts
# that as a failure unless the build was configured with IVCUDA_ALLOW_SKIPS.
set -euo pipefail

mode=$1 image=$2 build=$3 driver=$4 nvml=${5:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
guest=$(cd "$here/../../tools/guest" && pwd)
# shellcheck source=../lib/daemon.sh
. "$here/../lib/daemon.sh"

if ! missing=$("$guest/build-guest-image.sh" --check); then
	echo "SKIP: the VM tests need:"
	echo "$missing"
	exit 77
fi
lib=$build/lib
bin=$build/tests/bin
kernels=$build/tests/gpu_double
for f in "$lib/libcuda.so.1" "$bin/drv_core" "$bin/drv_kernels" "$bin/drv_errors" "$bin/rt_basic_static" \
	"$bin/drv_hostreg" "$bin/rt_nvbench_pattern_static" "$bin/drv_vmm" "$bin/drv_vmm_share" \
	"$bin/drv_arrays" "$bin/drv_sparse" "$bin/drv_pools" "$bin/drv_pool_share" "$bin/drv_capture_modes" "$bin/rt_texture_static" "$bin/drv_ipc" "$bin/rt_ipc_static" \
	"$bin/drv_graph_build" "$bin/rt_graphs_static" "$bin/drv_memops" "$bin/drv_isolation" "$bin/drv_quota" \
	"$bin/drv_managed" "$kernels/test_kernels.ptx"; do
	[[ -e $f ]] || { echo "FAIL: $f is not built"; exit 1; }
done
# The guest's NVML, ivcuda-smi and the NVML test program, when the host side has an NVML.
nvml_adds=() nvml_daemon=() nvml_run=
if [[ -n $nvml ]]; then
	for f in "$lib/libnvidia-ml.so.1" "$build/bin/ivcuda-smi" "$bin/nvml_api" "$nvml"; do
		[[ -e $f ]] || { echo "FAIL: $f is not built"; exit 1; }
	done
	nvml_adds=(--add-bin "$lib/libnvidia-ml.so.1:/opt/ivcuda/lib/libnvidia-ml.so.1"
		--add-bin "$build/bin/ivcuda-smi:/usr/bin/ivcuda-smi" --add-bin "$bin/nvml_api:/usr/bin/nvml_api")
	nvml_daemon=(--nvml "$nvml")
	# The NVML checks run from a script in the image (the kernel command line that carries the
	# guest's command is short). pynvml_check.py's figures are the truth on the host: the VM's
	# quota (--mem-limit 2G below) and what a context holds in the GPU double (16 MiB, its default).
	nvml_script=$image.nvml-checks.sh
	cat >"$nvml_script" <<'CHECKS'
set -e
ivcuda-smi -L
ivcuda-smi
ivcuda-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used --format=csv
nvml_api --same-tenant-child
PYTHONPATH=/opt/pynvml python3 -S /opt/ivcuda/pynvml_check.py 2048 16
CHECKS
	nvml_adds+=(--add "$nvml_script:/opt/ivcuda/nvml_checks.sh")
	nvml_run="sh /opt/ivcuda/nvml_checks.sh &&"
	# pynvml too: NVIDIA's nvidia-ml-py wheel (tools/install-deps.sh fetches it into .deps/wheels)
	# on the host's python3, with only the standard modules it loads (the image has no Python).
	pywheel=$(ls "$here/../../.deps/wheels"/nvidia_ml_py-*.whl 2>/dev/null | head -1)
	[[ -n $pywheel ]] || { echo "FAIL: no nvidia-ml-py wheel in .deps/wheels (tools/install-deps.sh fetches it)"; exit 1; }
	py=$(readlink -f /usr/bin/python3)  # Debian's (tools/install-deps.sh), not whatever python3 PATH finds first
	pystage=$image.python
	rm -rf "$pystage"
	# shellcheck source=../../tools/guest/stage-python.sh
	. "$guest/stage-python.sh"
	python_unpack "$py" "$pystage" "$pywheel"
	# What the check imports (it runs in the guest only: here there is no NVML to ask).
	stage_python "$py" "$pystage" /opt/pynvml "-c import os, sys, time, subprocess, pynvml"
	nvml_adds+=("${python_adds[@]}" --add "$here/pynvml_check.py:/opt/ivcuda/pynvml_check.py")
fi

# The programs find libcuda.so.1 through LD_LIBRARY_PATH, as a user's would:
# /opt/ivcuda/lib in the guest (host paths may lie under the guest's tmpfs).
LD_LIBRARY_PATH=$lib "$guest/build-guest-image.sh" "$image" \
	--add-bin "$lib/libcuda.so.1:/opt/ivcuda/lib/libcuda.so.1" \
	--add-bin "$bin/drv_core:/usr/bin/drv_core" \
	--add-bin "$bin/drv_kernels:/usr/bin/drv_kernels" \
	--add-bin "$bin/drv_errors:/usr/bin/drv_errors" \
	--add-bin "$bin/rt_basic_static:/usr/bin/rt_basic_static" \
	--add-bin "$bin/drv_hostreg:/usr/bin/drv_hostreg" \
	--add-bin "$bin/rt_nvbench_pattern_static:/usr/bin/rt_nvbench_pattern_static" \
	--add-bin "$bin/drv_vmm:/usr/bin/drv_vmm" \
	--add-bin "$bin/drv_vmm_share:/usr/bin/drv_vmm_share" \
	--add-bin "$bin/drv_arrays:/usr/bin/drv_arrays" \
	--add-bin "$bin/drv_sparse:/usr/bin/drv_sparse" \
	--add-bin "$bin/drv_pools:/usr/bin/drv_pools" \
	--add-bin "$bin/drv_pool_share:/usr/bin/drv_pool_share" \
	--add-bin "$bin/drv_capture_modes:/usr/bin/drv_capture_modes" \
	--add-bin "$bin/rt_texture_static:/usr/bin/rt_texture_static" \
	--add-bin "$bin/drv_ipc:/usr/bin/drv_ipc" \
	--add-bin "$bin/rt_ipc_static:/usr/bin/rt_ipc_static" \
	--add-bin "$bin/drv_graph_build:/usr/bin/drv_graph_build" \
	--add-bin "$bin/rt_graphs_static:/usr/bin/rt_graphs_static" \
	--add-bin "$bin/drv_memops:/usr/bin/drv_memops" \
	--add-bin "$bin/drv_managed:/usr/bin/drv_managed" \
	--add-bin "$bin/drv_isolation:/usr/bin/drv_isolation" \
	--add-bin "$bin/drv_quota:/usr/bin/drv_quota" \
	"${nvml_adds[@]}" \
	--add "$kernels/test_kernels.ptx:/opt/ivcuda/test_kernels.ptx" \
	--add "$kernels/test_kernels.fatbin:/opt/ivcuda/test_kernels.fatbin"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ivcuda-vm.XXXXXX")
cleanup() {
	stop_ivcudad
	rm -rf "$tmp"
}
trap cleanup EXIT

vectors=4
sock=$tmp/ivcudad.sock
plain=() ready=()
device=(--socket "$sock" --vectors $vectors)
if [[ $mode == plain ]]; then
	dir=/dev/shm
	[[ -d $dir && -w $dir ]] || dir=$tmp
	shm=$dir/ivcuda-plain-$$
	plain=(--plain-file "$shm")
	ready=(--wait-log "ivshmem-plain guest")  # the daemon formats the memory file, then says so
	device=(--shm-file "$shm" --shm-size $((256 << 20)))
	trap 'cleanup; rm -f "$shm"' EXIT
fi
IVCUDA_DOUBLE_LEDGER=$tmp/ledger start_ivcudad "${ready[@]}" "$tmp/ivcudad.log" --socket "$sock" --vectors $vectors \
	--shm-size 256M --channels 8 --staging-size 4M --mem-limit 2G --context-reserve 0 --driver "$driver" \
	--control-socket "$tmp/control.sock" "${plain[@]}" "${nvml_daemon[@]}" || { echo "FAIL: ivcudad did not start"; exit 1; }

# The operator's side of a VM: once the guest's last program holds its
# 77 MiB, ivcudactl shows the VM and evicts it; that program then sees every
# call fail with CUDA_ERROR_DEVICE_UNAVAILABLE (drv_quota --until-evicted).
evict_vm() {
	local ctl=$build/host-daemon/ivcudactl seen=0 id
	for _ in $(seq 1500); do
		id=$("$ctl" --socket "$tmp/control.sock" status --json 2>/dev/null | python3 -c '
import json, sys
g = [x for x in json.load(sys.stdin)["guests"] if x["mem_used_bytes"] == 77 << 20 and x["mode"].startswith("vm")]
print(g[0]["id"] if g else "")')
		if [[ -n $id ]]; then seen=$((seen + 1)); else seen=0; fi
		if [[ $seen -ge 2 ]]; then
			"$ctl" --socket "$tmp/control.sock" status >"$tmp/vm_status" 2>&1
			"$ctl" --socket "$tmp/control.sock" evict "$id" >"$tmp/vm_evict" 2>&1
			return
		fi
		sleep 0.2
	done
}
evict_vm &
evicter=$!
rc=0
"$guest/run-in-guest.sh" --image "$image" "${device[@]}" --timeout 150 \
	"export LD_LIBRARY_PATH=/opt/ivcuda/lib &&
	 $nvml_run
	 drv_core &&
	 drv_kernels --ptx /opt/ivcuda/test_kernels.ptx --fatbin /opt/ivcuda/test_kernels.fatbin &&
	 rt_basic_static &&
	 drv_hostreg --ptx /opt/ivcuda/test_kernels.ptx &&
	 rt_nvbench_pattern_static &&
	 drv_vmm --ptx /opt/ivcuda/test_kernels.ptx --own-range &&
	 drv_vmm_share &&
	 drv_arrays --ptx /opt/ivcuda/test_kernels.ptx &&
	 drv_sparse --forged-handles &&
	 drv_pools --ptx /opt/ivcuda/test_kernels.ptx &&
	 drv_pool_share --ptx /opt/ivcuda/test_kernels.ptx --forged &&
	 drv_capture_modes &&
	 rt_texture_static &&
	 drv_ipc --ptx /opt/ivcuda/test_kernels.ptx --forged CUDA_ERROR_INVALID_HANDLE &&
	 rt_ipc_static &&
	 drv_graph_build --ptx /opt/ivcuda/test_kernels.ptx --limits &&
	 rt_graphs_static &&
	 drv_memops &&
	 drv_managed --ptx /opt/ivcuda/test_kernels.ptx &&
	 drv_isolation --fault --ptx /opt/ivcuda/test_kernels.ptx &&
	 drv_isolation --reclaim --mib 256 &&
	 drv_isolation --foreign &&
	 { drv_quota --hold-mib 300 >/tmp/hold & } &&
	 until grep -q holding /tmp/hold; do sleep 1; done &&
	 drv_quota --quota-mib 2048 --others-mib 300 &&
	 kill -9 %1 && wait &&
	 drv_quota --quota-mib 2048 &&
	 drv_errors --ptx /opt/ivcuda/test_kernels.ptx --fault --forged-handles &&
	 drv_quota --hold-mib 77 --until-evicted && sleep 2" || rc=$?
# A guest run that failed early never reaches the program the eviction waits for.
[[ $rc -eq 0 ]] || kill "$evicter" 2>/dev/null
wait "$evicter"
echo "--- ivcudactl status while the VM held 77 MiB, and the eviction"
cat "$tmp/vm_status" "$tmp/vm_evict" 2>/dev/null
grep -q "evicted; it holds no device memory" "$tmp/vm_evict" 2>/dev/null || { echo "FAIL: ivcudactl evict did not release the VM"; exit 1; }
echo "--- ivcudad log (last lines)"
tail -n 8 "$tmp/ivcudad.log"
# The host side of the SIGKILL: the kernel's exit notice, then the reclaim.
grep -E "exited; reclaimed its worker" "$tmp/ivcudad.log" || { echo "FAIL: no reclaim in the daemon's log"; exit 1; }
# The programs that ended cleanly left their workers to the next ones (--recycle-workers keep, the
# default): the VM's processes after the first start on a recycled worker.
recycled=$(grep -cE "exited; its worker pid [0-9]+ let it go in [0-9]+ ms .* and is the VM's spare" "$tmp/ivcudad.log")
echo "exited processes whose workers became the VM's spare: $recycled"
[[ $recycled -ge 5 ]] || { echo "FAIL: fewer than 5 of the VM's exited processes' workers were recycled"; exit 1; }
# The daemon outlives the VM and serves on.
kill -0 "$ivcudad_pid" || { echo "FAIL: ivcudad died"; exit 1; }
[[ $rc -eq 0 ]] || { echo "FAIL: the guest programs failed (exit $rc)"; exit 1; }
echo "PASS: driver-API programs in a QEMU guest through ivshmem-$mode"
