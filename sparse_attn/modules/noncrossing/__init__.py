"""Non-crossing (Temperley–Lieb) routing attention: routers, pair scorer, the NNX module and its config."""

from sparse_attn.modules.noncrossing.attention import NoncrossingAttention, NoncrossingAttentionConfig
from sparse_attn.modules.noncrossing.scorer import PairScorer

__all__ = ["PairScorer", "NoncrossingAttention", "NoncrossingAttentionConfig"]
