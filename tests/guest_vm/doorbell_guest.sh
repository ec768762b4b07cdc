#!/bin/sh
# Runs inside the test guest (tests/guest_vm/vm_test.sh doorbell), against
# tools/guest/ivshmem-test-server.py: doorbells on every vector, round trips,
# then the driver's teardown paths: unbind with a UIO node held open, rebind,
# doorbells again, module unload. Any kernel warning fails the test.
set -e
fail() { echo "doorbell_guest: FAIL: $*"; exit 1; }
ivcuda_uio_count() { cat /sys/class/uio/uio*/name 2>/dev/null | grep -c '^ivcuda-vec' || true; }

ivcuda_guest_check info
ivcuda_guest_check doorbell --peer 0 --rounds "${ROUNDS:-200}"

bdf=$(basename "$(readlink /sys/class/uio/uio0/device)")
n=$(ivcuda_uio_count)
exec 3<>/dev/uio0
# A reader blocked in read() when the device goes must wake up with EIO.
dd if=/dev/uio1 of=/dev/null bs=4 count=1 2>/tmp/reader.err &
reader=$!
sleep 0.3
echo "$bdf" >/sys/bus/pci/drivers/ivcuda_uio/unbind
[ "$(ivcuda_uio_count)" = 0 ] || fail "UIO devices left after unbind"
if wait $reader; then fail "the blocked reader returned data after unbind"; fi
grep -q 'Input/output error' /tmp/reader.err || fail "the blocked reader failed otherwise: $(cat /tmp/reader.err)"
exec 3<&-
echo "$bdf" >/sys/bus/pci/drivers/ivcuda_uio/bind
[ "$(ivcuda_uio_count)" = "$n" ] || fail "rebind gave $(ivcuda_uio_count) UIO devices, not $n"
ivcuda_guest_check doorbell --peer 0 --rounds 10
echo "doorbell_guest: unbind woke a blocked reader with EIO; rebind and doorbells after it: ok"

rmmod ivcuda_uio
[ "$(ivcuda_uio_count)" = 0 ] || fail "UIO devices left after rmmod"
rmmod uio
if dmesg | grep -E 'WARNING|BUG|Oops|refcount|use-after-free'; then
	fail "kernel complained (above)"
fi
echo "doorbell_guest: module unload clean"
