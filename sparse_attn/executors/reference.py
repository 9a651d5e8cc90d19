"""The oracle: dense masked softmax attention over the pattern's `to_dense()` mask."""

from __future__ import annotations

import jax.numpy as jnp

from sparse_attn.executors import registry
from sparse_attn.executors.softmax import apply_score_fn, masked_softmax, sanitize, zero_empty_rows
from sparse_attn.patterns.dense_bias import DenseBias
from sparse_attn.patterns.intervals import Intervals


def reference_attention(q_BxNxHxD, k_BxMxGxD, v_BxMxGxD, pattern, scale: float, score_fn=None):
    """Returns (out[B, N, H, D], lse[B, N, H]); O(N M) memory, for tests and small problems.

    Runs any pattern with `to_dense()`; a pattern with `dense_bias()` (additive logit bias, -inf where masked,
    e.g. `NeighbourList`) is run with that bias instead, added after `score_fn` (`softmax.apply_score_fn`).

    Non-finite values reach only the rows that may attend them (`softmax.sanitize`; docs/architecture.md).
    """
    b, n, h, d = q_BxNxHxD.shape
    g, m = k_BxMxGxD.shape[2], k_BxMxGxD.shape[1]
    q, poison_q_BxNxH = sanitize(q_BxNxHxD)
    k, v, poison_kv_BxNxG = sanitize(k_BxMxGxD, v_BxMxGxD)
    k = jnp.repeat(k, h // g, axis=2)
    v = jnp.repeat(v, h // g, axis=2)
    poison_kv = jnp.repeat(poison_kv_BxNxG, h // g, axis=2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) * scale
    idx = lambda size, axis: jnp.arange(size, dtype=jnp.int32).reshape([-1 if i == axis else 1 for i in range(4)])  # noqa: E731
    s = apply_score_fn(score_fn, s, idx(b, 0), idx(h, 1), idx(n, 2), idx(m, 3), n, m)
    s = s + jnp.swapaxes(poison_q_BxNxH, 1, 2)[..., None] + jnp.swapaxes(poison_kv, 1, 2)[:, :, None, :]
    if hasattr(pattern, "dense_bias"):
        bias = pattern.dense_bias()
        allowed = ~jnp.isneginf(bias)  # a NaN bias on an allowed slot keeps it allowed (and poisons the row)
        s = s + jnp.where(allowed, bias, 0.0)
    else:
        allowed = pattern.to_dense()
    p, lse = masked_softmax(s, allowed)
    out = jnp.einsum("bhqk,bkhd->bqhd", p, v.astype(jnp.float32))
    lse = jnp.swapaxes(lse, 1, 2)
    return zero_empty_rows(out, lse).astype(q_BxNxHxD.dtype), lse


# The longest sequence at which "reference" was measured faster than "xla" on CPU (below); past it the dense N x N
# softmax's memory grows as N^2, so longer dense patterns keep "xla".
REFERENCE_MAX_TOKENS = 512


def spans_sequence(pattern: Intervals) -> bool:
    """Whether an `Intervals` of at most `REFERENCE_MAX_TOKENS` tokens has a static reach covering every key of every
    row (dense attention, causal or not: e.g. `patterns.dense`), without label bits: every executor then visits all
    N x N pairs. Static: usable under jit."""
    n = pattern.num_tokens
    if n > REFERENCE_MAX_TOKENS or pattern.reach is None or pattern.label_bits is not None:
        return False
    left, right = pattern.reach
    return left >= n - 1 and (pattern.causal or right >= n - 1)


registry.set_reference(reference_attention)
# A dense bias (an arbitrary mask or bias from a caller, `sparse_attn.make_attention_fn`) has the oracle only.
registry.register_executor(DenseBias, "reference", reference_attention)

# On CPU a dense Intervals of up to 512 tokens (`spans_sequence`: the LM's dense layers) runs "reference" by
# default, by measurement:
# `python -m experiments.benchmarks.lm_step --rounds 3` at n = 128 on a quiet machine, `--seq_len 512 --batch 8
# --rounds 2 --tag n512` at load ~4 (experiments/results/bench_lm_step{,_n512}.md; reference/default CPU time of the
# LM train step, the default then "xla" for every Intervals; `--impls xla,reference` measures it now): dense 0.97x at
# 128, 0.84x at 512 (the materialised softmax beats the blocked "xla" when the band holds every key block); local
# (1.03x, 1.45x), Longformer (0.94x, 1.27x), BigBird (0.84x, 1.16x) and ABCA (1.35x at 128) keep their default
# executors, which win from the grids' lengths (256-1024) on. Losses agree to 5e-7. Accelerators keep "pallas".
registry.register_default(Intervals, "reference", on="cpu", when=spans_sequence)
