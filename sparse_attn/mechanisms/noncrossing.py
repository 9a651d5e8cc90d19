"""Non-crossing routing attention (`modules.noncrossing`): Temperley–Lieb diagrams from a router's generator words;
bidirectional only (the classifier), one preset per router."""

from __future__ import annotations

from sparse_attn.modules.noncrossing import NoncrossingAttention, NoncrossingAttentionConfig
from sparse_attn.registry import Mechanism, Preset

ROUTERS = {"defect": "defect_pair", "brick": "brick_wall", "adjacent": "adjacent_topk"}

RECORD = Mechanism(
    name="noncrossing",
    configs=(NoncrossingAttentionConfig,),
    module=NoncrossingAttention,
    presets={f"noncrossing_{short}": Preset(config=lambda ctx, r=router: NoncrossingAttentionConfig(router=r),
                                            causal=False)
             for short, router in ROUTERS.items()},
)
