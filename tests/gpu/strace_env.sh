# shellcheck shell=bash
# Sourced: defines strace_run, and strace_cmd (an array, for timeout and the
# like): the system's strace, or Debian's strace and libunwind8 .debs from
# .deps/ (tests/gpu/fetch-deps.sh downloads them) unpacked into /tmp. Needs
# $root (the repository). Returns 1 when neither is there.
: "${root:?strace_env.sh: \$root must name the repository}"
strace=$(command -v strace || true)
if [ -z "$strace" ]; then
  st=/tmp/ivcuda-strace
  rm -rf "$st" && mkdir -p "$st"
  for f in "$root"/.deps/strace_*.deb "$root"/.deps/libunwind8_*.deb; do
    [ -f "$f" ] || { echo "no strace here and no $f in .deps/ (tests/gpu/fetch-deps.sh)"; return 1; }
    dpkg -x "$f" "$st"
  done
  # strace's own libraries only: -E LD_LIBRARY_PATH keeps them from what it runs.
  strace_cmd=(env "LD_LIBRARY_PATH=$st/usr/lib/x86_64-linux-gnu" "$st/usr/bin/strace" -E LD_LIBRARY_PATH)
else
  strace_cmd=("$strace")
fi
strace_run() { "${strace_cmd[@]}" "$@"; }
strace_run -V | head -1
