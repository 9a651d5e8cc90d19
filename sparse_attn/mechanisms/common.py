"""What the records share: a preset whose runner config is its budget config at the context's window."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from sparse_attn.registry import Preset

NEWLINE = ord("\n")


def with_implementation(config, implementation: str | None):
    """`config` with the context's executor, where one is asked for and the config takes one."""
    if implementation is None or not any(f.name == "implementation" for f in dataclasses.fields(config)):
        return config
    return dataclasses.replace(config, implementation=implementation)


def sized(build: Callable[[int, int, float | None], object], tuned: str, **kw) -> Preset:
    """A preset built by one function of (size, n, keys target): budget grids tune `size`; a runner's context
    passes its window as the size and no target."""
    return Preset(config=lambda ctx: with_implementation(build(ctx.window, ctx.seq_len, None), ctx.implementation),
                  budget=build, tuned=tuned, **kw)
