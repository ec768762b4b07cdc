"""JAX under an ivcudad device-memory quota (--mem-limit, QUOTA_GIB): XLA
sizes its preallocated pool from the device's reported memory (75 % by
default), so it sizes itself to the quota; an array past its pool fails
cleanly and the process carries on."""
import os
import sys

import jax
import jax.numpy as jnp

GiB = 1 << 30
quota = int(os.environ.get("QUOTA_GIB", "20")) * GiB
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    failures += 0 if ok else 1


dev = jax.devices()[0]
stats = dev.memory_stats()
limit = stats.get("bytes_limit", 0)
print(f"jax: {dev.device_kind}, XLA pool limit {limit / GiB:.2f} GiB")
check(0.70 * quota <= limit <= 0.76 * quota, "XLA's pool is 75 % of the quota")
x = jnp.ones((4096, 4096), jnp.float32)
y = jax.jit(lambda m: (m @ m).sum())(x)
check(float(y) == 4096.0 ** 3, "a jitted matmul is correct")
try:
    big = jnp.ones((int(quota // 4),), jnp.float32)  # the whole quota, past the pool
    big.block_until_ready()
    check(False, "an array past the pool fails")
except Exception as e:  # XlaRuntimeError: RESOURCE_EXHAUSTED
    print(f"jax: refused: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    check("RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower(), "refused as out of memory")
z = jax.jit(lambda m: (m * 2).sum())(x)
check(float(z) == 2 * 4096.0 ** 2, "work after the refusal is correct")
print("quota_jax: %d failed" % failures)
sys.exit(1 if failures else 0)
