"""What a decoding layer is given, and where its decoder comes from: the `decoder` of its mechanism's record
(`sparse_attn.registry.Decoder`; docs/generation.md). A decoder is a pair of functions:

* `init_cache(module, batch, max_len, dtype) -> cache`: a pytree of arrays with static shapes (no Python scalars that
  change while decoding), sized for a prompt plus generation of at most `max_len` tokens;
* `step(module, x_Bx1xD, cache, ctx) -> (y_Bx1xD, cache)`: `x` is the layer input at position `ctx.pos`, already
  normed; `y` is the attention output after the output projection, i.e. what `module(x_BxNxD, actx).y` gives at
  that position in the full forward pass (with `actx.step = ctx.step`).

The model driver (`sparse_attn/decode/model.py`) calls `decoder_for(module)` for each layer.
"""

from __future__ import annotations

import dataclasses

import jax

from sparse_attn import registry


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeContext:
    """What a decoding layer knows besides its input row.

    Attributes:
      pos: int32[] absolute position of the token being decoded (the same for every row of the batch).
      token: int32[B] its token id (explicit anchors and labels read it).
      step: int32[] train step of the checkpoint (phase and temperature schedules read it).
    """

    pos: jax.Array
    token: jax.Array
    step: jax.Array


def decoder_for(module) -> registry.Decoder:
    """(init_cache, step) of `module`'s mechanism (its class or nearest registered base class)."""
    record = registry.for_module(module)
    if record is not None and record.decoder is not None:
        return record.decoder
    names = ", ".join(m.name for m in registry.mechanisms() if m.decoder is not None) or "none"
    raise NotImplementedError(
        f"no incremental decoder is registered for {type(module).__name__}; mechanisms with one: {names} "
        "(a mechanism's record names its decoder: sparse_attn.registry.Mechanism.decoder)"
    )
