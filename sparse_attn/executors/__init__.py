"""Executors: (q, k, v, pattern, *, scale, **options) -> (out, lse), registered by (pattern type, name) in
`registry`. `reference` is the oracle for every pattern type, `xla` runs everywhere, `pallas` runs the Pallas
kernels (`sparse_attn.kernels`, below the executors); `abca` (ABCA's `ZonePattern`) and `labels` (the
`LabelPattern`, `labels.pallas` its "bucketed_pallas") register their mechanism executors on import, and
`mask_pattern` the executor of mask-function patterns (`patterns.from_mask_fn`).
"""

from sparse_attn.executors import abca  # noqa: F401  (registers ZonePattern's executors)
from sparse_attn.executors import labels  # noqa: F401  (registers LabelPattern's executors)
from sparse_attn.executors import mask_pattern  # noqa: F401  (registers MaskFnPattern's "xla")
from sparse_attn.executors import pallas  # noqa: F401  (registers the Pallas kernels as "pallas")
from sparse_attn.executors.labels import pallas as _labels_pallas  # noqa: F401  (LabelPattern's "bucketed_pallas")
from sparse_attn.executors.reference import reference_attention
from sparse_attn.executors.xla import xla_attention

__all__ = ["reference_attention", "xla_attention"]
