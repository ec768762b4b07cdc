#!/bin/bash
# Builds a small bootable test guest from the installed Debian packages:
#   OUTDIR/vmlinux              the uncompressed kernel (PVH boot: ~5 s faster
#                               than the bzImage under TCG)
#   OUTDIR/initramfs.cpio.gz    busybox, uio.ko, ivcuda_uio.ko, /init, added files
#   OUTDIR/kver                 the kernel version both were built for
#
# usage: build-guest-image.sh OUTDIR [--add SRC:DEST]... [--add-bin SRC[:DEST]]...
#        build-guest-image.sh --check
#        build-guest-image.sh --kver
#
#   --add SRC:DEST      copy file or directory SRC to DEST (absolute) in the image
#   --add-bin SRC[:DEST]
#                       copy an executable or shared library to DEST (default:
#                       its own path) together with every library `ldd` lists
#                       for it, each at its host path, and the dynamic loader
#   --check             print what is missing to build and boot a guest; exit
#                       status 0 when nothing is
#   --kver              print the kernel version the image boots (what a
#                       module for the guest, e.g. a DKMS build, must target)
#
# The kernel is the newest installed linux-image-<ver>-amd64 package that has
# its linux-headers-<ver>-amd64 next to it (IVCUDA_GUEST_KVER overrides). Never
# `uname -r`: the host runs some other kernel. The vmlinux and the module are
# rebuilt only when their inputs changed; the initramfs always is (it is cheap).
# Concurrent builds into one OUTDIR serialise on OUTDIR/.lock.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

die() { echo "build-guest-image: $*" >&2; exit 1; }

# Prints the newest kernel version with both image and headers installed.
detect_kver() {
	if [[ -n ${IVCUDA_GUEST_KVER:-} ]]; then
		echo "$IVCUDA_GUEST_KVER"
		return
	fi
	dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' 'linux-image-*' 2>/dev/null |
		awk '$1 == "ii" && $2 ~ /^linux-image-[0-9].*-amd64$/ { sub(/^linux-image-/, "", $2); print $2 }' |
		while read -r v; do
			[[ -d /usr/src/linux-headers-$v ]] && echo "$v"
		done | sort -V | tail -n 1
}

# Prints one line per missing prerequisite.
missing() {
	local kver
	command -v qemu-system-x86_64 >/dev/null || echo "qemu-system-x86_64 (apt-get install qemu-system-x86)"
	command -v python3 >/dev/null || echo "python3"
	command -v cpio >/dev/null || echo "cpio (apt-get install cpio)"
	command -v make >/dev/null || echo "make"
	if [[ ! -x /bin/busybox ]] || ldd /bin/busybox >/dev/null 2>&1; then
		echo "a static /bin/busybox (apt-get install busybox-static)"
	fi
	kver=$(detect_kver)
	if [[ -z $kver ]]; then
		echo "a kernel with headers (apt-get install linux-image-amd64 linux-headers-amd64)"
		return
	fi
	[[ -r /boot/vmlinuz-$kver ]] || echo "/boot/vmlinuz-$kver (linux-image-$kver)"
	[[ -d /lib/modules/$kver/kernel/drivers/uio ]] || echo "uio.ko of $kver (linux-image-$kver)"
	[[ -d /usr/src/linux-headers-$kver ]] || echo "linux-headers-$kver"
}

if [[ ${1:-} == --check ]]; then
	m=$(missing)
	[[ -z $m ]] && exit 0
	echo "$m"
	exit 1
fi
if [[ ${1:-} == --kver ]]; then
	kver=$(detect_kver)
	[[ -n $kver ]] || die "no kernel with headers installed (apt-get install linux-image-amd64 linux-headers-amd64)"
	echo "$kver"
	exit 0
fi

