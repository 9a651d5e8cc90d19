"""Non-crossing (Temperley–Lieb) routing attention: routers, pair scorer, the NNX module and its config."""

from sparse_attn.modules.routing.attention import RoutingAttention, RoutingAttentionConfig
from sparse_attn.modules.routing.scorer import PairScorer

__all__ = ["PairScorer", "RoutingAttention", "RoutingAttentionConfig"]
