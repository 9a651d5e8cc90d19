"""Why the ABCA code writes row-scalings as einsums (docs/abca.md, "XLA:CPU detail"): a broadcast multiply reduced
over the head dimension against the same contraction as an einsum, forward and as the transpose autodiff emits.

Command: python -m experiments.benchmarks.xla_cpu_einsum

Writes: nothing; prints one time per case.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sparse_attn.studies import bench as benchlib
from sparse_attn.studies import cli


@cli.entry_point
def main(argv=None):
    cli.ArgumentParser(__doc__).parse_args(argv)
    ka, kb = jax.random.split(jax.random.PRNGKey(0))
    a, b = (jax.random.normal(k, (1, 4096, 4, 64)) for k in (ka, kb))
    w = jnp.ones((1, 4096, 4))
    cases = {
        "sum(a * b, -1)": lambda a, b: jnp.sum(a * b, -1),
        "einsum bnhd,bnhd->bnh": lambda a, b: jnp.einsum("bnhd,bnhd->bnh", a, b),
        "grad_w sum(w[..., None] * a * b)": jax.grad(lambda w, a, b: jnp.sum(w[..., None] * a * b)),
        "grad_w sum(einsum(w, a) * b)": jax.grad(lambda w, a, b: jnp.sum(jnp.einsum("bnh,bnhd->bnhd", w, a) * b)),
    }
    print(f"# {benchlib.environment()}")
    for name, fn in cases.items():
        args = (a, b) if name.startswith(("sum", "einsum")) else (w, a, b)
        print(f"{name:36s} {benchlib.time_fn(jax.jit(fn), *args, repeats=20) * 1e3:7.3f} ms")


if __name__ == "__main__":
    main()
