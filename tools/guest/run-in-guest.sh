#!/bin/bash
# Boots the test guest (build-guest-image.sh) under stock QEMU, runs one
# command inside it, and exits with that command's exit status.
#
# usage: run-in-guest.sh --image DIR [options] [--] COMMAND [ARG]...
#
#   --image DIR        the build-guest-image.sh OUTDIR (default: $IVCUDA_GUEST_IMAGE)
#   --shm-file PATH    add an ivshmem-plain device backed by PATH (share=on), e.g.
#                      /dev/shm/NAME; PATH is created when missing
#   --shm-size SIZE    its size in bytes, a power of two (default: PATH's size,
#                      or 4194304 when PATH is new or empty)
#   --socket PATH      add an ivshmem-doorbell device connected to the ivshmem
#                      server listening on PATH (it must already listen)
#   --vectors N        MSI-X vectors of the doorbell device (default 1)
#   --timeout SEC      kill QEMU after SEC seconds (default 60); exit status 124
#   --mem SIZE         guest memory, QEMU syntax (default 512M)
#   --smp N            guest CPUs (default 1)
#   --accel A          auto (default), kvm or tcg. auto picks kvm only when
#                      /dev/kvm opens, QEMU starts with it, and this machine is
#                      not itself a VM (nested KVM crashes the 6.1 guest on the
#                      GPU machines: see README.md); IVCUDA_GUEST_ACCEL sets the default
#                      (IVCUDA_GUEST_CPU sets the CPU model, default max
#                      under TCG and host under KVM)
#   --accel-opts OPTS  appended to -accel, e.g. kernel-irqchip=split
#   --qemu-args ARGS   more QEMU arguments, split at spaces (the KVM
#                      configuration tests/gpu/kvm_probe.sh found, for one)
#   --log FILE         also write the guest console to FILE (it always streams
#                      to stderr)
#   --verbose          show the guest kernel's boot messages
#   --append ARGS      extra kernel command-line arguments
#
# With one argument, COMMAND is a shell command line run by the guest's
# busybox sh; with several, they are quoted and run as one command. The command
# travels on the kernel command line (2048 bytes in all on x86): put longer
# scripts into the image with build-guest-image.sh --add.
#
# Exit status: the command's (0-255); 124 when the timeout killed QEMU;
# 125 when the guest or QEMU failed before the command reported a status.
set -euo pipefail

die() { echo "run-in-guest: $*" >&2; exit 125; }

image=${IVCUDA_GUEST_IMAGE:-}
shm_file='' shm_size='' socket='' vectors=1 timeout=60 mem=512M smp=1
accel=${IVCUDA_GUEST_ACCEL:-auto} log='' verbose=0 append='' accel_opts='' qemu_args=''
while [[ $# -gt 0 ]]; do
	case $1 in
	--verbose | --) ;;
	--*) [[ $# -ge 2 ]] || die "$1 needs a value" ;;
	esac
	case $1 in
	--image) image=$2; shift 2 ;;
	--shm-file) shm_file=$2; shift 2 ;;
	--shm-size) shm_size=$2; shift 2 ;;
	--socket) socket=$2; shift 2 ;;
	--vectors) vectors=$2; shift 2 ;;
	--timeout) timeout=$2; shift 2 ;;
	--mem) mem=$2; shift 2 ;;
	--smp) smp=$2; shift 2 ;;
	--accel) accel=$2; shift 2 ;;
	--log) log=$2; shift 2 ;;
	--verbose) verbose=1; shift ;;
	--append) append=$2; shift 2 ;;
	--accel-opts) accel_opts=$2; shift 2 ;;
	--qemu-args) qemu_args=$2; shift 2 ;;
	--) shift; break ;;
	-*) die "unknown option: $1" ;;
	*) break ;;
	esac
