#!/bin/bash
# Two containers in one VM (issue 28 item 9): two CUDA processes, each pid 1
# of its own PID namespace (busybox `unshare --pid --fork` in the test
# guest), run through ivcuda's libcuda.so.1 at once. ivcudad must see two
# processes - (namespace, pid) from the library's claims, the same from the
# kernel driver's exit notice - and give each a worker: the first one's exit
# must leave the second's worker serving (drv_pidns --hold checks its
# memory and context after the first has gone).
#
# usage: vm_pidns_test.sh IMAGE_DIR BUILD_DIR DRIVER_LIB
# Exits 77 with the reason when QEMU or the kernel packages are missing: CTest
# counts that as a failure unless the build was configured with IVCUDA_ALLOW_SKIPS.
set -euo pipefail

image=$1 build=$2 driver=$3
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
prog=$build/tests/bin/drv_pidns
for f in "$lib/libcuda.so.1" "$prog"; do
	[[ -e $f ]] || { echo "FAIL: $f is not built"; exit 1; }
done
LD_LIBRARY_PATH=$lib "$guest/build-guest-image.sh" "$image" \
	--add-bin "$lib/libcuda.so.1:/opt/ivcuda/lib/libcuda.so.1" \
	--add-bin "$prog:/usr/bin/drv_pidns"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ivcuda-vm-pidns.XXXXXX")
cleanup() {
	stop_ivcudad
	rm -rf "$tmp"
}
trap cleanup EXIT

sock=$tmp/ivcudad.sock
start_ivcudad "$tmp/ivcudad.log" --socket "$sock" --vectors 4 --shm-size 256M --channels 8 --staging-size 4M \
	--driver "$driver" --control-socket none --warm-workers 0 || { echo "FAIL: ivcudad did not start"; exit 1; }

rc=0
"$guest/run-in-guest.sh" --image "$image" --socket "$sock" --vectors 4 --timeout 120 \
	"export LD_LIBRARY_PATH=/opt/ivcuda/lib &&
	 { unshare -p -f drv_pidns --hold /tmp/ready /tmp/go >/tmp/held 2>&1 & } &&
	 held=\$! &&
	 until [ -e /tmp/ready ]; do sleep 0.2; done &&
	 unshare -p -f drv_pidns &&
	 sleep 1 && touch /tmp/go;
	 wait \$held; st=\$?; cat /tmp/held; exit \$st" || rc=$?
echo "--- ivcudad log (the VM's processes and their workers)"
grep -E "is served by worker|reclaimed its worker|let it go in|died of signal" "$tmp/ivcudad.log" || true
kill -0 "$ivcudad_pid" || { echo "FAIL: ivcudad died"; exit 1; }
# Process 1 of two namespaces: two workers, and the first one's reclaimed.
served=$(grep -cE "process 1 \(pid namespace [1-9][0-9]*\) is served by worker" "$tmp/ivcudad.log" || true)
[[ $served -ge 2 ]] || { echo "FAIL: the two processes 1 were not served by a worker each ($served)"; exit 1; }
# Its worker ended, or (--recycle-workers, the default) let it go to serve the VM's next process.
grep -qE "process 1 exited; (reclaimed its worker|its worker pid [0-9]+ let it go)" "$tmp/ivcudad.log" ||
	{ echo "FAIL: no reclaim of the first"; exit 1; }
[[ $rc -eq 0 ]] || { echo "FAIL: the held process's work failed after the other's exit (exit $rc)"; exit 1; }
echo "PASS: two containers' processes 1 in one VM, a worker each; one's exit left the other's serving"
