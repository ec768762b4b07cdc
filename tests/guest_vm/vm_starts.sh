#!/bin/bash
# A VM's processes' start-up as the host serves it (issue 30, "for a VM's
# processes"): a stock QEMU guest starts a small CUDA program (ivcuda-bench
# --child startup: cuInit, the primary context, a 4-byte round trip) in the
# issue's arrival patterns - 20 back to back, a burst of 8, 64 spread over
# 10 s - one fresh VM per pattern on a daemon with its default settings, and
# the supervisor's log gives each process's wait from its first claim to a
# worker that serves it ("waited N ms for its worker": note_waits in
# host-daemon/daemon/vm_supervisor.cc), with what served it: a recycled
# spare (--recycle-workers, the default keep), a spare started ahead, or a
# worker started for it.
#
# What the wait stands for: a process's start in a VM is the guest's own
# process start, the same as natively but for the driver's, plus this wait
# and one hello round trip; natively the driver's start is cuInit and the
# context, measured here too (the same program on this host, the driver as
# its own libcuda.so.1, each run from fork to exit; the whole program, so an
# upper bound of the driver's share). Under TCG the guest's own part runs on
# an emulated CPU and is not reported; the wait is the host's. Under TCG a
# guest's processes also come slower than under KVM (each one's own start
# takes the emulated CPU a while), which leaves the host more time between
# them: a burst's waits here are a lower bound of what KVM's would be.
#
# Not a CI test (three guest boots and 92 programs): a measurement, with the
# GPU test double on a CPU machine (figures of the transport only) or with the
# real driver on the GPU machine (tests/gpu/run_all.sh vm-starts).
#
# usage: vm_starts.sh IMAGE_DIR BUILD_DIR DRIVER_LIB [--quick]
#   IMAGE_DIR   where the guest image is made (IVCUDA_VM_IMAGE_BUNDLE=DIR:
#               completed from the image carried in DIR, as on the GPU machine)
#   DRIVER_LIB  libcuda.so.1 (the real driver) or the GPU double's library
#   --quick     5 back to back, a burst of 4, 8 spread over 2 s
# IVCUDA_GUEST_ACCEL=tcg keeps QEMU off a /dev/kvm that cannot run a guest.
# Prints a table and writes it as JSON to $OUT/vm-starts.json (OUT default
# /tmp). Exits non-zero when a program failed in the guest or a process's
# wait is missing from the log.
set -euo pipefail

image=$1 build=$2 driver=$3
quick=${4:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
guest=$(cd "$here/../../tools/guest" && pwd)
# shellcheck source=../lib/daemon.sh
. "$here/../lib/daemon.sh"
out=${OUT:-/tmp}
mkdir -p "$out"

if [[ -z ${IVCUDA_VM_IMAGE_BUNDLE:-} ]] && ! missing=$("$guest/build-guest-image.sh" --check); then
	echo "SKIP: the VM needs:"
	echo "$missing"
	exit 77
fi
lib=$build/lib
bench=$build/bench/ivcuda-bench
for f in "$lib/libcuda.so.1" "$bench"; do
	[[ -e $f ]] || { echo "FAIL: $f is not built"; exit 1; }
done
adds=(--add-bin "$lib/libcuda.so.1:/opt/ivcuda/lib/libcuda.so.1" --add-bin "$bench:/usr/bin/ivcuda-bench")
# ldd must find ivcuda's libcuda.so.1 for the program, never a driver's.
if [[ -n ${IVCUDA_VM_IMAGE_BUNDLE:-} ]]; then
	LD_LIBRARY_PATH=$lib "$guest/bundle-image.sh" unpack "$IVCUDA_VM_IMAGE_BUNDLE" "$image" "${adds[@]}" >/dev/null
else
	LD_LIBRARY_PATH=$lib "$guest/build-guest-image.sh" "$image" "${adds[@]}" >/dev/null
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ivcuda-vm-starts.XXXXXX")
cleanup() {
	stop_ivcudad
	rm -rf "$tmp"
}
trap cleanup EXIT

if [[ $quick == --quick ]]; then
	b2b=5 burst=4 spread=8 spread_s=2
else
	b2b=20 burst=8 spread=64 spread_s=10
fi
# The guest's part of each pattern (busybox sh). s: one start, its failure noted.
start='s() { ivcuda-bench --child startup >/dev/null 2>&1 || echo START_FAILED; }'
gap_ms=$((spread_s * 1000 / spread))
gap=$(printf '%d.%03d' $((gap_ms / 1000)) $((gap_ms % 1000)))
declare -A cmd=(
	[b2b]="i=0; while [ \$i -lt $b2b ]; do s; i=\$((i + 1)); done"
	[burst]="i=0; while [ \$i -lt $burst ]; do s & i=\$((i + 1)); done; wait"
	[spread]="i=0; while [ \$i -lt $spread ]; do s & sleep $gap; i=\$((i + 1)); done; wait"
)
declare -A count=([b2b]=$b2b [burst]=$burst [spread]=$spread)
# ivcudad's defaults, but for the spread: under TCG each program takes the emulated CPU seconds,
# so 64 started over 10 s overlap far more than they would under KVM or natively (where each is
# done in a fraction of a second), past the default bounds on a VM's workers, which then refuse
# the processes beyond them. The bounds are raised there, and the table says so.
declare -A opts=([b2b]="" [burst]="" [spread]="--max-workers-per-guest 72 --max-guests-per-uid 0")
declare -A label=([b2b]="$b2b back to back" [burst]="a burst of $burst" [spread]="$spread over $spread_s s")

# stats FILE: "median p90 max" of the numbers in FILE, one per line.
stats() {
	sort -n "$1" | awk '{a[NR] = $1} END {
		if (NR == 0) { print "- - -"; exit }
		m = a[int((NR + 1) / 2)]; p = a[int(NR * 0.9 + 0.999)]; if (p == "") p = a[NR]
		printf "%.1f %.1f %.1f\n", m, p, a[NR] }'
}

