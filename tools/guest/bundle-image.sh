#!/bin/bash
# Carries the test guest (build-guest-image.sh) to a machine that cannot build
# it, and completes it there with programs built on that machine.
#
# usage: bundle-image.sh pack BUNDLE_DIR
#        bundle-image.sh unpack BUNDLE_DIR IMAGE_DIR [--add SRC:/DEST]... [--add-bin SRC[:DEST]]...
#
# pack (Debian 12, with the build-guest-image.sh prerequisites): builds the
# base image - kernel, busybox, uio.ko, ivcuda_uio.ko (built against the
# Debian kernel headers, which only exist here), /init - with nothing added,
# and writes into BUNDLE_DIR (e.g. .deps/guest, which the device tool carries):
#   vmlinux.xz               the kernel (63 MB raw)
#   initramfs-base.cpio.gz   the base initramfs
#   kver, SHA256SUMS
#
# unpack (any Linux with bash, python3, gzip and xz or python3's lzma; built
# for Ubuntu 24.04, which lacks cpio): writes IMAGE_DIR/vmlinux and
# IMAGE_DIR/initramfs.cpio.gz, which run-in-guest.sh boots. The added files go
# into a second cpio archive (tools/guest/newc.py) appended to the base one:
# the kernel unpacks concatenated archives in order, each compressed or not.
# --add and --add-bin mean what they mean to build-guest-image.sh: --add-bin
# copies an executable or library with every library `ldd` lists for it (the
# machine's own glibc and loader included), at their paths on this machine.
# The programs thus come with that machine's libraries, and the kernel side with
# Debian's: the guest runs both, as it has no libraries of its own.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

die() { echo "bundle-image: $*" >&2; exit 1; }
# shellcheck source=tools/guest/stage-files.sh
. "$here/stage-files.sh"

xz_dc() {
	if command -v xz >/dev/null; then
		xz -dc "$1"
	else
		python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$1"
	fi
}

pack() {
	[[ $# -eq 1 ]] || die "usage: bundle-image.sh pack BUNDLE_DIR"
	local bundle=$1 base
	base=$(mktemp -d "${TMPDIR:-/tmp}/bundle-image.XXXXXX")
	# shellcheck disable=SC2064 # expand now: $base is local
	trap "rm -rf '$base'" EXIT
	"$here/build-guest-image.sh" "$base"
	mkdir -p "$bundle"
	xz -T0 -9 -c "$base/vmlinux" >"$bundle/vmlinux.xz.tmp"
	mv "$bundle/vmlinux.xz.tmp" "$bundle/vmlinux.xz"
	cp "$base/initramfs.cpio.gz" "$bundle/initramfs-base.cpio.gz"
	cp "$base/kver" "$bundle/kver"
	(cd "$bundle" && sha256sum vmlinux.xz initramfs-base.cpio.gz kver >SHA256SUMS)
	# The unpacked kernel's hash lets unpack skip the 63 MB decompression.
	sha256sum "$base/vmlinux" | cut -c1-64 >"$bundle/vmlinux.sha256"
	echo "bundle-image: $bundle: kernel $(cat "$bundle/kver"), $(du -sk "$bundle" | cut -f1) KiB" >&2
}

unpack() {
	[[ $# -ge 2 ]] || die "usage: bundle-image.sh unpack BUNDLE_DIR IMAGE_DIR [--add SRC:/DEST]... [--add-bin SRC[:DEST]]..."
	local bundle=$1 image=$2
	shift 2
	local adds=() add_bins=()
	while [[ $# -gt 0 ]]; do
		case $1 in
		--add) [[ $# -ge 2 && $2 == *:/* ]] || die "--add needs SRC:/DEST"; adds+=("$2"); shift 2 ;;
		--add-bin) [[ $# -ge 2 ]] || die "--add-bin needs SRC[:DEST]"; add_bins+=("$2"); shift 2 ;;
		*) die "unknown argument: $1" ;;
		esac
	done
	[[ -s $bundle/vmlinux.xz && -s $bundle/initramfs-base.cpio.gz ]] ||
		die "$bundle holds no packed image (bundle-image.sh pack on a Debian 12 machine)"
	(cd "$bundle" && sha256sum --quiet -c SHA256SUMS) || die "$bundle: checksum mismatch"
	mkdir -p "$image"
	image=$(cd "$image" && pwd)

	local want
	want=$(cat "$bundle/vmlinux.sha256")
	if [[ ! -s $image/vmlinux || $(cat "$image/vmlinux.sha256" 2>/dev/null) != "$want" ]]; then
		if ! xz_dc "$bundle/vmlinux.xz" >"$image/vmlinux.tmp" ||
			[[ $(sha256sum "$image/vmlinux.tmp" | cut -c1-64) != "$want" ]]; then
			rm -f "$image/vmlinux.tmp"
			die "could not unpack $bundle/vmlinux.xz to the kernel it was packed from"
		fi
		mv "$image/vmlinux.tmp" "$image/vmlinux"
		echo "$want" >"$image/vmlinux.sha256"
	fi
	cp "$bundle/kver" "$image/kver"

	local root=$image/extra-root
	rm -rf "$root"
	mkdir -p "$root"
	stage_files "$root"
	# The base image's /lib and /usr are real folders: an appended entry must
	# not turn them into links (Ubuntu's /lib is one; cp -RL of files keeps
	# that from happening, this catches --add of a folder holding links).
	local l
	for l in lib lib64 bin sbin usr usr/bin usr/lib; do
		[[ -L $root/$l ]] && die "an added path makes /$l a symbolic link in the guest"
	done

	{
		cat "$bundle/initramfs-base.cpio.gz"
		if [[ -n $(ls -A "$root") ]]; then
			python3 "$here/newc.py" "$root" | gzip -1
		fi
	} >"$image/initramfs.cpio.gz.tmp"
	mv "$image/initramfs.cpio.gz.tmp" "$image/initramfs.cpio.gz"
	echo "bundle-image: $image (kernel $(cat "$image/kver"), initramfs $(du -k "$image/initramfs.cpio.gz" | cut -f1) KiB," \
		"$(find "$root" -type f | wc -l) added files)" >&2
}

case ${1:-} in
pack) shift; pack "$@" ;;
unpack) shift; unpack "$@" ;;
*) die "usage: bundle-image.sh pack BUNDLE_DIR | unpack BUNDLE_DIR IMAGE_DIR [--add SRC:/DEST]... [--add-bin SRC[:DEST]]..." ;;
esac
