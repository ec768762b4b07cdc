#!/bin/bash
# The Debian packages end to end, installed the way a user would:
#  1. tools/build-debs.sh makes the three packages from this build; their
#     names, versions, architectures, conffiles, ldconfig trigger and
#     dependencies are checked;
#  2. dpkg installs them (`dpkg -i`, as `apt install ./*.deb` does once it
#     has the dependencies: every maintainer script runs) in chroots made of
#     this host's root file system under an overlay, in mount namespaces of
#     their own, so that nothing reaches the host: ivcuda-host in one (the group ivcuda, the unit known
#     but not enabled, ivcudad and ivcudactl in place; then removed and
#     purged), ivcuda-uio-dkms and ivcuda-guest in another (ivcuda-guest
#     conflicts with ivcuda-host): DKMS's common.postinst registers the
#     source and builds and installs ivcuda_uio.ko for the test guest's
#     kernel, warning-free; libc-bin's trigger puts the library in
#     ld.so.cache; the group ivcuda and the udev rule are there; removing
#     ivcuda-uio-dkms unregisters it;
#  3. the test guest gets ivcuda-guest's files as dpkg installed them, and
#     the module DKMS installed as the one its /init loads; ldconfig (what
#     the trigger runs) builds the guest's ld.so.cache;
#  4. ivcudad as dpkg installed it serves the guest (ivshmem-doorbell) with
#     the GPU test double standing in for the driver;
#  5. in the guest, with no LD_LIBRARY_PATH, the loader finds libcuda.so.1
#     in the package's directory only through ld.so.cache, and drv_core and
#     rt_basic_static (static cudart, which dlopens libcuda.so.1) pass, and
#     ivcuda-smi finds the package's libnvidia-ml.so.1 the same way.
#
# usage: vm_packages_test.sh BUILD_DIR WORK_DIR DRIVER_LIB VERSION HAVE_IVCUDACTL
#   VERSION         the project's version, which the packages must carry
#   HAVE_IVCUDACTL  1 when the build has ivcudactl (then ivcuda-host holds it)
# Exits 77 with the reason when a tool is missing (QEMU, the kernel packages,
# dkms, dpkg-dev, unshare) or the chroots cannot be made (they need root
# and overlayfs): CTest counts that as a failure unless the build was
# configured with IVCUDA_ALLOW_SKIPS.
set -euo pipefail

