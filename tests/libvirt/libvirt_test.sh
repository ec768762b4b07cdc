#!/bin/bash
# ivcuda in a domain that a real libvirtd starts: the test guest
# (tools/guest/) boots under TCG with the shmem device of
# packaging/libvirt/ivcuda-shmem-MODE.xml, added with `virsh attach-device
# --config`, and runs driver-API programs through ivcuda's libcuda.so.1
# against ivcudad with the GPU test double.
#
# usage: libvirt_test.sh doorbell|plain IMAGE_DIR BUILD_DIR DRIVER_LIB
#
# libvirtd runs as a session daemon of an unprivileged user (nobody when the
# test runs as root), with its configuration, state, sockets and logs in a
# temporary folder: nothing under /etc/libvirt, /run/libvirt or
# /var/lib/libvirt is touched, no system service is needed, and QEMU runs as
# that user, so the daemon's socket (doorbell) or memory file (plain) must be
# opened to it as docs/libvirt.md tells operators to: --socket-group and
# --socket-mode for the socket, group and mode for the file. Everything started
# here is stopped on exit, by pid.
#
# Exits 77 with the reason when QEMU, the kernel packages or libvirt are
# missing: CTest counts that as a failure unless the build was configured
# with IVCUDA_ALLOW_SKIPS.
set -euo pipefail
# What this script writes is read by libvirtd and QEMU running as another user.
umask 022

mode=${1:-} image=${2:-} build=${3:-} driver=${4:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
guest=$repo/tools/guest
examples=$repo/packaging/libvirt
# shellcheck source=../lib/daemon.sh
. "$here/../lib/daemon.sh"

fail() { echo "FAIL: $*"; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }

[[ ($mode == doorbell || $mode == plain) && -n $driver ]] ||
	fail "usage: libvirt_test.sh doorbell|plain IMAGE_DIR BUILD_DIR DRIVER_LIB"
if ! missing=$("$guest/build-guest-image.sh" --check); then
	skip "the VM tests need: $missing"
fi
# libvirtd lives in /usr/sbin, which a non-root PATH may lack.
export PATH=$PATH:/usr/sbin:/sbin
libvirt_pkgs="apt-get install --no-install-recommends libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients"
command -v libvirtd >/dev/null || skip "libvirtd is not installed ($libvirt_pkgs)"
command -v virsh >/dev/null || skip "virsh is not installed ($libvirt_pkgs)"
qemu=$(command -v qemu-system-x86_64)

lib=$build/lib
bin=$build/tests/bin
kernels=$build/tests/gpu_double
for f in "$lib/libcuda.so.1" "$bin/drv_core" "$bin/drv_kernels" "$build/host-daemon/ivcudad" \
	"$kernels/test_kernels.ptx" "$kernels/test_kernels.fatbin" "$driver" \
	"$examples/ivcuda-shmem-$mode.xml"; do
	[[ -e $f ]] || fail "$f is missing (not built?)"
done

# Who runs libvirtd and QEMU.
if [[ $(id -u) -eq 0 ]]; then
	user=nobody
	id "$user" >/dev/null 2>&1 || fail "running as root, the test needs the user 'nobody' to run libvirtd as"
	group=$(id -gn "$user")
	as_user=(setpriv --reuid "$user" --regid "$group" --clear-groups)
else
	user=$(id -un) group=$(id -gn)
	as_user=()
fi

LD_LIBRARY_PATH=$lib "$guest/build-guest-image.sh" "$image" \
	--add-bin "$lib/libcuda.so.1:/opt/ivcuda/lib/libcuda.so.1" \
	--add-bin "$bin/drv_core:/usr/bin/drv_core" \
	--add-bin "$bin/drv_kernels:/usr/bin/drv_kernels" \
	--add "$kernels/test_kernels.ptx:/opt/ivcuda/test_kernels.ptx" \
	--add "$kernels/test_kernels.fatbin:/opt/ivcuda/test_kernels.fatbin"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ivcuda-libvirt.XXXXXX")
chmod 0755 "$tmp"
lv=$tmp/libvirt  # the session daemon's world, owned by $user
name=ivcuda-libvirt-test-$mode
shm_name=ivcuda-libvirt-test-$$
shm_file=
libvirtd_pid=''

# virsh and libvirtd as $user, seeing only the private folders. No autostart:
# a virsh that found no daemon must not spawn one that nobody stops.
lv_env=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C HOME="$lv/home" XDG_RUNTIME_DIR="$lv/run"
	XDG_CONFIG_HOME="$lv/config" XDG_CACHE_HOME="$lv/cache" LIBVIRT_AUTOSTART=0)
