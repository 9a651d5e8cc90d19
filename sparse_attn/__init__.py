"""sparse_attn: structured sparse attention in JAX/Flax."""

from sparse_attn import patterns, score_fns
from sparse_attn.attention import (
    Prepared,
    attention,
    available_implementations,
    default_implementation,
    prepare,
    register_executor,
    resolve_implementation,
)
from sparse_attn.attention_fn import make_attention_fn
from sparse_attn.patterns import BlockLayout, Intervals, NeighbourList

__all__ = [
    "BlockLayout",
    "Intervals",
    "NeighbourList",
    "Prepared",
    "attention",
    "available_implementations",
    "default_implementation",
    "make_attention_fn",
    "patterns",
    "prepare",
    "register_executor",
    "resolve_implementation",
    "score_fns",
]
__version__ = "0.1.0"

# The built-in mechanisms register last: their records read every layer of the package.
from sparse_attn import mechanisms  # noqa: E402,F401
