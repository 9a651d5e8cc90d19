"""Non-crossing (Temperley–Lieb) attention: config, NNX layer, pure core, statistics, routers and pair scorer."""

from sparse_attn.modules.noncrossing.config import NoncrossingAttentionConfig
from sparse_attn.modules.noncrossing.core import noncrossing_core
from sparse_attn.modules.noncrossing.module import NoncrossingAttention
from sparse_attn.modules.noncrossing.scorer import PairScorer

__all__ = ["PairScorer", "NoncrossingAttention", "NoncrossingAttentionConfig", "noncrossing_core"]