done
[[ $# -ge 1 ]] || die "no command given"
[[ -n $image ]] || die "--image DIR (or IVCUDA_GUEST_IMAGE) is required"
[[ -s $image/vmlinux && -s $image/initramfs.cpio.gz ]] ||
	die "$image holds no guest image: run tools/guest/build-guest-image.sh $image"
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 is not installed"
if ! [[ $vectors =~ ^[0-9]+$ ]] || ((vectors < 1 || vectors > 64)); then
	die "--vectors must be 1..64"
fi
if ! [[ $timeout =~ ^[0-9]+$ ]] || ((timeout < 1)); then
	die "--timeout must be a positive number of seconds"
fi

# The command, quoted for the guest's sh when it comes as several words.
if [[ $# -eq 1 ]]; then
	cmd=$1
else
	cmd=
	for w in "$@"; do
		cmd+="'${w//\'/\'\\\'\'}' "
	done
fi
cmd64=$(printf '%s\n' "$cmd" | base64 -w0)

is_pow2() { [[ $1 =~ ^[0-9]+$ ]] && (($1 > 0 && ($1 & ($1 - 1)) == 0)); }

qemu_accel() {
	case $accel in
	tcg | kvm) echo "$accel"; return ;;
	auto) ;;
	*) die "--accel must be auto, kvm or tcg" ;;
	esac
	if [[ -r /dev/kvm && -w /dev/kvm ]] && ! grep -qw hypervisor /proc/cpuinfo &&
		echo quit | timeout 10 qemu-system-x86_64 -machine none,accel=kvm -nodefaults \
			-display none -monitor stdio >/dev/null 2>&1; then
		echo kvm
	else
		echo tcg
	fi
}
acc=$(qemu_accel)
if [[ $acc == kvm ]]; then cpu=${IVCUDA_GUEST_CPU:-host}; else cpu=${IVCUDA_GUEST_CPU:-max}; fi

args=(
	-machine q35 -accel "$acc${accel_opts:+,$accel_opts}" -cpu "$cpu" -smp "$smp" -m "$mem"
	-nodefaults -no-user-config -display none -no-reboot
	-chardev "stdio,id=con,signal=off"
	-serial chardev:con -monitor none
	-device 'isa-debug-exit,iobase=0xf4,iosize=0x04'
	-kernel "$image/vmlinux" -initrd "$image/initramfs.cpio.gz"
)
if [[ -n $qemu_args ]]; then
	read -ra more <<<"$qemu_args"
	args+=("${more[@]}")
fi

if [[ -n $shm_file ]]; then
	if [[ -z $shm_size ]]; then
		shm_size=$(stat -c %s "$shm_file" 2>/dev/null || echo 0)
		((shm_size > 0)) || shm_size=4194304
	fi
	is_pow2 "$shm_size" || die "--shm-size must be a power of two (ivshmem's BAR2), got $shm_size"
	args+=(-object "memory-backend-file,id=ivshm,share=on,mem-path=$shm_file,size=$shm_size"
		-device 'ivshmem-plain,memdev=ivshm')
fi
if [[ -n $socket ]]; then
	[[ -S $socket ]] || die "no ivshmem server socket at $socket"
	args+=(-chardev "socket,path=$socket,id=ivsock"
		-device "ivshmem-doorbell,chardev=ivsock,vectors=$vectors")
fi

kargs="console=ttyS0 panic=-1 rdinit=/init"
((verbose)) || kargs+=" quiet loglevel=3"
kargs+=" $append IVCUDA_CMD=$cmd64"
((${#kargs} < 2000)) || die "command too long for the kernel command line (${#kargs} bytes): add a script with build-guest-image.sh --add"
args+=(-append "$kargs")

tmplog=$(mktemp "${TMPDIR:-/tmp}/ivcuda-guest.XXXXXX.log")
trap 'rm -f "$tmplog"' EXIT
start=$(date +%s.%N)
set +e
# The console goes to stderr and, through tee, to the log we parse. tee keeps
# going when QEMU is killed, so the timeout status below is QEMU's.
timeout -k 5 "$timeout" qemu-system-x86_64 "${args[@]}" </dev/null 2>&1 | tee "$tmplog" >&2
rc=${PIPESTATUS[0]}
set -e
end=$(date +%s.%N)
[[ -n $log ]] && cp "$tmplog" "$log"

# The console line carries the whole status; QEMU's exit code only 7 bits of it.
line=$(grep -a -o 'IVCUDA_GUEST_EXIT=[0-9]*' "$tmplog" | tail -n 1 || true)
elapsed=$(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.1f", e - s }')
if ((rc == 124 || rc == 137)); then
	echo "run-in-guest: timed out after ${timeout}s (accel $acc)" >&2
	exit 124
fi
if [[ -n $line ]]; then
	status=${line#IVCUDA_GUEST_EXIT=}
	echo "run-in-guest: guest command exited with $status after ${elapsed}s (accel $acc)" >&2
	exit "$status"
fi
if ((rc & 1)); then
	echo "run-in-guest: guest reported $((rc >> 1)) through isa-debug-exit after ${elapsed}s" >&2
	exit $((rc >> 1))
fi
echo "run-in-guest: the guest ended without reporting a status (QEMU exit $rc) after ${elapsed}s" >&2
exit 125
