"""Compile time of the ABCA core: XLA must not constant-fold [B, N, H, D] work (docs/abca.md, "Compile time").

With zones known at compile time (computed eagerly and closed over, as a benchmark or a fixed placement does) and a
`sum` loss (a constant cotangent), the old core's backward pass had a scatter-add over [B, N, H, D] whose every input
was a constant; XLA evaluated it while compiling (49-89 s on an H200 at n = 16384, 77 CPU-s here). The check is
structural: the HLO right after XLA's constant-folding passes holds no floating-point constant of N or more elements
(the folded cotangent was [1, 128, 4, 16] = 8 N here; the zones themselves are N-element integer/bool constants).
"""

import glob
import math
import os
import re

import jax
import jax.numpy as jnp
import pytest

from sparse_attn.modules.abca import AnchorProjections, abca_core
from sparse_attn.patterns import abca

N, H, D, ZONE = 1024, 4, 16, 64
CONSTANT = re.compile(r"= (\w+)\[([\d,]*)\]\{[^}]*\} constant\(")
FLOATS = ("bf16", "f16", "f32", "f64")


def _constants_after_folding(fn, args, dump_dir) -> list[tuple[str, tuple[int, ...]]]:
    """(dtype, shape) of every constant in the HLO dumped after each constant-folding pass of `fn`'s compilation."""
    # At the default optimisation level (tests/conftest.py lowers it for speed): the pipeline a user compiles.
    options = {"xla_dump_to": str(dump_dir), "xla_dump_hlo_pass_re": "constant_folding",
               "xla_backend_optimization_level": 2}
    jax.jit(fn).lower(*args).compile(options)
    files = glob.glob(os.path.join(dump_dir, "*after_constant_folding*.txt"))
    assert files, f"no HLO dumped after constant folding in {dump_dir}: the pass name changed?"
    found = []
    for path in files:
        with open(path) as f:
            for m in CONSTANT.finditer(f.read()):
                found.append((m.group(1), tuple(int(x) for x in m.group(2).split(",") if x)))
    return found


@pytest.mark.parametrize("implementation", [None, "xla"])
def test_fwd_bwd_with_constant_zones_folds_no_large_constant(implementation, tmp_path):
    zones = abca.compute_zones(abca.fixed_interval_anchors(1, N, ZONE))  # concrete: constants under jit
    ks = jax.random.split(jax.random.key(0), 6)
    q, k, v = (jax.random.normal(x, (1, N, H, D), jnp.float32) for x in ks[:3])
    w = tuple(jax.random.normal(x, (H, D, D), jnp.float32) / 4 for x in ks[3:])

    def loss(q, k, v, w):
        proj = AnchorProjections(*w)
        out = abca_core(q, k, v, zones, proj, max_zone=ZONE, causal=True, implementation=implementation)[0]
        return jnp.sum(out)

    found = _constants_after_folding(jax.grad(loss, argnums=(0, 1, 2)), (q, k, v, w), tmp_path)
    large = [(t, s) for t, s in found if t in FLOATS and math.prod(s) >= N]
    assert not large, f"XLA constant-folded float data of the size of the activations: {sorted(set(large))}"
