#!/bin/bash
# The Debian packages end to end, installed the way a user would:
#  1. tools/build-debs.sh makes the three packages from this build; their
#     names, versions, architectures, conffiles, ldconfig trigger and
#     maintainer scripts are checked;
#  2. DKMS builds ivcuda_uio.ko from ivcuda-uio-dkms's source for the kernel
#     the test guest boots (its own trees under the work folder: nothing is
#     registered with the host's DKMS), warning-free;
#  3. ivcuda-guest's files go into the test guest at their package paths,
#     with that .ko as the module its /init loads, and ldconfig (what
#     libc-bin's trigger runs after dpkg) builds the guest's ld.so.cache;
#  4. ivcudad from ivcuda-host's files serves the guest (ivshmem-doorbell)
#     with the GPU test double standing in for the driver;
#  5. in the guest, with no LD_LIBRARY_PATH, the loader finds libcuda.so.1
#     in the package's directory only through ld.so.cache, and drv_core and
#     rt_basic_static (static cudart, which dlopens libcuda.so.1) pass, and
#     ivcuda-smi finds the package's libnvidia-ml.so.1 the same way.
#
# usage: vm_packages_test.sh BUILD_DIR WORK_DIR DRIVER_LIB VERSION HAVE_IVCUDACTL
#   VERSION         the project's version, which the packages must carry
#   HAVE_IVCUDACTL  1 when the build has ivcudactl (then ivcuda-host holds it)
# Exits 77 with the reason when a tool is missing (QEMU, the kernel packages,
# dkms, dpkg-dev): CTest counts that as a failure unless the build was
# configured with IVCUDA_ALLOW_SKIPS.
set -euo pipefail

