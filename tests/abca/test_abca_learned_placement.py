"""Learned placement with its defaults (no `boundary_ids`) learns anchors from the task loss alone.

The toy (tests/abca/placement_toy.py) is a task whose right anchors are known: segment headers. At init the score
head places no anchor (bias -2: every anchor is a zone-cap fallback); the measured runs (docs/abca.md) place an
anchor on every header and on no other position after 150 steps with the default straight-through gate, while the
gate switched off leaves the head exactly at init.
"""

from tests.abca import placement_toy


def test_default_learned_placement_moves_anchors_to_the_known_boundaries():
    cfg = placement_toy.learned()  # the config's defaults: straight-through on, no boundary_ids
    assert cfg.placement.straight_through and not cfg.placement.boundary_ids
    (h0, o0), (h1, o1), _ = placement_toy.train(cfg, seed=0, steps=150)
    assert h0 == 0.0 and o0 == 0.0  # at init the head places nothing
    # Measured (seeds 0-4, see docs/abca.md): headers placed 1.00, other positions 0.00 after training.
    assert h1 >= 0.8, f"learned placement put an anchor on only {h1:.2f} of the headers"
    assert o1 <= 0.05, f"learned placement put anchors on {o1:.2f} of the non-header positions"
