"""JAX: jit + grad training loop of a linear model (default preallocation unless the caller
sets XLA_PYTHON_CLIENT_ALLOCATOR)."""
import time

import jax
import jax.numpy as jnp

print(f"devices: {[d.platform for d in jax.devices()]}")
key = jax.random.PRNGKey(0)
x = jax.random.normal(key, (512, 64))
true_w = jnp.arange(64, dtype=jnp.float32) / 64
y = x @ true_w


@jax.jit
def step(w):
    loss, g = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
    return w - 0.1 * g, loss


w = jnp.zeros(64)
t0 = time.perf_counter()
for _ in range(100):
    w, loss = step(w)
loss.block_until_ready()
print(f"loss after 100 steps: {float(loss):.4f}")
print(f"TIME {time.perf_counter() - t0:.4f}")