[[ $# -eq 5 ]] || { echo "usage: vm_packages_test.sh BUILD_DIR WORK_DIR DRIVER_LIB VERSION HAVE_IVCUDACTL" >&2; exit 2; }
build=$1 work=$2 driver=$3 version=$4 have_ctl=$5
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
guest=$repo/tools/guest
fail() { echo "FAIL: $*"; exit 1; }

missing=
m=$("$guest/build-guest-image.sh" --check) || missing+="$m"$'\n'
command -v dkms >/dev/null || missing+="dkms (apt-get install dkms)"$'\n'
for tool in dpkg-deb dpkg-shlibdeps; do
	command -v $tool >/dev/null || missing+="$tool (apt-get install dpkg-dev)"$'\n'
done
command -v cpack >/dev/null || missing+="cpack (apt-get install cmake)"$'\n'
if [[ -n $missing ]]; then
	echo "SKIP: the package test needs:"
	printf '%s' "$missing"
	exit 77
fi
bin=$build/tests/bin
for f in "$bin/drv_core" "$bin/rt_basic_static" "$driver"; do
	[[ -e $f ]] || fail "$f is not built"
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ivcuda-pkg.XXXXXX")
daemon=
cleanup() {
	if [[ -n $daemon ]]; then kill "$daemon" 2>/dev/null || true; wait "$daemon" 2>/dev/null || true; fi
	rm -rf "$tmp"
}
trap cleanup EXIT

# --- 1. the packages ------------------------------------------------------------
debs=$work/debs
rm -rf "$debs"
"$repo/tools/build-debs.sh" "$debs" "$build" >/dev/null
host_deb=$debs/ivcuda-host_${version}_amd64.deb
guest_deb=$debs/ivcuda-guest_${version}_amd64.deb
dkms_deb=$debs/ivcuda-uio-dkms_${version}_all.deb
for deb in "$host_deb" "$guest_deb" "$dkms_deb"; do
	[[ -f $deb ]] || fail "build-debs.sh made no $(basename "$deb") (it made: $(ls "$debs"))"
done

# field DEB NAME: the control field's value.
field() { dpkg-deb -f "$1" "$2"; }
for deb in "$host_deb" "$guest_deb" "$dkms_deb"; do
	name=$(basename "$deb")
	[[ $(field "$deb" Package) == "${name%%_*}" ]] || fail "$name: Package is $(field "$deb" Package)"
	[[ $(field "$deb" Version) == "$version" ]] || fail "$name: Version is $(field "$deb" Version), not $version"
	arch=${name##*_}
	[[ $(field "$deb" Architecture) == "${arch%.deb}" ]] || fail "$name: Architecture is $(field "$deb" Architecture)"
	# Maintainer scripts must at least parse under /bin/sh.
	ctl=$tmp/control-${name%%_*}
	dpkg-deb -e "$deb" "$ctl"
	for s in preinst postinst prerm postrm; do
		[[ -e $ctl/$s ]] || continue
		[[ -x $ctl/$s ]] || fail "$name: $s is not executable"
		sh -n "$ctl/$s" || fail "$name: $s does not parse"
	done
	echo "$name: $(field "$deb" Package) $(field "$deb" Version) $(field "$deb" Architecture); Depends: $(field "$deb" Depends)"
done
grep -qx /etc/ivcuda/ivcudad.toml "$tmp/control-ivcuda-host/conffiles" || fail "ivcudad.toml is not a conffile"
grep -qx /etc/ld.so.conf.d/ivcuda.conf "$tmp/control-ivcuda-guest/conffiles" || fail "ivcuda.conf is not a conffile"
grep -qx 'activate-noawait ldconfig' "$tmp/control-ivcuda-guest/triggers" || fail "ivcuda-guest does not trigger ldconfig"
[[ $(field "$dkms_deb" Depends) == *dkms* ]] || fail "ivcuda-uio-dkms does not depend on dkms"
[[ $(field "$host_deb" Depends) == *libc6* ]] || fail "ivcuda-host has no shared-library Depends"

for p in host guest dkms; do
	mkdir -p "$tmp/$p"
done
dpkg-deb -x "$host_deb" "$tmp/host"
dpkg-deb -x "$guest_deb" "$tmp/guest"
dpkg-deb -x "$dkms_deb" "$tmp/dkms"
host_files=(usr/sbin/ivcudad usr/lib/systemd/system/ivcudad.service etc/ivcuda/ivcudad.toml
	usr/lib/sysusers.d/ivcuda-host.conf usr/share/doc/ivcuda-host/copyright
	usr/share/doc/ivcuda/ivcuda-shmem-doorbell.xml usr/share/doc/ivcuda/libvirt.md)
[[ $have_ctl == 1 ]] && host_files+=(usr/bin/ivcudactl)
libdir=/usr/lib/x86_64-linux-gnu/ivcuda
guest_files=("${libdir#/}/libcuda.so.1" etc/ld.so.conf.d/ivcuda.conf usr/lib/udev/rules.d/99-ivcuda.rules
	usr/lib/sysusers.d/ivcuda-guest.conf "${libdir#/}/libnvidia-ml.so.1" usr/bin/ivcuda-smi)
src=usr/src/ivcuda-uio-$version
dkms_files=("$src/dkms.conf" "$src/ivcuda_uio.c" "$src/Kbuild" "$src/Makefile")
for f in "${host_files[@]}"; do [[ -f $tmp/host/$f ]] || fail "ivcuda-host has no /$f"; done
for f in "${guest_files[@]}"; do [[ -f $tmp/guest/$f ]] || fail "ivcuda-guest has no /$f"; done
for f in "${dkms_files[@]}"; do [[ -f $tmp/dkms/$f ]] || fail "ivcuda-uio-dkms has no /$f"; done
grep -qx "$libdir" "$tmp/guest/etc/ld.so.conf.d/ivcuda.conf" || fail "ivcuda.conf does not name $libdir"
echo "packages: the expected files are in place"

# --- 2. DKMS builds the module for the guest's kernel ----------------------------
kver=$("$guest/build-guest-image.sh" --kver)
tree=(--dkmstree "$tmp/dkms-tree" --sourcetree "$tmp/dkms/usr/src")
mkdir -p "$tmp/dkms-tree"
# dkms signs what it builds (Debian's sign-file, when present) and makes a key
# where none is: keep that key here, not in the host's /var/lib/dkms.
export mok_signing_key=$tmp/mok.key mok_certificate=$tmp/mok.pub
dkms add -m ivcuda-uio -v "$version" "${tree[@]}" >"$tmp/dkms.log" 2>&1 ||
	{ cat "$tmp/dkms.log"; fail "dkms add failed"; }
dkms build -m ivcuda-uio -v "$version" -k "$kver" "${tree[@]}" >>"$tmp/dkms.log" 2>&1 ||
	{ cat "$tmp/dkms.log"; cat "$tmp"/dkms-tree/ivcuda-uio/"$version"/build/make.log 2>/dev/null || true; fail "dkms build failed"; }
built=$tmp/dkms-tree/ivcuda-uio/$version/$kver/x86_64
make_log=$built/log/make.log
[[ -f $make_log ]] || { cat "$tmp/dkms.log"; fail "dkms left no make.log"; }
if grep -i warning "$make_log" | grep -v 'Skipping BTF'; then
	fail "ivcuda_uio.c has compiler warnings in the DKMS build (above)"
fi
ko=$(find "$built/module" -name 'ivcuda_uio.ko*' | head -n 1)
[[ -n $ko ]] || { cat "$tmp/dkms.log"; fail "dkms built no ivcuda_uio.ko"; }
case $ko in  # busybox insmod reads only uncompressed modules
*.ko) ;;
*.ko.xz) xz -dc "$ko" >"$tmp/ivcuda_uio.ko"; ko=$tmp/ivcuda_uio.ko ;;
*.ko.zst) zstd -qdc "$ko" >"$tmp/ivcuda_uio.ko"; ko=$tmp/ivcuda_uio.ko ;;
*.ko.gz) gzip -dc "$ko" >"$tmp/ivcuda_uio.ko"; ko=$tmp/ivcuda_uio.ko ;;
esac
vermagic=$(modinfo -F vermagic "$ko")
[[ $vermagic == "$kver "* ]] || fail "the DKMS module is for '$vermagic', not $kver"
ko_sum=$(sha256sum "$ko" | cut -d ' ' -f 1)
echo "dkms: built ivcuda_uio.ko for $kver"

