#!/bin/bash
# CTest driver of the VM tests: builds the guest image (if needed) and boots it
# under stock QEMU with an ivshmem device.
#
# usage: vm_test.sh plain|doorbell IMAGE_DIR GUEST_CHECK_BINARY
#
#   plain     ivshmem-plain on a /dev/shm file: the host writes a pattern the
#             guest verifies through BAR2, the guest writes one the host
#             verifies in the file; without MSI-X, read() fails at once.
#   doorbell  ivshmem-doorbell with 4 MSI-X vectors on
#             tools/guest/ivshmem-test-server.py: see doorbell_guest.sh.
#
# Exits 77 with the reason when QEMU or the Debian kernel packages are
# missing: CTest counts that as a failure unless the build was configured with
# IVCUDA_ALLOW_SKIPS (then 77 is its SKIP_RETURN_CODE).
set -euo pipefail

mode=$1 image=$2 check=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
guest=$(cd "$here/../../tools/guest" && pwd)

if ! missing=$("$guest/build-guest-image.sh" --check); then
	echo "SKIP: the VM tests need:"
	echo "$missing"
	exit 77
fi
[[ -x $check ]] || { echo "FAIL: $check is not built (cmake --build ... --target ivcuda_guest_check)"; exit 1; }

"$guest/build-guest-image.sh" "$image" \
	--add-bin "$check:/usr/bin/ivcuda_guest_check" \
	--add "$here/doorbell_guest.sh:/usr/bin/doorbell_guest.sh"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ivcuda-vmtest.XXXXXX")
server_pid=
shm=
cleanup() {
	if [[ -n $server_pid ]]; then kill "$server_pid" 2>/dev/null || true; fi
	rm -rf "$tmp"
	if [[ -n $shm ]]; then rm -f "$shm"; fi
}
trap cleanup EXIT

case $mode in
plain)
	half=$((2 * 1024 * 1024))
	dir=/dev/shm
	[[ -d $dir && -w $dir ]] || dir=$tmp
	shm=$dir/ivcuda-vmtest-$$
	truncate -s $((2 * half)) "$shm"
	"$check" fill --file "$shm" --seed 11 --offset 0 --length $half
	"$guest/run-in-guest.sh" --image "$image" --shm-file "$shm" --timeout 60 \
		"ivcuda_guest_check info &&
		 ivcuda_guest_check check --seed 11 --offset 0 --length $half &&
		 ivcuda_guest_check fill --seed 22 --offset $half --length $half &&
		 if dd if=/dev/uio0 of=/dev/null bs=4 count=1 2>/tmp/err; then exit 1; fi &&
		 grep -q 'Input/output error' /tmp/err && echo 'no MSI-X: read() fails with EIO'"
	# What the guest wrote through BAR2 must be in the file now.
	"$check" check --file "$shm" --seed 22 --offset $half --length $half
	"$check" check --file "$shm" --seed 11 --offset 0 --length $half
	;;
doorbell)
	vectors=4 rounds=200
	sock=$tmp/ivshmem.sock
	# Rings: one per vector, the round trips, then the same after a rebind.
	python3 "$guest/ivshmem-test-server.py" --socket "$sock" --vectors $vectors \
		--timeout 90 --expect-rings $((2 * vectors + rounds + 10)) &
	server_pid=$!
	for _ in $(seq 100); do
		[[ -S $sock ]] && break
		sleep 0.1
	done
	[[ -S $sock ]] || { echo "FAIL: the test server never listened"; exit 1; }
	"$guest/run-in-guest.sh" --image "$image" --socket "$sock" --vectors $vectors --timeout 60 \
		"ROUNDS=$rounds doorbell_guest.sh"
	# The server exits once QEMU hangs up, with its own verdict.
	wait "$server_pid"
	server_pid=
	;;
*)
	echo "usage: vm_test.sh plain|doorbell IMAGE_DIR GUEST_CHECK_BINARY" >&2
	exit 2
	;;
esac
echo "PASS: guest_vm $mode"
