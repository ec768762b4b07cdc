#!/bin/bash
# Builds a self-contained, relocatable qemu-system-x86_64 (TCG only) for a
# machine that has no QEMU and no package manager (the GPU machines: Ubuntu
# 24.04). Runs on Debian 12 with qemu-system-x86 installed (it reads the
# installed versions and the library closure from there), and takes every file
# out of the Debian packages themselves: `apt-get download` of the exact
# installed version, then `dpkg -x`.
#
# usage: bundle-qemu.sh OUTDIR        (e.g. .deps/qemu: the device tool carries .deps)
#
# OUTDIR gets:
#   qemu-system-x86_64   a wrapper: unpacks the payload on first use (into
#                        $IVCUDA_QEMU_CACHE, default /tmp/ivcuda-qemu-<hash>),
#                        then runs QEMU with LD_LIBRARY_PATH, QEMU_MODULE_DIR
#                        and -L pointing into it. Put OUTDIR on PATH and
#                        run-in-guest.sh uses it like a system QEMU.
#   payload.tar.xz       bin/, lib/ (shared libraries), modules/, firmware/
#   payload.sha256       names the unpacked folder; the wrapper checks it
#   MANIFEST             package versions and files in the payload
#
# Libraries: everything ldd lists except glibc, libgcc_s, zlib and zstd, which
# every Ubuntu 24.04 system has in a newer, backward-compatible version (the
# Debian binaries need glibc >= 2.34 at most; Ubuntu has 2.39). Taking the rest
# from Debian avoids any ABI-version guessing (gnutls, glib, capstone 4,
# fdt, ...).
#
# Unpacking by hand, without the wrapper (needs xz, or python3's lzma):
#   mkdir /tmp/q && xz -dc OUTDIR/payload.tar.xz | tar -x -C /tmp/q
#   LD_LIBRARY_PATH=/tmp/q/lib QEMU_MODULE_DIR=/tmp/q/modules \
#     /tmp/q/bin/qemu-system-x86_64 -L /tmp/q/firmware ...
set -euo pipefail

die() { echo "bundle-qemu: $*" >&2; exit 1; }

