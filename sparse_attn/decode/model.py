"""Incremental decoding of a `TransformerLM`: per-layer caches, prefill, one token at a time, sampling.

`LMDecoder(model, batch=, max_len=)` jits two functions over static cache shapes: `prefill(tokens_BxP)` (a
`lax.scan` of the one-token step from position 0, so it is exact: the same arithmetic as decoding) and
`step(caches, token_B, pos)`. Every layer's attention is decoded by its mechanism's decoder
(`sparse_attn.registry.Mechanism.decoder`); blocks are embed -> norm1 -> attention -> residual -> MLP, as in
`models/transformer.py`. `step` is the checkpoint's train step: schedules read it (docs/generation.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_attn.decode import labels as labels_decode
from sparse_attn.decode.attend import cache_bytes
from sparse_attn.decode.registry import DecodeContext, decoder_for
from sparse_attn.decode.sampling import check_sampling, sample
from sparse_attn.models.transformer import TransformerLM
from sparse_attn.modules.labels import LabelAttention


def init_caches(model: TransformerLM, batch: int, max_len: int, dtype=jnp.float32) -> tuple:
    """One cache per layer, sized for positions [0, max_len)."""
    return tuple(decoder_for(b.attn)[0](b.attn, batch, max_len, dtype) for b in model.blocks)


def decode_token(model: TransformerLM, token_B: jax.Array, caches: tuple, pos, step) -> tuple[jax.Array, tuple]:
    """logits [B, vocab] at position `pos` given the token there, and the updated caches."""
    ctx = DecodeContext(pos=jnp.asarray(pos, jnp.int32), token=token_B.astype(jnp.int32),
                        step=jnp.asarray(step, jnp.int32))
    x = model.embed(token_B[:, None])
    out = []
    for block, cache in zip(model.blocks, caches, strict=True):
        y, cache = decoder_for(block.attn)[1](block.attn, block.norm1(x), cache, ctx)
        x = x + y
        x = x + block.mlp_out(jax.nn.gelu(block.mlp_in(block.norm2(x))))
        out.append(cache)
    return model.head(model.norm(x))[:, 0], tuple(out)


def phase_warnings(model: TransformerLM, step: int) -> list[str]:
    """Layers that decoding runs in another phase than the trained model at `step` (labels decode hard)."""
    out = []
    for i, block in enumerate(model.blocks):
        if isinstance(block.attn, LabelAttention):
            phase = labels_decode.phase_at(block.attn, step)
            if phase != "hard":
                out.append(f"layer {i} (labels) is in its {phase} phase at step {step}; decoding runs the hard phase "
                           "(inference), so its outputs differ from the full forward pass at that step")
    return out


class LMDecoder:
    """Jitted prefill / step / generate for one model, batch size and maximum length."""

    def __init__(self, model: TransformerLM, *, batch: int, max_len: int, step: int = 0, dtype=jnp.float32):
        if batch < 1 or max_len < 1:
            raise ValueError(f"batch and max_len must be >= 1, got {batch}, {max_len}")
        self.graphdef, self.state = nnx.split(model)
        self.batch, self.max_len, self.train_step, self.dtype = batch, max_len, int(step), dtype
        self.vocab_size = model.embed.num_embeddings
        self.warnings = phase_warnings(model, self.train_step)

        def prefill(state, tokens_BxP, caches):
            m = nnx.merge(self.graphdef, state)

            def body(caches, t_pos):
                tok, pos = t_pos
                logits, caches = decode_token(m, tok, caches, pos, self.train_step)
                return caches, logits

            n = tokens_BxP.shape[1]
            caches, logits_PxBxV = jax.lax.scan(body, caches, (tokens_BxP.T, jnp.arange(n, dtype=jnp.int32)))
            return logits_PxBxV.transpose(1, 0, 2), caches

        def one(state, caches, token_B, pos):
            return decode_token(nnx.merge(self.graphdef, state), token_B, caches, pos, self.train_step)

        self._prefill = jax.jit(prefill)
        self._step = jax.jit(one, donate_argnums=1)
        self._init = jax.jit(lambda state: init_caches(nnx.merge(self.graphdef, state), batch, max_len, dtype))

    def init_caches(self) -> tuple:
        return self._init(self.state)

    def cache_bytes(self) -> int:
        shapes = jax.eval_shape(self._init, self.state)
        return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(shapes)))

    def _check(self, tokens_BxP) -> jax.Array:
        tokens = jnp.asarray(tokens_BxP)
        if tokens.ndim != 2 or tokens.shape[0] != self.batch or not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ValueError(f"tokens must be int[{self.batch}, P], got {tokens.dtype}{tokens.shape}")
        if not 1 <= tokens.shape[1] <= self.max_len:
            raise ValueError(f"a prompt of {tokens.shape[1]} tokens does not fit max_len={self.max_len} (>= 1 token)")
        return self._check_ids(tokens)

    def _check_ids(self, tokens) -> jax.Array:
        # The embedding gather would clamp an out-of-range id to a real token without a word.
        lo, hi = int(jnp.min(tokens)), int(jnp.max(tokens))
        if lo < 0 or hi >= self.vocab_size:
            raise ValueError(f"token ids must be in [0, {self.vocab_size}), got values in [{lo}, {hi}]")
        return tokens.astype(jnp.int32)

    def prefill(self, tokens_BxP, caches=None) -> tuple[jax.Array, tuple]:
        """Logits [B, P, vocab] at every prompt position (teacher forcing) and the caches after it."""
        tokens = self._check(tokens_BxP)
        caches = self.init_caches() if caches is None else caches
        return self._prefill(self.state, tokens, caches)

    def step(self, caches: tuple, token_B, pos: int) -> tuple[jax.Array, tuple]:
        if not 0 <= pos < self.max_len:
            raise ValueError(f"position {pos} is outside [0, max_len={self.max_len})")
        token = jnp.asarray(token_B)
        if token.shape != (self.batch,) or not jnp.issubdtype(token.dtype, jnp.integer):
            raise ValueError(f"token must be int[{self.batch}], got {token.dtype}{token.shape}")
        return self._step(self.state, caches, self._check_ids(token), jnp.int32(pos))

    def generate(self, prompt_BxP, num_new: int, *, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, seed: int = 0,
                 on_token: Callable[[jax.Array], None] | None = None) -> dict:
        """Samples `num_new` tokens after the prompt; `on_token(int32[B])` sees each as it is drawn (streaming).

        Returns tokens [B, num_new], prefill seconds, decode seconds and tokens/s (excluding compilation: the
        step is compiled before timing), and the cache bytes.
        """
        check_sampling(temperature, top_k, top_p)
        prompt = self._check(prompt_BxP)
        p = prompt.shape[1]
        if p + num_new > self.max_len:
            raise ValueError(f"prompt ({p}) + num_new ({num_new}) exceeds max_len={self.max_len}")
        draw = jax.jit(lambda key, logits: sample(key, logits, temperature=temperature, top_k=top_k, top_p=top_p))
        t0 = time.perf_counter()
        logits, caches = self.prefill(prompt)
        jax.block_until_ready(logits)
        t_prefill = time.perf_counter() - t0
        key = jax.random.PRNGKey(seed)
        out, last, t0 = [], logits[:, -1], None
        for i in range(num_new):
            if i == 1:  # iteration 0 compiled the sampler and the step: time the rest
                jax.block_until_ready(last)
                t0 = time.perf_counter()
            key, sub = jax.random.split(key)
            tok = draw(sub, last)
            out.append(tok)
            if on_token is not None:
                on_token(tok)
            if i + 1 < num_new:
                last, caches = self._step(self.state, caches, tok, jnp.int32(p + i))  # sampled ids: in range
        if out:
            jax.block_until_ready(out[-1])
        timed = num_new - 1
        t_decode = time.perf_counter() - t0 if t0 is not None else 0.0
        return {
            "tokens": jnp.stack(out, axis=1) if out else jnp.zeros((self.batch, 0), jnp.int32),
            "prefill_s": t_prefill,
            "decode_s": t_decode,
            "tokens_per_s": self.batch * timed / t_decode if t_decode else float("nan"),
            "cache_bytes": self.cache_bytes(),
        }


__all__ = ["LMDecoder", "cache_bytes", "decode_token", "init_caches", "phase_warnings"]
