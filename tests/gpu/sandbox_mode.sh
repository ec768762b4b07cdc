# Sourced by the GPU scripts that start ivcudad (tests/gpu/run_all.sh, and so
# every part it runs, and trace_worker_syscalls.sh). `--sandbox on`, ivcudad's
# default, serves only on a kernel with Landlock ABI 6 or later (Linux 6.12:
# signals and abstract sockets scoped to the worker; docs/security.md,
# "Sandbox"), and the GPU machine's kernel may be older. So this finds the
# kernel's Landlock ABI and, below 6, says so and exports IVCUDA_SANDBOX=degraded
# (ivcudad reads --sandbox from there), so that every ivcudad started after it
# serves with whatever Landlock there is, explicitly and logged as such.
# An IVCUDA_SANDBOX given by the caller is kept.
ivcuda_landlock_abi() {  # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION): x86_64 call 444
  python3 -c 'import ctypes; r = ctypes.CDLL(None, use_errno=True).syscall(444, None, 0, 1); print(max(r, 0))' \
    2>/dev/null || echo 0
}
ivcuda_abi=$(ivcuda_landlock_abi)
if [ -n "${IVCUDA_SANDBOX:-}" ]; then
  echo "== sandbox: IVCUDA_SANDBOX=$IVCUDA_SANDBOX as given (this kernel: Landlock ABI $ivcuda_abi)"
elif [ "$ivcuda_abi" -lt 6 ]; then
  export IVCUDA_SANDBOX=degraded
  echo "== sandbox: this kernel ($(uname -r)) has Landlock ABI $ivcuda_abi, below the 6 that --sandbox on needs:" \
    "every ivcudad here runs with --sandbox degraded (IVCUDA_SANDBOX=degraded)"
else
  echo "== sandbox: Landlock ABI $ivcuda_abi: ivcudad's default, --sandbox on"
fi