# --- 3. the guest image with ivcuda-guest installed -----------------------------
adds=()
while IFS= read -r -d '' f; do
	adds+=(--add "$f:${f#"$tmp/guest"}")
done < <(find "$tmp/guest" -type f -print0)
# What libc-bin gives a Debian system: ld.so.conf (including ld.so.conf.d)
# and ldconfig, which its trigger runs once dpkg has installed ivcuda-guest.
printf 'include /etc/ld.so.conf.d/*.conf\n' >"$tmp/ld.so.conf"
ldconfig_bin=$(command -v ldconfig || echo /sbin/ldconfig)
[[ -x $ldconfig_bin ]] || fail "no ldconfig on this host"
# The module at the path the image's /init loads, in place of the one
# build-guest-image.sh builds from uio-driver/ (added files are copied last).
adds+=(--add "$tmp/ld.so.conf:/etc/ld.so.conf" --add "$ldconfig_bin:/sbin/ldconfig"
	--add "$ko:/lib/modules/ivcuda_uio.ko")
# ivcuda-smi finds the package's libnvidia-ml.so.1 through ld.so.cache too (a
# script of its own: the guest's command line has no room left).
cat >"$tmp/nvml-check.sh" <<CHECK
/lib64/ld-linux-x86-64.so.2 --list /usr/bin/ivcuda-smi | grep -F 'libnvidia-ml.so.1 => $libdir/libnvidia-ml.so.1' ||
	{ echo 'guest: libnvidia-ml.so.1 does not resolve to the package'; /lib64/ld-linux-x86-64.so.2 --list /usr/bin/ivcuda-smi; exit 1; }
ivcuda-smi --help >/dev/null || { echo 'guest: ivcuda-smi --help failed'; exit 1; }
echo 'guest: ivcuda-smi finds the package libnvidia-ml.so.1 through ld.so.cache'
CHECK
adds+=(--add "$tmp/nvml-check.sh:/opt/nvml-check.sh")
# --add-bin copies the libraries ldd names: the package's libcuda.so.1 for
# the programs; its own dependencies (libstdc++...) come with it.
LD_LIBRARY_PATH=$tmp/guest$libdir "$guest/build-guest-image.sh" "$work/image" "${adds[@]}" \
	--add-bin "$tmp/guest$libdir/libcuda.so.1:$libdir/libcuda.so.1" \
	--add-bin "$tmp/guest$libdir/libnvidia-ml.so.1:$libdir/libnvidia-ml.so.1" \
	--add-bin "$tmp/guest/usr/bin/ivcuda-smi:/usr/bin/ivcuda-smi" \
	--add-bin "$bin/drv_core:/usr/bin/drv_core" \
	--add-bin "$bin/rt_basic_static:/usr/bin/rt_basic_static"

