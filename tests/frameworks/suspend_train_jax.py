# JAX's counterpart of suspend_train.py for ivcudactl suspend on the GPU
# (tests/gpu/run_suspend_on_gpu.sh): a jitted MLP trained with plain gradient
# steps on fixed random data, one line per step ("step N loss X" to full
# precision), flushed, with a short pause per step so that a suspension lands
# mid-run, and device-resident ballast checked at the end. Run natively and
# through ivcuda with a suspension in the middle, the two lists of losses must
# be the same. Run it with XLA_PYTHON_CLIENT_PREALLOCATE=false: JAX would
# otherwise take 75% of the GPU, and the suspension would move all of it.
#   python suspend_train_jax.py [STEPS] [HIDDEN] [BALLAST_BYTES]
import os
import sys
import time

# The same kernels in both runs: no autotuning (whose timings could pick other algorithms)
# and deterministic reductions.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_gpu_autotune_level=0 --xla_gpu_deterministic_ops=true").strip()
import jax  # noqa: E402  (after XLA_FLAGS)
import jax.numpy as jnp  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
hidden = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
ballast_bytes = int(sys.argv[3]) if len(sys.argv) > 3 else 1 << 30
kx, ky, k1, k2, k3 = jax.random.split(jax.random.PRNGKey(1234), 5)
x = jax.random.normal(kx, (512, 1024))
y = jax.random.normal(ky, (512, 10))
params = [jax.random.normal(k1, (1024, hidden)) * 0.02, jax.random.normal(k2, (hidden, hidden)) * 0.02,
          jax.random.normal(k3, (hidden, 10)) * 0.02]


def loss_fn(p):
    h = jax.nn.relu(x @ p[0])
    h = jax.nn.relu(h @ p[1])
    return jnp.mean((h @ p[2] - y) ** 2)


@jax.jit
def step(p):
    loss, g = jax.value_and_grad(loss_fn)(p)
    return [w - 0.05 * gw for w, gw in zip(p, g)], loss


ballast = jnp.full((ballast_bytes,), 7, dtype=jnp.uint8)
for i in range(steps):
    params, loss = step(params)
    print(f"step {i} loss {float(loss):.10e}", flush=True)
    time.sleep(0.02)
assert bool(jnp.all(ballast == 7)), "ballast changed"
print("done", flush=True)
