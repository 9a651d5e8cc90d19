"""Hard label core cost of a skewed router at a larger shape (docs/labels.md, "Capacity").

    python -m experiments.lm.label_capacity_skew 4096 1024 5      # n, window radius, interleaved repeats

Label 0 is put in ~60% of the tokens (like the smoke LM's trained routers), the other label is the top of random
logits; d 32, k 2, 4 heads, D 64, causal, landmarks every radius. Times the bucketed executor's forward and
forward+backward (median wall and process-CPU ms) at the default planned reach (the skewed batch runs the fallback
tier it needs), at the reach `calibrate_reach` would plan for it (tier 0), and for the random logits' own top-2
(balanced) at the default plan.

Writes: nothing; prints the timings.
"""


import jax
import jax.numpy as jnp

from experiments.lm.label_capacity import core_fns, time_settings
from sparse_attn.executors.labels.bucketed import default_reach, fallback_reaches
from sparse_attn.modules.labels.calibrate import capacity_for
from sparse_attn.patterns.labels import bits as B
from sparse_attn.patterns.labels.base_graph import BaseGraph
from sparse_attn.studies import cli

D_LABELS, TOP_K, HEADS, HEAD_DIM, SHARE = 32, 2, 4, 64, 0.6


def run(n: int, radius: int, repeats: int) -> dict:
    """Time the three settings at length n and window radius (median of `repeats`)."""
    base = BaseGraph(radius=radius, landmark_every=radius, causal=True)
    ks = jax.random.split(jax.random.PRNGKey(0), 5)
    q, k, v = (jax.random.normal(key, (1, n, HEADS, HEAD_DIM)) for key in ks[:3])
    logits = jax.random.normal(ks[3], (1, 1, n, D_LABELS))
    in_zero = jax.random.uniform(ks[4], (1, 1, n)) < SHARE
    skewed = B.top_k_labels(logits.at[..., 0].add(jnp.where(in_zero, 10.0, -10.0)), TOP_K)
    balanced = B.top_k_labels(logits, TOP_K)
    planned = default_reach(n, base, D_LABELS, TOP_K)
    need = int(core_fns(skewed, planned, num_labels=D_LABELS, base=base)[0](q, k, v)[2]["needed"])
    calibrated = capacity_for([need], margin=0.25, radius=radius)
    settings = dict(skewed_default=(skewed, planned), skewed_calibrated=(skewed, calibrated),
                    balanced_default=(balanced, planned))
    print(f"n {n} radius {radius} planned {planned} ladder {fallback_reaches(planned, radius, n)} skewed needs {need} "
          f"calibrated {calibrated}")
    built = {name: core_fns(labels, reach, num_labels=D_LABELS, base=base) for name, (labels, reach) in settings.items()}
    out = time_settings(built, q, k, v, repeats)
    for name, r in out.items():
        print(name, r)
    return out


@cli.entry_point
def main(argv=None) -> dict:
    parser = cli.ArgumentParser(__doc__)
    parser.add_argument("n", type=int, help="sequence length")
    parser.add_argument("radius", type=int, help="window radius")
    parser.add_argument("repeats", type=int, help="interleaved repeats")
    args = parser.parse_args(argv)
    return run(args.n, args.radius, args.repeats)


if __name__ == "__main__":
    main()
