"""The reference row for ``benchmarks.tpu``: the same GPT-2 shape trained in plain JAX, what a user
who leaves PyTorch for JAX gets on the same chip in the same run.

A decoder of ``layers`` blocks (pre-norm attention and MLP, tied input and output embeddings,
no biases, no dropout), bf16 matrix products over fp32 weights, cross-entropy on the next
token, and AdamW written out (the same hyperparameters as the PyTorch rows: lr 1e-4, betas 0.9
and 0.999, eps 1e-8, weight decay 0.01), all one jitted step with its buffers donated. Run on
the chip's own JAX (the TPU machine has one; tpunb's ``jax`` extra elsewhere).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

LR, BETAS, EPS, WEIGHT_DECAY = 1e-4, (0.9, 0.999), 1e-8, 0.01


@dataclass(frozen=True)
class Shape:
    layers: int = 6
    width: int = 768
    heads: int = 12
    vocab: int = 50257
    batch: int = 8
    sequence: int = 512

    @property
    def matmul_weights(self) -> int:
        """Weights used in matrix products per token: the blocks and the output projection."""
        return self.layers * 12 * self.width * self.width + self.vocab * self.width


def initial(shape: Shape, seed: int = 0) -> dict[str, Any]:
    """Weights drawn as GPT-2 draws them (normal, 0.02), norms at one."""
    import jax
    import jax.numpy as jnp

    keys = iter(jax.random.split(jax.random.PRNGKey(seed), 2 + 4 * shape.layers))
    d = shape.width

    def normal(size: tuple[int, ...]) -> Any:
        return jax.random.normal(next(keys), size, jnp.float32) * 0.02

    blocks = [
        {
            "norm_1": jnp.ones(d),
            "qkv": normal((d, 3 * d)),
            "projection": normal((d, d)),
            "norm_2": jnp.ones(d),
            "up": normal((d, 4 * d)),
            "down": normal((4 * d, d)),
        }
        for _ in range(shape.layers)
    ]
    return {
        "tokens": normal((shape.vocab, d)),
        "positions": normal((shape.sequence, d)),
        "norm": jnp.ones(d),
        "blocks": blocks,
    }


def loss_of(weights: dict[str, Any], ids: Any, shape: Shape) -> Any:
    """The mean next-token cross-entropy of ``ids`` (batch x sequence)."""
    import jax
    import jax.numpy as jnp

    def norm(x: Any, gain: Any) -> Any:
        x32 = x.astype(jnp.float32)
        mean = x32.mean(-1, keepdims=True)
        centred = x32 - mean
        return (centred * jax.lax.rsqrt((centred**2).mean(-1, keepdims=True) + 1e-5) * gain).astype(x.dtype)

    def low(w: Any) -> Any:
        return w.astype(jnp.bfloat16)

    b, t, h = shape.batch, shape.sequence, shape.heads
    x = (weights["tokens"][ids] + weights["positions"][None, :t]).astype(jnp.bfloat16)
    causal = jnp.tril(jnp.ones((t, t), bool))
    for block in weights["blocks"]:
        q, k, v = jnp.split(norm(x, block["norm_1"]) @ low(block["qkv"]), 3, axis=-1)
        q, k, v = (part.reshape(b, t, h, -1) for part in (q, k, v))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / (q.shape[-1] ** 0.5)
        attention = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), -1).astype(jnp.bfloat16)
        mixed = jnp.einsum("bhqk,bkhd->bqhd", attention, v).reshape(b, t, -1)
        x = x + mixed @ low(block["projection"])
        x = x + jax.nn.gelu(norm(x, block["norm_2"]) @ low(block["up"])) @ low(block["down"])
    logits = (norm(x, weights["norm"]) @ low(weights["tokens"]).T).astype(jnp.float32)
    chosen = jnp.take_along_axis(logits[:, :-1], ids[:, 1:, None], -1)[..., 0]
    return (jax.nn.logsumexp(logits[:, :-1], -1) - chosen).mean()


def training_step(shape: Shape) -> Any:
    """One jitted AdamW step: (weights, moments, step, ids) -> (weights, moments, step, loss)."""
    import jax
    import jax.numpy as jnp

    def step(weights: Any, moments: Any, count: Any, ids: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_of)(weights, ids, shape)
        count = count + 1
        first = jax.tree.map(lambda m, g: BETAS[0] * m + (1 - BETAS[0]) * g, moments[0], grads)
        second = jax.tree.map(lambda v, g: BETAS[1] * v + (1 - BETAS[1]) * g * g, moments[1], grads)
        correct_1, correct_2 = 1 - BETAS[0] ** count, 1 - BETAS[1] ** count

        def update(w: Any, m: Any, v: Any) -> Any:
            w = w * (1 - LR * WEIGHT_DECAY)
            return w - LR * (m / correct_1) / (jnp.sqrt(v / correct_2) + EPS)

        return jax.tree.map(update, weights, first, second), (first, second), count, loss

    return jax.jit(step, donate_argnums=(0, 1))


@dataclass
class Measured:
    first_s: float
    tokens_per_s: float
    losses: list[float]


def measure(shape: Shape, steps: int) -> Measured:
    """A first run of ``steps`` (with the compile), then a warm one, reading the loss each step as
    the PyTorch rows do."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    ids = jnp.asarray(np.random.default_rng(1).integers(0, shape.vocab, (shape.batch, shape.sequence)))
    weights = initial(shape)
    moments = (jax.tree.map(jnp.zeros_like, weights), jax.tree.map(jnp.zeros_like, weights))
    count = jnp.zeros((), jnp.int32)
    step = training_step(shape)
    losses: list[float] = []
    seconds = []
    for _ in range(2):
        started = time.perf_counter()
        for _ in range(steps):
            weights, moments, count, loss = step(weights, moments, count, ids)
            losses.append(float(loss))
        seconds.append(time.perf_counter() - started)
    return Measured(seconds[0], steps * shape.batch * shape.sequence / seconds[1], losses[:steps])