# The reference: the same program on this host with the driver as its own
# libcuda.so.1, 20 times one after another, each from fork to exit.
mkdir -p "$tmp/native"
if [[ $driver == */* ]]; then ln -s "$(readlink -f "$driver")" "$tmp/native/libcuda.so.1"; fi
: >"$tmp/native.ms"
for _ in $(seq 20); do
	t0=$(date +%s%N)
	LD_LIBRARY_PATH=$tmp/native${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$bench" --child startup >/dev/null ||
		{ echo "FAIL: the program natively"; exit 1; }
	echo $((($(date +%s%N) - t0) / 1000)) | awk '{printf "%.1f\n", $1 / 1000}' >>"$tmp/native.ms"
done
read -r n_med n_p90 n_max < <(stats "$tmp/native.ms")

fail=0
rows=()
json="{\"native_whole_program_ms\": {\"median\": $n_med, \"p90\": $n_p90, \"max\": $n_max}, \"driver\": \"$driver\", \"patterns\": {"
for p in b2b burst spread; do
	log=$tmp/ivcudad-$p.log
	sock=$tmp/ivcudad-$p.sock
	# shellcheck disable=SC2086 # one word per option
	IVCUDA_DOUBLE_LEDGER=$tmp/ledger start_ivcudad "$log" --socket "$sock" --vectors 4 --driver "$driver" ${opts[$p]} ||
		{ echo "FAIL: ivcudad did not start"; exit 1; }
	rc=0
	"$guest/run-in-guest.sh" --image "$image" --socket "$sock" --vectors 4 --timeout 300 \
		"export LD_LIBRARY_PATH=/opt/ivcuda/lib; $start; ${cmd[$p]}; echo PATTERN_DONE" >"$tmp/guest-$p.out" 2>&1 || rc=$?
	stop_ivcudad
	cp "$log" "$out/vm-starts-$p.log"
	grep -oE "waited [0-9.]+ ms for its worker pid [0-9]+ \([a-z ]+\)" "$log" >"$tmp/$p.waits" || true
	sed -E 's/waited ([0-9.]+) ms.*/\1/' "$tmp/$p.waits" >"$tmp/$p.ms"
	n=$(wc -l <"$tmp/$p.ms")
	recycled=$(grep -c "(a recycled spare)" "$tmp/$p.waits" || true)
	ahead=$(grep -c "(a spare started ahead)" "$tmp/$p.waits" || true)
	fresh=$(grep -c "(a worker started for it)" "$tmp/$p.waits" || true)
	read -r med p90 max < <(stats "$tmp/$p.ms")
	failed=$(grep -c START_FAILED "$tmp/guest-$p.out" || true)
	[[ $rc -eq 0 ]] && grep -q PATTERN_DONE "$tmp/guest-$p.out" || { echo "FAIL: $p: the guest exited $rc"; tail -5 "$tmp/guest-$p.out"; fail=1; }
	[[ $failed -eq 0 ]] || { echo "FAIL: $p: $failed start(s) failed in the guest"; fail=1; }
	[[ $n -eq ${count[$p]} ]] || { echo "FAIL: $p: $n waits in the daemon's log for ${count[$p]} processes"; fail=1; }
	rows+=("$(printf '| %-16s | %6s / %6s / %6s | %3s recycled, %3s ahead, %3s new | %s' "${label[$p]}" "$med" "$p90" \
		"$max" "$recycled" "$ahead" "$fresh" "${opts[$p]:-defaults}")")
	json+="\"$p\": {\"processes\": ${count[$p]}, \"wait_ms\": {\"median\": $med, \"p90\": $p90, \"max\": $max}, "
	json+="\"recycled\": $recycled, \"started_ahead\": $ahead, \"started_for_it\": $fresh, \"failed\": $failed, "
	json+="\"ivcudad_options\": \"${opts[$p]}\"}"
	[[ $p == spread ]] || json+=", "
done
json+="}}"
echo "$json" >"$out/vm-starts.json"

echo "A VM's processes' starts, the host's part: the wait from a process's first claim to its worker (ms)"
echo "(native, for scale: the whole program from fork to exit on this host, driver as its own libcuda.so.1:"
echo " median $n_med, p90 $n_p90, max $n_max ms; driver $driver)"
echo "| pattern          | wait median / p90 / max  | what served the processes        | ivcudad"
echo "|------------------|--------------------------|----------------------------------|--------"
printf '%s\n' "${rows[@]}"
echo "JSON: $out/vm-starts.json"
exit $fail
