#!/bin/busybox sh
# /init of the ivcuda test guest (tools/guest/build-guest-image.sh).
#
# Mounts the basics, loads uio.ko and ivcuda_uio.ko, runs the command that
# run-in-guest.sh passed as IVCUDA_CMD (base64, on the kernel command line,
# which the kernel hands to init as an environment variable), then reports the
# command's exit status twice: as a console line "IVCUDA_GUEST_EXIT=<n>" (the
# whole value) and through QEMU's isa-debug-exit device at port 0xf4, which
# makes QEMU exit with (n << 1) | 1 (only the low 7 bits of n survive that).

/bin/busybox mount -t devtmpfs devtmpfs /dev
# The kernel found no /dev/console in the initramfs to give us: take it now.
exec </dev/console >/dev/console 2>&1

export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mkdir -p /dev/shm /dev/pts /root
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
hostname ivcuda-guest

report() {
	echo "IVCUDA_GUEST_EXIT=$1"
	# One byte to the debug-exit port; QEMU exits during the write.
	# shellcheck disable=SC2059 # the format is the octal escape we build
	printf "\\$(printf %o $(($1 & 0xff)))" | dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
	# Only reached without isa-debug-exit: panic=-1 and -no-reboot end QEMU.
	poweroff -f
}

read -r up _ </proc/uptime
echo "ivcuda-guest: /init at ${up}s"

for m in uio ivcuda_uio; do
	if ! insmod /lib/modules/$m.ko; then
		echo "ivcuda-guest: insmod $m.ko failed"
		report 126
	fi
done

if [ -z "$IVCUDA_CMD" ]; then
	echo "ivcuda-guest: no IVCUDA_CMD on the kernel command line"
	report 126
fi
echo "$IVCUDA_CMD" | base64 -d >/tmp/ivcuda-cmd.sh
unset IVCUDA_CMD
cd /root || report 126
sh /tmp/ivcuda-cmd.sh </dev/null
status=$?
read -r up _ </proc/uptime
echo "ivcuda-guest: command exited with $status at ${up}s"
report $status
