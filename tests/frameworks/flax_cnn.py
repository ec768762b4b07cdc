"""Flax + optax: a small CNN trained with lax.scan under XLA's default autotuning (XLA times
cuDNN and cuBLAS candidates on streams it makes and destroys). Prints a coarse loss, so that
a different autotuning choice cannot change the output."""
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(32, (3, 3))(x))
        x = nn.avg_pool(x, (2, 2), (2, 2))
        x = nn.relu(nn.Conv(64, (3, 3))(x))
        x = nn.avg_pool(x, (2, 2), (2, 2))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(128)(x))
        return nn.Dense(10)(x)


key = jax.random.PRNGKey(0)
kx, ky, kp = jax.random.split(key, 3)
images = jax.random.normal(kx, (64, 28, 28, 1))
labels = jax.random.randint(ky, (64,), 0, 10)
model = CNN()
params = model.init(kp, images)
opt = optax.adam(1e-3)
state = opt.init(params)


def loss_fn(p):
    logits = model.apply(p, images)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


@jax.jit
def train(p, s):
    def step(carry, _):
        p, s = carry
        loss, g = jax.value_and_grad(loss_fn)(p)
        updates, s = opt.update(g, s, p)
        return (optax.apply_updates(p, updates), s), loss

    (p, s), losses = jax.lax.scan(step, (p, s), None, length=20)
    return p, s, losses


t0 = time.perf_counter()
first = None
for _ in range(5):
    params, state, losses = train(params, state)
    if first is None:
        first = float(losses[0])
last = float(losses[-1])
print(f"devices: {[d.platform for d in jax.devices()]}")
print(f"loss fell: {last < first}")
print(f"loss after 100 steps below 1.0: {last < 1.0}")
print(f"TIME {time.perf_counter() - t0:.4f}")