[[ $# -ge 1 && $1 != -* ]] || die "usage: build-guest-image.sh OUTDIR [--add SRC:DEST]... [--add-bin SRC[:DEST]]..."
outdir=$1
shift
adds=()
add_bins=()
while [[ $# -gt 0 ]]; do
	case $1 in
	--add) [[ $# -ge 2 && $2 == *:/* ]] || die "--add needs SRC:/DEST"; adds+=("$2"); shift 2 ;;
	--add-bin) [[ $# -ge 2 ]] || die "--add-bin needs SRC[:DEST]"; add_bins+=("$2"); shift 2 ;;
	*) die "unknown argument: $1" ;;
	esac
done

m=$(missing)
[[ -z $m ]] || die "missing prerequisites:"$'\n'"$m"
kver=$(detect_kver)

mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)
exec 9>"$outdir/.lock"
flock 9

# --- kernel -------------------------------------------------------------------
if [[ ! -s $outdir/vmlinux || /boot/vmlinuz-$kver -nt $outdir/vmlinux ||
      $(cat "$outdir/kver" 2>/dev/null) != "$kver" ]]; then
	python3 "$here/extract-vmlinux.py" "/boot/vmlinuz-$kver" "$outdir/vmlinux"
fi

# --- module: built in a copy so that the source tree stays clean ---------------
modsrc=$repo/uio-driver
modbuild=$outdir/module
ko=$modbuild/ivcuda_uio.ko
stale=0
if [[ ! -s $ko || $(cat "$outdir/kver" 2>/dev/null) != "$kver" ]]; then
	stale=1
else
	for f in "$modsrc"/ivcuda_uio.c "$modsrc"/Kbuild "$modsrc"/Makefile; do
		[[ $f -nt $ko ]] && stale=1
	done
fi
if ((stale)); then
	rm -rf "$modbuild"
	mkdir -p "$modbuild"
	cp "$modsrc"/ivcuda_uio.c "$modsrc"/Kbuild "$modsrc"/Makefile "$modbuild"/
	make -s -C "$modbuild" KDIR="/usr/src/linux-headers-$kver" >"$modbuild/build.log" 2>&1 ||
		{ cat "$modbuild/build.log" >&2; die "module build failed"; }
	# The module must build warning-free, like the rest of the project.
	if grep -i 'warning' "$modbuild/build.log" | grep -v 'Skipping BTF'; then
		rm -f "$ko"
		die "ivcuda_uio.c has compiler warnings (above)"
	fi >&2
fi
echo "$kver" >"$outdir/kver"

# --- initramfs -----------------------------------------------------------------
root=$outdir/root
rm -rf "$root"
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,tmp,run,lib/modules,etc}

cp /bin/busybox "$root/bin/busybox"
while read -r applet; do
	[[ -e $root/$applet ]] || ln -s /bin/busybox "$root/$applet"
done < <(/bin/busybox --list-full)

# Modules go in uncompressed: busybox insmod cannot read .ko.xz / .ko.zst.
uio=$(find "/lib/modules/$kver/kernel/drivers/uio" -name 'uio.ko*' | head -n 1)
[[ -n $uio ]] || die "no uio.ko in /lib/modules/$kver"
case $uio in
*.ko) cp "$uio" "$root/lib/modules/uio.ko" ;;
*.ko.xz) xz -dc "$uio" >"$root/lib/modules/uio.ko" ;;
*.ko.zst) zstd -qdc "$uio" >"$root/lib/modules/uio.ko" ;;
*.ko.gz) gzip -dc "$uio" >"$root/lib/modules/uio.ko" ;;
*) die "unknown module compression: $uio" ;;
esac
cp "$ko" "$root/lib/modules/ivcuda_uio.ko"
install -m 0755 "$here/guest-init.sh" "$root/init"

# shellcheck source=tools/guest/stage-files.sh
. "$here/stage-files.sh"
stage_files "$root"

(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0) |
	gzip -1 >"$outdir/initramfs.cpio.gz.tmp"
mv "$outdir/initramfs.cpio.gz.tmp" "$outdir/initramfs.cpio.gz"
echo "build-guest-image: $outdir (kernel $kver, initramfs $(du -k "$outdir/initramfs.cpio.gz" | cut -f1) KiB)" >&2
