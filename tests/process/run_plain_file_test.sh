#!/usr/bin/env bash
# --plain-file against a local user who prepares the path before ivcudad
# starts (docs/security.md, rule `plain-file-exclusive`; host-daemon/daemon/plain_file.h):
# a symbolic link, a file of their own, a file ivcudad did not make, a
# directory others may write or own are all refused, and nothing at the path
# is touched; a fresh path is made exclusively (in a sticky directory like
# /dev/shm too), given --socket-group with mode 0660, and served; a restarted
# daemon serves the file it made again.
#   run_plain_file_test.sh BUILD_DIR DRIVER_LIB
set -u
build=$(cd "$1" && pwd)
driver=$2
# shellcheck source=../lib/verdicts.sh
. "$(dirname "$0")/../lib/verdicts.sh"
# shellcheck source=../lib/daemon.sh
. "$(dirname "$0")/../lib/daemon.sh"
# The cases, in the order they run below.
cases=("a symbolic link" "a file another user made" "a file ivcudad did not make"
  "a directory others may write" "a directory another user owns" "a fresh file"
  "a fresh file in a sticky directory" "/dev/shm" "a restart")
expect_cases ${#cases[@]}
work=$(mktemp -d /tmp/ivcuda-plain.XXXXXX)
chmod 755 "$work"
shm_file=/dev/shm/ivcuda-plain-test-$$
cleanup() {
  stop_ivcudad
  rm -rf "$work"
  rm -f "$shm_file"
}
trap cleanup EXIT

if [ "$(id -u)" -ne 0 ] || ! command -v setpriv >/dev/null; then
  for c in "${cases[@]}"; do
    not_run "--plain-file: $c" "needs root (the daemon's user) and setpriv (the local user)"
  done
  finish
  exit
fi
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
group=$(id -gn nobody)
gid=$(id -g nobody)

sticky=$work/sticky && mkdir "$sticky" && chmod 1777 "$sticky"  # what /dev/shm is
open=$work/open && mkdir "$open" && chmod 0777 "$open"          # the same without the sticky bit
theirs=$work/theirs && mkdir "$theirs" && chown nobody "$theirs" && chmod 0755 "$theirs"
safe=$work/safe && mkdir "$safe" && chmod 0755 "$safe"

# serve LOG FILE [OPTIONS]: starts ivcudad on one plain file. 0 while it
# serves, 1 when it stopped instead (a refusal: what most cases want).
serve() {
  local log=$1 file=$2
  shift 2
  start_ivcudad --may-stop --wait-log "ivshmem-plain guest .* worker pid" "$log" --socket "$work/d.sock" \
    --control-socket none --shm-size 64M --channels 4 --staging-size 1M --warm-workers 0 --driver "$driver" \
    --plain-file "$file" "$@"
  [ $? -ne 1 ]  # 2, neither served nor stopped in time (said, with the log), is no refusal
}
# refused NAME LOG FILE WHY: the daemon did not serve FILE and said WHY.
refused() {
  local ok=0
  if serve "$2" "$3"; then ok=1; echo "it served $3"; stop_ivcudad; fi
  grep -q "refused: $4" "$2" || { ok=1; echo "no 'refused: $4' in the log:"; cat "$2"; }
  return $ok
}
fingerprint() { stat -c '%u %s %a %h %i' "$1" 2>/dev/null && md5sum <"$1" 2>/dev/null; }

# A link to a file root owns (fs.protected_symlinks=0, as here, lets root follow it).
printf 'a file only root writes\n' >"$work/target" && chmod 600 "$work/target"
before=$(fingerprint "$work/target")
as_nobody ln -s "$work/target" "$sticky/vm-link"
refused "link" "$work/link.log" "$sticky/vm-link" "it is a symbolic link"
rc=$?
[ "$(fingerprint "$work/target")" = "$before" ] || { rc=1; echo "the link's target changed: $(ls -l "$work/target")"; }
verdict "--plain-file: a symbolic link is refused and what it points to is untouched" $rc

# A file of the user's own: they would read and write the VM's BAR.
as_nobody sh -c "umask 077; : >'$sticky/vm-pre'"
before=$(fingerprint "$sticky/vm-pre")
refused "pre" "$work/pre.log" "$sticky/vm-pre" "it exists and belongs to uid 65534"
rc=$?
[ "$(fingerprint "$sticky/vm-pre")" = "$before" ] || { rc=1; echo "the user's file changed: $(ls -l "$sticky/vm-pre")"; }
verdict "--plain-file: a file another user made is refused and left as it was" $rc

# Root's file, but not one ivcudad made (a typo in the path, another program's file).
printf 'not a BAR\n' >"$safe/notours" && chmod 600 "$safe/notours"
before=$(fingerprint "$safe/notours")
refused "notours" "$work/notours.log" "$safe/notours" "it exists and is no memory file ivcudad made"
rc=$?
[ "$(fingerprint "$safe/notours")" = "$before" ] || { rc=1; echo "the file changed: $(ls -l "$safe/notours")"; }
verdict "--plain-file: a file ivcudad did not make is refused and left as it was" $rc

refused "open" "$work/open.log" "$open/vm" "$open/ may be written by others"
rc=$?
[ ! -e "$open/vm" ] || { rc=1; echo "$open/vm was made"; }
verdict "--plain-file: a directory others may write (no sticky bit) is refused" $rc

refused "theirs" "$work/theirs.log" "$theirs/vm" "$theirs/ belongs to uid 65534"
rc=$?
[ ! -e "$theirs/vm" ] || { rc=1; echo "$theirs/vm was made"; }
verdict "--plain-file: a directory another user owns is refused" $rc

# fresh FILE NAME: served, made by root with the socket group and 0660, formatted.
fresh() {
  local ok=0
  serve "$work/$2.log" "$1" --socket-group "$group" || { ok=1; cat "$work/$2.log"; }
  [ "$(stat -c '%u %g %a %h' "$1" 2>/dev/null)" = "0 $gid 660 1" ] || { ok=1; echo "$1: $(ls -ln "$1")"; }
  [ "$(head -c 6 "$1" 2>/dev/null)" = "IVCUDA" ] || { ok=1; echo "$1 is not formatted"; }
  grep -q "ivshmem-plain file $1: made (O_EXCL)" "$work/$2.log" || { ok=1; grep plain "$work/$2.log"; }
  return $ok
}
fresh "$safe/vm1" fresh
verdict "--plain-file: a fresh file is made exclusively, root's, --socket-group and 0660, and served" $?
inode=$(stat -c %i "$safe/vm1")
stop_ivcudad

fresh "$sticky/vm2" sticky
verdict "--plain-file: a fresh file in a sticky world-writable directory (what /dev/shm is) is served" $?
stop_ivcudad

if [ -d /dev/shm ] && [ -w /dev/shm ]; then
  fresh "$shm_file" shm
  verdict "--plain-file: /dev/shm/NAME (libvirt's path) is made and served" $?
  stop_ivcudad
else
  not_run "--plain-file: /dev/shm/NAME (libvirt's path) is made and served" "no writable /dev/shm here"
fi

# A restart while QEMU would still map the file: the same file, served again.
ok=0
serve "$work/again.log" "$safe/vm1" --socket-group "$group" || { ok=1; cat "$work/again.log"; }
grep -q "ivshmem-plain file $safe/vm1: an ivcudad's earlier file, served again" "$work/again.log" || ok=1
[ "$(stat -c %i "$safe/vm1")" = "$inode" ] || { ok=1; echo "a new file was made"; }
stop_ivcudad
verdict "--plain-file: a restarted daemon serves the file it made again" $ok

finish