[[ $# -eq 5 ]] || { echo "usage: vm_packages_test.sh BUILD_DIR WORK_DIR DRIVER_LIB VERSION HAVE_IVCUDACTL" >&2; exit 2; }
build=$1 work=$2 driver=$3 version=$4 have_ctl=$5
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
guest=$repo/tools/guest
# shellcheck source=../lib/daemon.sh
. "$here/../lib/daemon.sh"
fail() { echo "FAIL: $*"; exit 1; }

missing=
m=$("$guest/build-guest-image.sh" --check) || missing+="$m"$'\n'
command -v dkms >/dev/null || missing+="dkms (apt-get install dkms)"$'\n'
for tool in dpkg-deb dpkg-shlibdeps; do
	command -v $tool >/dev/null || missing+="$tool (apt-get install dpkg-dev)"$'\n'
done
command -v cpack >/dev/null || missing+="cpack (apt-get install cmake)"$'\n'
for tool in unshare chroot; do
	command -v $tool >/dev/null || missing+="$tool (apt-get install util-linux coreutils)"$'\n'
done
[[ $(id -u) -eq 0 ]] || missing+="root: the packages are installed in overlay chroots"$'\n'
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
cleanup() {
	stop_ivcudad
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

# --- 2. installed by dpkg, maintainer scripts and all, in chroots --------------
# in_chroot NAME SCRIPT: runs SCRIPT (sh -e) as root in a chroot of this
# host's root file system under an overlay, in a private mount namespace:
# what dpkg and the maintainer scripts write lands in $tmp/NAME/upper,
# never on the host, and the mounts go with the namespace. /run is empty
# there (no systemd runs in a chroot: the scripts must cope), and the
# packages are in /root/debs; SCRIPT leaves what the later steps need in
# /root/out ($tmp/NAME/upper/root/out here).
in_chroot() {
	local name=$1 script=$2 d=$tmp/$1
	mkdir -p "$d/upper/root/debs" "$d/upper/root/out" "$d/work" "$d/root"
	cp "$host_deb" "$guest_deb" "$dkms_deb" "$d/upper/root/debs/"
	unshare --mount --propagation private -- /bin/sh -ec '
		mount -t overlay overlay -o "lowerdir=/,upperdir=$1/upper,workdir=$1/work" "$1/root"
		mount -t proc proc "$1/root/proc"
		mount --rbind /dev "$1/root/dev"
		mount --rbind /sys "$1/root/sys"
		mount -t tmpfs tmpfs "$1/root/run"
		mount -t tmpfs tmpfs "$1/root/tmp"
		exec chroot "$1/root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
			DEBIAN_FRONTEND=noninteractive /bin/sh -ec "$2"' sh "$d" "$script" >"$d.log" 2>&1 ||
		{ cat "$d.log"; fail "$name: the chroot failed (above)"; }
	cat "$d.log"
}
# dpkg, as apt runs it once it has the dependencies (apt itself takes 6-10 s
# a call here, dpkg under one): a dependency the host lacks fails the install
# by its name, and nothing is downloaded.
dpkg=dpkg
kver=$("$guest/build-guest-image.sh" --kver)
libdir=/usr/lib/x86_64-linux-gnu/ivcuda
src=/usr/src/ivcuda-uio-$version

# ivcuda-host: the group, the unit (known, not enabled: the configuration is
# to be reviewed first), the binaries; removal stops nothing that is not
# running, keeps the group, purge takes the configuration.
host_files=(/usr/sbin/ivcudad /usr/lib/systemd/system/ivcudad.service /etc/ivcuda/ivcudad.toml
	/usr/lib/sysusers.d/ivcuda-host.conf /usr/share/doc/ivcuda-host/copyright
	/usr/share/doc/ivcuda/ivcuda-shmem-doorbell.xml /usr/share/doc/ivcuda/libvirt.md)
[[ $have_ctl == 1 ]] && host_files+=(/usr/bin/ivcudactl)
in_chroot host "
	$dpkg -i /root/debs/$(basename "$host_deb")
	[ \"\$(dpkg-query -W -f='\${Status}' ivcuda-host)\" = 'install ok installed' ] || { echo 'host: ivcuda-host is not configured'; exit 1; }
	for f in ${host_files[*]}; do [ -f \$f ] || { echo \"host: ivcuda-host installed no \$f\"; exit 1; }; done
	gid=\$(getent group ivcuda | cut -d: -f3)
	[ -n \"\$gid\" ] && [ \"\$gid\" -lt 1000 ] || { echo 'host: no system group ivcuda'; exit 1; }
	echo \"host: the system group ivcuda (gid \$gid)\"
	state=\$(systemctl is-enabled ivcudad.service 2>&1 || true)
	[ \"\$state\" = disabled ] || { echo \"host: ivcudad.service is '\$state', not a disabled unit\"; exit 1; }
	systemd-analyze verify /usr/lib/systemd/system/ivcudad.service
	echo 'host: ivcudad.service is known to systemd, verifies, and is not enabled'
	cp /usr/sbin/ivcudad /root/out/
	[ ! -f /usr/bin/ivcudactl ] || cp /usr/bin/ivcudactl /root/out/
	$dpkg -r ivcuda-host
	[ ! -e /usr/sbin/ivcudad ] && [ ! -e /usr/lib/systemd/system/ivcudad.service ] && [ -f /etc/ivcuda/ivcudad.toml ] &&
		getent group ivcuda >/dev/null || { echo 'host: removal left the wrong things'; exit 1; }
	$dpkg -P ivcuda-host
	[ ! -e /etc/ivcuda/ivcudad.toml ] || { echo 'host: purge kept ivcudad.toml'; exit 1; }
	echo 'host: removed (the group stays, the configuration too), then purged'"

# ivcuda-uio-dkms and ivcuda-guest, as README's guest command installs them
# (its linux-headers-amd64 is the host's, for the test guest's kernel).
guest_files=("$libdir/libcuda.so.1" /etc/ld.so.conf.d/ivcuda.conf /usr/lib/udev/rules.d/99-ivcuda.rules
	/usr/lib/sysusers.d/ivcuda-guest.conf "$libdir/libnvidia-ml.so.1" /usr/bin/ivcuda-smi
	"$src/dkms.conf" "$src/ivcuda_uio.c" "$src/Kbuild" "$src/Makefile")
built=/var/lib/dkms/ivcuda-uio/$version/$kver/x86_64
in_chroot guest "
	$dpkg -i /root/debs/$(basename "$dkms_deb") /root/debs/$(basename "$guest_deb")
	for p in ivcuda-uio-dkms ivcuda-guest; do
		[ \"\$(dpkg-query -W -f='\${Status}' \$p)\" = 'install ok installed' ] || { echo \"guest: \$p is not configured\"; exit 1; }
	done
	for f in ${guest_files[*]}; do [ -f \$f ] || { echo \"guest: no \$f installed\"; exit 1; }; done
	grep -qx $libdir /etc/ld.so.conf.d/ivcuda.conf || { echo 'guest: ivcuda.conf does not name $libdir'; exit 1; }
	getent group ivcuda >/dev/null || { echo 'guest: no group ivcuda'; exit 1; }
	ldconfig -p | grep -F 'libcuda.so.1 (libc6,x86-64) => $libdir/libcuda.so.1' ||
		{ echo 'guest: the ldconfig trigger did not put libcuda.so.1 in ld.so.cache'; exit 1; }
	dkms status -m ivcuda-uio -v $version -k $kver | grep -q ': installed' ||
		{ echo 'guest: DKMS has no ivcuda-uio $version installed for $kver:'; dkms status; exit 1; }
	echo \"guest: DKMS: \$(dkms status -m ivcuda-uio -v $version -k $kver)\"
	cp $built/log/make.log /root/out/make.log
	ko=\$(find /lib/modules/$kver/updates/dkms -name 'ivcuda_uio.ko*' | head -n 1)
	[ -n \"\$ko\" ] || { echo 'guest: DKMS installed no ivcuda_uio.ko for $kver'; exit 1; }
	cp \$ko /root/out/
	# ivcuda-guest's files as installed, for the test guest's image.
	dpkg-query -L ivcuda-guest | while read -r f; do
		if [ -f \"\$f\" ] && [ ! -L \"\$f\" ]; then mkdir -p \"/root/out/guest\$(dirname \"\$f\")\"; cp \"\$f\" \"/root/out/guest\$f\"; fi
	done
	$dpkg -r ivcuda-uio-dkms
	! dkms status -m ivcuda-uio | grep -q . && [ -z \"\$(find /lib/modules/$kver -name 'ivcuda_uio.ko*')\" ] ||
		{ echo 'guest: removing ivcuda-uio-dkms left it registered or installed'; dkms status; exit 1; }
	echo 'guest: ivcuda-uio-dkms removed: DKMS forgot it, the module is gone'"
out=$tmp/guest/upper/root/out
host_out=$tmp/host/upper/root/out
if grep -i warning "$out/make.log" | grep -v 'Skipping BTF'; then
	fail "ivcuda_uio.c has compiler warnings in the DKMS build (above)"
fi
ko=$(find "$out" -maxdepth 1 -name 'ivcuda_uio.ko*' | head -n 1)
case $ko in  # busybox insmod reads only uncompressed modules
*.ko) ;;
*.ko.xz) xz -dc "$ko" >"$tmp/ivcuda_uio.ko"; ko=$tmp/ivcuda_uio.ko ;;
*.ko.zst) zstd -qdc "$ko" >"$tmp/ivcuda_uio.ko"; ko=$tmp/ivcuda_uio.ko ;;
*.ko.gz) gzip -dc "$ko" >"$tmp/ivcuda_uio.ko"; ko=$tmp/ivcuda_uio.ko ;;
esac
vermagic=$(modinfo -F vermagic "$ko")
[[ $vermagic == "$kver "* ]] || fail "the DKMS module is for '$vermagic', not $kver"
ko_sum=$(sha256sum "$ko" | cut -d ' ' -f 1)
echo "dkms: ivcuda-uio-dkms's postinst built and installed ivcuda_uio.ko for $kver"

# --- 3. the guest image with ivcuda-guest as dpkg installed it ------------------
adds=()
while IFS= read -r -d '' f; do
	adds+=(--add "$f:${f#"$out/guest"}")
done < <(find "$out/guest" -type f -print0)
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
LD_LIBRARY_PATH=$out/guest$libdir "$guest/build-guest-image.sh" "$work/image" "${adds[@]}" \
	--add-bin "$out/guest$libdir/libcuda.so.1:$libdir/libcuda.so.1" \
	--add-bin "$out/guest$libdir/libnvidia-ml.so.1:$libdir/libnvidia-ml.so.1" \
	--add-bin "$out/guest/usr/bin/ivcuda-smi:/usr/bin/ivcuda-smi" \
	--add-bin "$bin/drv_core:/usr/bin/drv_core" \
	--add-bin "$bin/rt_basic_static:/usr/bin/rt_basic_static"

# --- 4. ivcudad as ivcuda-host installed it ----------------------------------------
vectors=4
sock=$tmp/ivcudad.sock
ivcudad_bin=$host_out/ivcudad  # start_ivcudad's daemon: the packaged one
ivcudactl=$host_out/ivcudactl
# The control socket (ivcudactl's) goes here too, not to /run/ivcuda.
control=()
help=$("$ivcudad_bin" --help 2>&1) || true
if [[ $help == *--control-socket* ]]; then
	control=(--control-socket "$tmp/control.sock")
fi
start_ivcudad "$tmp/ivcudad.log" --socket "$sock" --vectors $vectors --shm-size 256M --channels 8 \
	--staging-size 4M --driver "$driver" "${control[@]}" || fail "the packaged ivcudad did not start"
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
kill -0 "$ivcudad_pid" || fail "the packaged ivcudad died"
[[ $rc -eq 0 ]] || fail "the guest failed (exit $rc)"
echo "PASS: ivcuda-host, ivcuda-guest and ivcuda-uio-dkms $version: CUDA programs in a QEMU guest found libcuda.so.1 through ld.so.cache"