# --- 4. ivcudad from ivcuda-host ------------------------------------------------
vectors=4
sock=$tmp/ivcudad.sock
ivcudad=$tmp/host/usr/sbin/ivcudad
ivcudactl=$tmp/host/usr/bin/ivcudactl
# The control socket (ivcudactl's) goes here too, not to /run/ivcuda.
control=()
help=$("$ivcudad" --help 2>&1) || true
if [[ $help == *--control-socket* ]]; then
	control=(--control-socket "$tmp/control.sock")
fi
"$ivcudad" --socket "$sock" --vectors $vectors --shm-size 256M --channels 8 \
	--staging-size 4M --driver "$driver" "${control[@]}" >"$tmp/ivcudad.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do
	[[ -S $sock ]] && break
	sleep 0.05
done
[[ -S $sock ]] || { cat "$tmp/ivcudad.log"; fail "the packaged ivcudad did not start"; }
if [[ $have_ctl == 1 && ${#control[@]} -gt 0 ]]; then
	"$ivcudactl" --socket "$tmp/control.sock" status >"$tmp/status.txt" 2>&1 ||
		{ cat "$tmp/status.txt"; fail "the packaged ivcudactl cannot ask the packaged ivcudad for its status"; }
	echo "ivcudactl (ivcuda-host): $(head -n 1 "$tmp/status.txt")"
fi

# --- 5. CUDA programs in the guest, found through ld.so.cache -------------------
# ld.so --list is ldd without ldd: it prints where each library resolves.
loader=/lib64/ld-linux-x86-64.so.2
rc=0
"$guest/run-in-guest.sh" --image "$work/image" --socket "$sock" --vectors $vectors --timeout 150 "
	set -e
	[ -z \"\${LD_LIBRARY_PATH:-}\" ] || { echo 'guest: LD_LIBRARY_PATH is set'; exit 1; }
	[ -d /sys/module/ivcuda_uio ] || { echo 'guest: ivcuda_uio is not loaded'; exit 1; }
	[ \"\$(sha256sum /lib/modules/ivcuda_uio.ko | cut -d ' ' -f 1)\" = $ko_sum ] ||
		{ echo 'guest: the loaded ivcuda_uio.ko is not the DKMS build'; exit 1; }
	echo 'guest: ivcuda_uio.ko from the DKMS build is loaded'
	$loader --list /usr/bin/drv_core >/tmp/before 2>&1 || true
	if grep -q 'libcuda.so.1 => /' /tmp/before; then
		echo 'guest: libcuda.so.1 resolves before ldconfig ran'; cat /tmp/before; exit 1
	fi
	echo 'guest: before ldconfig the loader does not find libcuda.so.1'
	mkdir -p /var/cache/ldconfig
	ldconfig
	ldconfig -p | grep -F 'libcuda.so.1 (libc6,x86-64) => $libdir/libcuda.so.1'
	$loader --list /usr/bin/drv_core | grep -F 'libcuda.so.1 => $libdir/libcuda.so.1' ||
		{ echo 'guest: libcuda.so.1 does not resolve to the package'; $loader --list /usr/bin/drv_core; exit 1; }
	sh /opt/nvml-check.sh
	drv_core
	rt_basic_static" || rc=$?
echo "--- ivcudad (ivcuda-host) log, last lines"
tail -n 5 "$tmp/ivcudad.log"
kill -0 "$daemon" || fail "the packaged ivcudad died"
[[ $rc -eq 0 ]] || fail "the guest failed (exit $rc)"
echo "PASS: ivcuda-host, ivcuda-guest and ivcuda-uio-dkms $version: CUDA programs in a QEMU guest found libcuda.so.1 through ld.so.cache"
