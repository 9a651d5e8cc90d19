"""The frozen config of non-crossing attention; `make(model_dim, num_heads, rngs=...)` builds the NNX module."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from flax import nnx

from sparse_attn.modules.base import build_module, check_floats

ROUTERS = ("defect_pair", "brick_wall", "adjacent_topk")
ROWS = ("self_top_bottom", "self_top", "through")


@dataclasses.dataclass(frozen=True, kw_only=True)
class NoncrossingAttentionConfig:
    """Non-crossing (Temperley–Lieb) attention (docs/noncrossing.md) for one layer; validated once, here.

    Attributes:
      router: "defect_pair" (default), "brick_wall" (fixed, no parameters) or "adjacent_topk" (ablation).
      num_route_layers: T routing layers. The defect-pair router closes one bracket level per layer, so it matches
        brackets nested at most T deep; choose T >= the task's nesting depth (docs/noncrossing.md, "Routing depth").
        The default 10 covers the generated ListOps (depth <= 9) and Dyck-(8, 10) (depth <= 10).
      router_dim: hidden width r of the pair MLP.
      tau: local-max threshold on scores (a pair needs s > tau).
      doubled: route in TL_{2n} with two half-points per token, so unmatched tokens can sit inside brackets.
      rows: "self_top_bottom" (default K=3), "self_top" (K=2) or "through" (the research document's literal rule,
        an ablation; sigmoid gate).
      topk_fraction: adjacent_topk keeps at most ceil(fraction * n) generators per layer.
      brick_start: "even" or "odd" first brick-wall layer.
      creator_gate: add log σ(creator score) to routed arcs' logits.
      edge_mlp_dim: if set, logits come from a small MLP on q_a ⊙ k_b instead of the scaled dot product.
    """

    mechanism: ClassVar[str] = "noncrossing"

    router: str = "defect_pair"
    num_route_layers: int = 10
    router_dim: int = 8
    tau: float = 0.0
    doubled: bool = False
    rows: str = "self_top_bottom"
    topk_fraction: float = 0.25
    brick_start: str = "even"
    creator_gate: bool = True
    edge_mlp_dim: int | None = None
    num_kv_heads: int | None = None
    implementation: str | None = None
    rope_base: float | None = 10_000.0

    def __post_init__(self):
        check_floats(self)
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}, got {self.router!r}")
        if self.rows not in ROWS:
            raise ValueError(f"rows must be one of {ROWS}, got {self.rows!r}")
        if self.num_route_layers < 1 or self.router_dim < 1:
            raise ValueError("num_route_layers and router_dim must be >= 1")
        if self.doubled and (self.router != "defect_pair" or self.rows != "self_top_bottom"):
            raise ValueError("doubled=True needs router='defect_pair' and rows='self_top_bottom' (its rows are K=3)")
        if not 0.0 < self.topk_fraction <= 1.0:
            raise ValueError(f"topk_fraction must be in (0, 1], got {self.topk_fraction}")
        if self.brick_start not in ("even", "odd"):
            raise ValueError(f"brick_start must be 'even' or 'odd', got {self.brick_start!r}")
        if self.edge_mlp_dim is not None and self.edge_mlp_dim < 1:
            raise ValueError(f"edge_mlp_dim must be None or >= 1, got {self.edge_mlp_dim}")

    def make(self, model_dim: int, num_heads: int, *, rngs: nnx.Rngs) -> nnx.Module:
        """The `NoncrossingAttention` layer (registered by its module file)."""
        return build_module(self, model_dim, num_heads, rngs=rngs)
