"""Per-mechanism incremental decoders: one registry keyed by attention module type (docs/generation.md).

A decoder is a pair of functions registered for an attention module class:

* `init_cache(module, batch, max_len, dtype) -> cache`: a pytree of arrays with static shapes (no Python scalars that
  change while decoding), sized for a prompt plus generation of at most `max_len` tokens;
* `step(module, x_Bx1xD, cache, ctx) -> (y_Bx1xD, cache)`: `x` is the layer input at position `ctx.pos`, already
  normed; `y` is the attention output after the output projection, i.e. what `module(x_BxNxD, actx).y` gives at
  that position in the full forward pass (with `actx.step = ctx.step`).

The model driver (`sparse_attn/decode/model.py`) calls `decoder_for(module)` for each layer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax


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


InitCache = Callable[..., object]
Step = Callable[..., tuple[jax.Array, object]]

_DECODERS: dict[type, tuple[InitCache, Step]] = {}


def register_decoder(module_type: type, *, init_cache: InitCache, step: Step) -> None:
    """Registers the decoder of an attention module class (replacing an earlier registration of the same class)."""
    if not isinstance(module_type, type):
        raise TypeError(f"register_decoder needs a module class, got {module_type!r}")
    _DECODERS[module_type] = (init_cache, step)


def registered_types() -> tuple[type, ...]:
    return tuple(_DECODERS)


def decoder_for(module) -> tuple[InitCache, Step]:
    """(init_cache, step) for `module`'s class (or its nearest registered base class)."""
    for cls in type(module).__mro__:
        if cls in _DECODERS:
            return _DECODERS[cls]
    names = ", ".join(sorted(t.__name__ for t in _DECODERS)) or "none"
    raise NotImplementedError(
        f"no incremental decoder is registered for {type(module).__name__}; registered: {names} "
        "(sparse_attn.decode.register_decoder adds one)"
    )