[[ $# -eq 1 && $1 != -* ]] || die "usage: bundle-qemu.sh OUTDIR"
outdir=$1
arch=x86_64-linux-gnu
qemu=/usr/bin/qemu-system-x86_64
tcg=/usr/lib/$arch/qemu/accel-tcg-x86_64.so
for f in "$qemu" "$tcg"; do
	[[ -e $f ]] || die "$f is missing: apt-get install qemu-system-x86 (Debian 12)"
done
for t in apt-get dpkg dpkg-query xz; do command -v "$t" >/dev/null || die "needs $t (Debian 12)"; done

# What -machine q35 -kernel vmlinux (PVH) -nodefaults needs, plus the option
# ROMs that a bzImage or multiboot kernel would load: QEMU reads them at start.
# qboot.rom: the minimal firmware tests/gpu/kvm_probe.sh tries in place of
# SeaBIOS (which took ~20 s under the GPU machine's nested KVM).
firmware=(bios-256k.bin kvmvapic.bin pvh.bin linuxboot.bin linuxboot_dma.bin
	multiboot.bin multiboot_dma.bin qboot.rom)

# Provided by the target system (see the header).
is_system_lib() {
	case $1 in
	ld-linux-x86-64.so.* | libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | \
		librt.so.* | libresolv.so.* | libutil.so.* | libgcc_s.so.* | libz.so.* | \
		libzstd.so.* | linux-vdso.so.*) return 0 ;;
	esac
	return 1
}

work=$(mktemp -d "${TMPDIR:-/tmp}/bundle-qemu.XXXXXX")
trap 'rm -rf "$work"' EXIT
stage=$work/stage payload=$work/payload debs=$work/debs
mkdir -p "$stage" "$payload"/{bin,lib,modules,firmware} "$debs"

# owner PATH: the installed package owning PATH (or its realpath, with or
# without /usr: Debian 12 is usr-merged on disk but not in dpkg's database).
owner() {
	local p r c
	r=$(readlink -f "$1")
	for c in "$1" "$r" "${r#/usr}" "/usr$r"; do
		p=$(dpkg-query -S "$c" 2>/dev/null | head -n 1 | cut -d: -f1) || true
		[[ -n $p ]] && { echo "$p"; return; }
	done
	die "no installed package owns $1"
}

declare -A pkgs=()   # package -> 1
declare -A libs=()   # soname -> package
pkgs[$(owner "$qemu")]=1
pkgs[$(owner "$tcg")]=1
for fw in "${firmware[@]}"; do
	f=''
	for d in /usr/share/qemu /usr/share/seabios; do
		[[ -e $d/$fw ]] && { f=$d/$fw; break; }
	done
	[[ -n $f ]] || die "firmware $fw not found in /usr/share/qemu or /usr/share/seabios"
	pkgs[$(owner "$f")]=1
done
# ldd gives the whole closure of both ELF files.
while read -r soname path; do
	is_system_lib "$soname" && continue
	[[ $path == /* ]] || die "ldd could not resolve $soname"
	libs[$soname]=$(owner "$path")
	pkgs[${libs[$soname]}]=1
done < <({ ldd "$qemu"; ldd "$tcg"; } | awk '$2 == "=>" { print $1, $3 }' | sort -u)

echo "bundle-qemu: ${#libs[@]} libraries from ${#pkgs[@]} packages" >&2
manifest=$payload/MANIFEST
: >"$manifest"
(
	cd "$debs"
	for p in "${!pkgs[@]}"; do
		v=$(dpkg-query -W -f='${Version}' "$p")
		echo "$p=$v"
	done | sort >"$work/versions"
	# The exact installed version, which ldd examined. Debian drops superseded
	# point releases from its mirrors: then the installed files themselves go
	# in, after `dpkg --verify` has checked them against the package's md5sums.
	while IFS="=" read -r p v; do
		if apt-get download -q "$p=$v" >>"$work/apt.log" 2>&1; then
			continue
		fi
		dpkg --verify "$p" >&2 || die "$p: $v is not downloadable and its installed files differ from the package"
		echo "bundle-qemu: $p=$v is no longer on the mirrors: taking its verified installed files" >&2
		echo "$p=$v installed-copy" >>"$work/fallback"
		dpkg-query -L "$p" | while read -r f; do
			[[ -f $f || -L $f ]] || continue
			mkdir -p "$stage$(dirname "$f")"
			cp -P "$f" "$stage$f"
		done
	done <"$work/versions"
	for d in ./*.deb; do [[ -e $d ]] && dpkg -x "$d" "$stage"; done
)
cat "$work/versions" >>"$manifest"
[[ -e $work/fallback ]] && { echo "# taken from the installed, dpkg-verified files"; cat "$work/fallback"; } >>"$manifest"

# from_stage PATTERN DESTDIR: copy the first staged file named PATTERN,
# dereferenced, to DESTDIR under that name.
from_stage() {
	local f
	f=$(find "$stage" -name "$1" \( -type f -o -type l \) | LC_ALL=C sort | head -n 1)
	[[ -n $f ]] || die "$1 is not in the downloaded packages"
	cp -L "$f" "$2/$1"
}
from_stage qemu-system-x86_64 "$payload/bin"
from_stage accel-tcg-x86_64.so "$payload/modules"
for fw in "${firmware[@]}"; do from_stage "$fw" "$payload/firmware"; done
for so in "${!libs[@]}"; do from_stage "$so" "$payload/lib"; done
{
	echo "# files"
	(cd "$payload" && find bin lib modules firmware -type f | LC_ALL=C sort)
} >>"$manifest"

# The packaged binary must be the installed one: the library closure came
# from the installed copy.
cmp -s "$payload/bin/qemu-system-x86_64" "$qemu" || die "the downloaded qemu-system-x86_64 differs from $qemu"

# Proof that it is self-contained (as far as this machine can tell): every
# dependency resolves inside lib/ or is a system library.
for elf in "$payload/bin/qemu-system-x86_64" "$payload/modules/accel-tcg-x86_64.so"; do
	bad=$(LD_LIBRARY_PATH=$payload/lib ldd "$elf" | awk -v lib="$payload/lib/" '
		$2 == "=>" && index($3, lib) != 1 { print $1 }' | while read -r so; do
		is_system_lib "$so" || echo "$so"
	done)
	[[ -z $bad ]] || die "$elf still resolves outside the bundle: $bad"
done

mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)
rm -f "$outdir/payload.tar.xz" "$outdir/payload.sha256"
tar -C "$payload" --owner=0 --group=0 --sort=name -c . | xz -T0 -9 >"$outdir/payload.tar.xz"
sha256sum "$outdir/payload.tar.xz" | cut -c1-64 >"$outdir/payload.sha256"
cp "$manifest" "$outdir/MANIFEST"
cat >"$outdir/qemu-system-x86_64" <<'WRAPPER'
#!/bin/bash
# qemu-system-x86_64 from a bundle made by tools/guest/bundle-qemu.sh. Unpacks
# payload.tar.xz next to it into $IVCUDA_QEMU_CACHE (default
# /tmp/ivcuda-qemu-<hash>) once, then runs QEMU from there. The unpacked copy
# stays out of the working tree, which the device tool carries (64 MiB).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
hash=$(cat "$here/payload.sha256")
dir=${IVCUDA_QEMU_CACHE:-${TMPDIR:-/tmp}/ivcuda-qemu-${hash:0:16}}
if [[ ! -x $dir/bin/qemu-system-x86_64 ]]; then
	tmp=$(mktemp -d "$dir.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	if command -v xz >/dev/null; then
		xz -dc "$here/payload.tar.xz" | tar -x -C "$tmp"
	else
		python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' \
			"$here/payload.tar.xz" | tar -x -C "$tmp"
	fi
	# Concurrent first runs: one rename wins, the others drop their copy.
	mv -T "$tmp" "$dir" 2>/dev/null || rm -rf "$tmp"
	trap - EXIT
fi
# QEMU_MODULE_DIR is searched first for accel-tcg-x86_64.so (util/module.c);
# -L adds the firmware folder (it comes before the built-in paths).
LD_LIBRARY_PATH=$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} QEMU_MODULE_DIR=$dir/modules \
	exec "$dir/bin/qemu-system-x86_64" -L "$dir/firmware" "$@"
WRAPPER
chmod 0755 "$outdir/qemu-system-x86_64"
echo "bundle-qemu: $outdir: $(du -sk "$outdir" | cut -f1) KiB" \
	"(payload $(du -k "$outdir/payload.tar.xz" | cut -f1) KiB xz, $(du -sk "$payload" | cut -f1) KiB unpacked)" >&2
