"""The built-in mechanisms, one record each (`sparse_attn.registry.Mechanism`): its configs and module, presets,
decoder, diagnostics probe, budget counting and benchmark cores. `sparse_attn` registers them on import, in this
order (the order runners list presets and reports order rows)."""

from sparse_attn.mechanisms import abca, fixed, labels, moba, noncrossing, nsa
from sparse_attn.registry import register_mechanism

BUILTINS = (fixed.RECORD, labels.RECORD, abca.RECORD, moba.RECORD, nsa.RECORD, noncrossing.RECORD)
for _record in BUILTINS:
    register_mechanism(_record)