lv_virsh() { "${as_user[@]}" "${lv_env[@]}" virsh -q -c qemu:///session "$@"; }

cleanup() {
	set +e
	if [[ -n $libvirtd_pid ]]; then
		# The domain's QEMU is libvirtd's child, not ours: destroy it through
		# libvirt, and by its pid file if libvirt no longer answers.
		lv_virsh destroy "$name" >/dev/null 2>&1
		local qpid
		qpid=$(cat "$lv/run/libvirt/qemu/run/$name.pid" 2>/dev/null)
		[[ -n $qpid ]] && kill "$qpid" 2>/dev/null
		lv_virsh undefine "$name" >/dev/null 2>&1
		kill "$libvirtd_pid" 2>/dev/null
		wait "$libvirtd_pid" 2>/dev/null
	fi
	stop_ivcudad
	[[ -n $shm_file ]] && rm -f "$shm_file"
	rm -rf "$tmp"
}
trap cleanup EXIT
# A timeout or ^C: still clean up (bash runs no EXIT trap when a signal kills it).
trap 'exit 143' TERM INT

show_logs() {
	echo "--- guest console"
	cat "$lv/console.log" 2>/dev/null
	echo "--- libvirt's domain log (QEMU's command line and errors)"
	tail -n 40 "$lv/cache/libvirt/qemu/log/$name.log" 2>/dev/null
	echo "--- libvirtd (last lines)"
	tail -n 15 "$tmp/libvirtd.log" 2>/dev/null
	echo "--- ivcudad (last lines)"
	tail -n 15 "$tmp/ivcudad.log" 2>/dev/null
}

# ivcudad as it would run for libvirt's QEMU: its socket in a folder of its
# own, open to QEMU's group only.
mkdir -m 0755 "$tmp/ivcuda"
sock=$tmp/ivcuda/ivcudad.sock
vectors=4
shm_mib=256
# Listening, then the group and mode set: ready at the log line that follows both, or, with a
# plain file, at its worker's line, which comes after that.
plain=() ready=(--wait-log "listening on")
if [[ $mode == plain ]]; then
	[[ -d /dev/shm && -w /dev/shm ]] || skip "libvirt puts ivshmem-plain memory in /dev/shm, which is not writable here"
	shm_file=/dev/shm/$shm_name
	plain=(--plain-file "$shm_file")
	ready=(--wait-log "ivshmem-plain guest")
fi
start_ivcudad "${ready[@]}" "$tmp/ivcudad.log" --socket "$sock" --vectors $vectors --shm-size ${shm_mib}M --channels 8 \
	--staging-size 4M --driver "$driver" --socket-group "$group" --socket-mode 0660 "${plain[@]}" ||
	{ show_logs; fail "ivcudad did not start"; }
[[ $(stat -c '%G %a' "$sock") == "$group 660" ]] || fail "the socket is $(stat -c '%G %a' "$sock"), not $group 660"
if [[ $mode == plain ]]; then
	# ivcudad made the file 0600 for itself; QEMU opens it read-write as its
	# user. Give it the socket's group, as docs/libvirt.md says.
	chgrp "$group" "$shm_file"
	chmod 0660 "$shm_file"
fi

# The session daemon's folders, and the kernel and initramfs where its QEMU
# can read them whatever the build folder's permissions.
mkdir -p "$lv/home" "$lv/run" "$lv/config/libvirt" "$lv/cache"
# The domain's console and log files are written by libvirtd itself, not
# through a virtlogd it would otherwise spawn.
echo 'stdio_handler = "file"' >"$lv/config/libvirt/qemu.conf"
cp "$image/vmlinux" "$image/initramfs.cpio.gz" "$lv/"
chmod 0700 "$lv/run"
chown -R "$user:$group" "$lv"
"${as_user[@]}" test -w "$lv/run" -a -x "$tmp/ivcuda" ||
	fail "$user cannot reach $tmp (TMPDIR=${TMPDIR:-/tmp} must be searchable by $user)"

"${as_user[@]}" "${lv_env[@]}" libvirtd --timeout 600 >"$tmp/libvirtd.log" 2>&1 &
libvirtd_pid=$!
for _ in $(seq 200); do
	[[ -S $lv/run/libvirt/libvirt-sock ]] && break
	kill -0 "$libvirtd_pid" 2>/dev/null || break
	sleep 0.05
done
[[ -S $lv/run/libvirt/libvirt-sock ]] || { show_logs; fail "libvirtd did not start"; }
if ! err=$(lv_virsh uri 2>&1); then
	[[ $err == *"no connection driver available"* ]] &&
		skip "libvirt has no QEMU driver (apt-get install --no-install-recommends libvirt-daemon-driver-qemu)"
	show_logs
	fail "virsh cannot connect to the session libvirtd: $err"
fi

# The programs, as run-in-guest.sh passes them: base64 on the kernel command
# line, run by the guest's /init, which prints IVCUDA_GUEST_EXIT=<status> and
# powers off.
cmd="export LD_LIBRARY_PATH=/opt/ivcuda/lib &&
	drv_core &&
	drv_kernels --ptx /opt/ivcuda/test_kernels.ptx --fatbin /opt/ivcuda/test_kernels.fatbin"
cmd64=$(printf '%s\n' "$cmd" | base64 -w0)
cat >"$tmp/domain.xml" <<EOF
<domain type='qemu'>
  <name>$name</name>
  <memory unit='MiB'>512</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>$lv/vmlinux</kernel>
    <initrd>$lv/initramfs.cpio.gz</initrd>
    <cmdline>console=ttyS0 panic=-1 rdinit=/init quiet loglevel=3 IVCUDA_CMD=$cmd64</cmdline>
  </os>
  <cpu mode='maximum' check='none'/>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>$qemu</emulator>
    <serial type='file'>
      <source path='$lv/console.log'/>
      <target port='0'/>
    </serial>
    <memballoon model='none'/>
  </devices>
</domain>
EOF
lv_virsh define "$tmp/domain.xml" >/dev/null || { show_logs; fail "virsh define failed"; }

# The packaged device snippet, pointed at this test's daemon.
if [[ $mode == doorbell ]]; then
	sed -e "s#path='/run/ivcuda/ivcudad.sock'#path='$sock'#" -e "s#vectors='8'#vectors='$vectors'#" \
		"$examples/ivcuda-shmem-doorbell.xml" >"$tmp/device.xml"
	{ grep -q "path='$sock'" "$tmp/device.xml" && grep -q "vectors='$vectors'" "$tmp/device.xml"; } ||
		fail "ivcuda-shmem-doorbell.xml no longer has the socket path and vectors this test replaces"
else
	sed -e "s#name='ivcuda-vm1'#name='$shm_name'#" -e "s#<size unit='M'>1024</size>#<size unit='M'>$shm_mib</size>#" \
		"$examples/ivcuda-shmem-plain.xml" >"$tmp/device.xml"
	{ grep -q "name='$shm_name'" "$tmp/device.xml" && grep -q "<size unit='M'>$shm_mib</size>" "$tmp/device.xml"; } ||
		fail "ivcuda-shmem-plain.xml no longer has the name and size this test replaces"
fi
lv_virsh attach-device "$name" "$tmp/device.xml" --config >/dev/null ||
	{ show_logs; fail "virsh attach-device --config failed"; }

start=$(date +%s)
lv_virsh start "$name" >/dev/null || { show_logs; fail "virsh start failed"; }
# QEMU's command line as libvirt built it from the <shmem> element.
qlog=$lv/cache/libvirt/qemu/log/$name.log
if [[ $mode == doorbell ]]; then
	want=("\"driver\":\"ivshmem-doorbell\"" "\"vectors\":$vectors" "path=$sock")
else
	want=("\"driver\":\"ivshmem-plain\"" "\"mem-path\":\"/dev/shm/$shm_name\"" "\"share\":true"
		"\"size\":$((shm_mib << 20))")
fi
for w in "${want[@]}"; do
	grep -qF -- "$w" "$qlog" || { show_logs; fail "QEMU's command line lacks $w"; }
done

state=
for _ in $(seq 300); do  # 150 s
	state=$(lv_virsh domstate "$name" 2>/dev/null || true)
	[[ $state == "shut off" ]] && break
	sleep 0.5
done
elapsed=$(($(date +%s) - start))
show_logs
[[ $state == "shut off" ]] || fail "the domain still runs after ${elapsed}s (state: $state)"
status=$(grep -a -o 'IVCUDA_GUEST_EXIT=[0-9]*' "$lv/console.log" | tail -n 1 || true)
[[ -n $status ]] || fail "the guest reported no status"
[[ $status == IVCUDA_GUEST_EXIT=0 ]] || fail "the guest programs failed ($status)"
for p in drv_core drv_kernels; do
	grep -aq "^$p: [0-9]* checks, 0 failed" "$lv/console.log" || fail "no passing $p line on the console"
done
kill -0 "$ivcudad_pid" 2>/dev/null || fail "ivcudad died"
echo "PASS: driver-API programs in a libvirt domain through ivshmem-$mode (${elapsed}s from virsh start)"
