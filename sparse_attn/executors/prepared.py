"""A pattern prepared once for one executor: the pattern plus that executor's metadata, as one pytree.

Built by `sparse_attn.prepare`; `sparse_attn.attention` accepts it wherever a pattern goes, so a model can build the
tile lists / slot layouts once per forward and pass them to every layer that shares the pattern (and the executors'
custom VJPs keep them as residuals). See docs/architecture.md, "Prepared patterns".
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Prepared:
    """Attributes:
      pattern: the pattern (any registered pattern type).
      metadata: the executor's prepared arrays (a pytree; None for an executor that prepares nothing).
      implementation: static name of the executor it was prepared for.
      options: static executor options it was prepared with, as sorted (name, value) pairs.
      head_dim: static head size it was prepared for (None: not given; executors that size tiles by it need it).
    """

    pattern: Any
    metadata: Any
    implementation: str = dataclasses.field(metadata=dict(static=True))
    options: tuple = dataclasses.field(default=(), metadata=dict(static=True))
    head_dim: int | None = dataclasses.field(default=None, metadata=dict(static=True))

    @property
    def num_tokens(self) -> int:
        return self.pattern.num_tokens

    def validate(self, batch: int | None = None, heads: int | None = None) -> Prepared:
        self.pattern.validate(batch, heads)
        return self

    def to_dense(self) -> jax.Array:
        return self.pattern.to_dense()
