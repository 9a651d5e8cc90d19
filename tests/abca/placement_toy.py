"""A toy task whose right ABCA anchors are known, to measure whether learned placement finds them.

Sequences are segments; each starts with a header token (ids [0, num_headers)) followed by filler tokens; every
position must predict its segment's header. With anchors exactly at the headers a causal zone holds its header and
nothing older, so one attention layer solves the task; a zone that starts elsewhere either misses its header or
holds an older one too. Learned placement (no `boundary_ids`) sees only the task loss. No RoPE: with it one layer solves the task
from any zones (recency by position), so placement would not matter.

Measure across seeds (the test's margin comes from this):

    python -m tests.abca.placement_toy --seeds 0 1 2 3 4 --steps 150 --straight_through 1 0
"""

from __future__ import annotations

import argparse

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from sparse_attn.modules.abca import AnchorAttentionConfig, LearnedAnchors
from sparse_attn.modules.base import AttentionContext

NUM_HEADERS, NUM_FILLERS = 4, 12
N, BATCH, MAX_ZONE, SEGMENT = 64, 8, 16, (5, 12)


def make_batch(rng: np.random.Generator, batch: int = BATCH, n: int = N):
    """(tokens int32[B, N], header-of-segment targets int32[B, N], header mask bool[B, N])."""
    tokens = rng.integers(NUM_HEADERS, NUM_HEADERS + NUM_FILLERS, size=(batch, n))
    header = np.zeros((batch, n), bool)
    for b in range(batch):
        t = 0
        while t < n:
            header[b, t] = True
            t += int(rng.integers(SEGMENT[0], SEGMENT[1] + 1))
    tokens[header] = rng.integers(0, NUM_HEADERS, size=int(header.sum()))
    seg = np.cumsum(header, axis=1) - 1
    targets = np.zeros((batch, n), np.int64)
    for b in range(batch):
        starts = np.flatnonzero(header[b])
        targets[b] = tokens[b, starts[seg[b]]]
    return jnp.asarray(tokens, jnp.int32), jnp.asarray(targets, jnp.int32), jnp.asarray(header)


class Toy(nnx.Module):
    def __init__(self, config: AnchorAttentionConfig, dim: int = 32, heads: int = 2, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(NUM_HEADERS + NUM_FILLERS, dim, rngs=rngs)
        self.attn = config.make(dim, heads, rngs=rngs)
        self.head = nnx.Linear(dim, NUM_HEADERS, rngs=rngs)

    def __call__(self, tokens_BxN):
        x = self.embed(tokens_BxN)
        ctx = AttentionContext(valid_len=jnp.full(tokens_BxN.shape[:1], tokens_BxN.shape[1], jnp.int32),
                               tokens=tokens_BxN, causal=True)
        out = self.attn(x, ctx)
        return self.head(x + out.y), sum(out.aux_losses.values(), jnp.zeros(())), out.stats


def placed_rates(model: Toy, tokens_BxN, header_BxN) -> tuple[float, float]:
    """(fraction of headers the score head places an anchor on, same for non-header positions); position 0 and
    the zone cap's fallbacks are excluded (they are not the head's decisions)."""
    x = model.embed(tokens_BxN)
    placed = np.asarray(model.attn.score(x)[..., 0] > 0)[:, 1:]
    h = np.asarray(header_BxN)[:, 1:]
    return float(placed[h].mean()), float(placed[~h].mean())


def train(config: AnchorAttentionConfig, seed: int, steps: int = 150, lr: float = 3e-2):
    """Trains the toy; returns (rates at init, rates after, final task loss) on a held-out batch."""
    model = Toy(config, rngs=nnx.Rngs(seed))
    opt = nnx.Optimizer(model, optax.adam(lr), wrt=nnx.Param)
    rng = np.random.default_rng(seed)
    test_tokens, _, test_header = make_batch(np.random.default_rng(10_000 + seed), batch=32)
    before = placed_rates(model, test_tokens, test_header)

    @nnx.jit
    def step(model, opt, tokens, targets):
        def loss_fn(model):
            logits, aux, _ = model(tokens)
            return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean() + aux

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        opt.update(model, grads)
        return loss

    loss = None
    for _ in range(steps):
        tokens, targets, _ = make_batch(rng)
        loss = float(step(model, opt, tokens, targets))
    return before, placed_rates(model, test_tokens, test_header), loss


def learned(**kw) -> AnchorAttentionConfig:
    return AnchorAttentionConfig(placement=LearnedAnchors(**kw), max_zone=MAX_ZONE, rope_base=None)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--straight_through", type=int, nargs="+", default=[0, 1])
    args = p.parse_args()
    for st in args.straight_through:
        for seed in args.seeds:
            cfg = learned(straight_through=bool(st))
            (h0, o0), (h1, o1), loss = train(cfg, seed, steps=args.steps)
            print(f"st={st} seed={seed} headers placed {h0:.2f} -> {h1:.2f}  others {o0:.2f} -> {o1:.2f}  "
                  f"loss {loss:.3f}", flush=True)


if __name__ == "__main__":
    main()
