"""Figure for docs/noncrossing.md: a router-built TL diagram on a bracket sequence and its attention pattern.

Command (CPU, ~1 min):
  python -m experiments.reports.noncrossing_figure

The defect-pair router (T=4 layers, one head) reads token embeddings of '(' and ')'. It is fitted by the supervised
warm start (`sparse_attn.modules.noncrossing.warm_start`, docs/noncrossing.md): at layer t, BCE on whether each
adjacent-defect pair closes a bracket of height t (teacher-forced on the exact layered construction). Then the *router
itself* (local-max selection, no teacher) builds the diagram of a held-out sequence; the script checks that its top
caps are the bracket matching and draws the diagram and the key rows [self, top partner, bottom partner] as an
attention mask.

Writes: the --out PNG.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from sparse_attn.modules.noncrossing.warm_start import bracket_matching, bracket_targets, warm_start_loss
from sparse_attn.patterns.noncrossing import diagram_np, stats
from sparse_attn.studies import cli
from sparse_attn.studies.mechanisms import Context, attention_config
from sparse_attn.studies.warm_start import adam_step

T = 4


def random_dyck(rng, n: int, max_depth: int) -> str:
    """A uniform-ish random balanced bracket string of length n with depth <= max_depth."""
    while True:
        depth, out = 0, []
        for i in range(n):
            left = n - i
            can_open = depth < max_depth and depth + 1 <= left - 1
            if depth > 0 and (not can_open or rng.random() < 0.5):
                out.append(")")
                depth -= 1
            else:
                out.append("(")
                depth += 1
        if depth == 0:
            return "".join(out)


def matching(seq: str) -> list[tuple[int, int]]:
    return bracket_matching(np.array([ch == "(" for ch in seq]))


def fit_router(model_dim: int, n: int, steps: int, seed: int):
    """A one-head router on '(' / ')' embeddings, fitted by the warm start's loss on random Dyck strings."""
    rngs = nnx.Rngs(seed)
    module = attention_config("noncrossing_defect", Context(seq_len=n, window=n), num_route_layers=T,
                              rope_base=None).make(model_dim, 1, rngs=rngs)
    embed = nnx.Embed(2, model_dim, rngs=rngs)
    rng = np.random.default_rng(seed)

    def batch(size):
        toks = np.array([[ch == ")" for ch in random_dyck(rng, n, T)] for _ in range(size)], np.int32)
        return jnp.asarray(toks), bracket_targets(toks == 0, np.full(size, n), T)

    def loss_fn(models, b):
        (module, embed), (toks, targets) = models, b
        return warm_start_loss(module, embed(toks), targets), None

    models = (module, embed)
    opt, step = adam_step(models, loss_fn, 3e-2)
    for i in range(steps):
        loss = step(models, opt, batch(32))
        if i % 50 == 0 or i == steps - 1:
            print(f"step {i:4d}  teacher-forced BCE {float(loss):.4f}", flush=True)
    return module, embed


def draw(seq: str, p: np.ndarray, mask: np.ndarray, path: str, title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Arc

    n = len(seq)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.6), dpi=130, gridspec_kw=dict(width_ratios=[1.6, 1]))
    top, bot = 1.0, 0.0
    for a, b in diagram_np.caps(p):  # caps hang below the top row
        ax.add_patch(Arc(((a + b) / 2, top), b - a, 0.9 * (b - a) / n * 1.6, theta1=180, theta2=360, color="C0", lw=2))
    for a, b in diagram_np.cups(p):  # cups rise above the bottom row
        ax.add_patch(Arc(((a + b) / 2, bot), b - a, 0.9 * (b - a) / n * 1.6, theta1=0, theta2=180, color="C1", lw=1.2))
    for a, b in diagram_np.through_strands(p):
        ax.plot([a, b], [top, bot], color="k", lw=1.5)
    for i, ch in enumerate(seq):
        ax.text(i, top + 0.06, ch, ha="center", va="bottom", fontsize=11, family="monospace")
    ax.scatter(range(n), [top] * n, s=8, color="k")
    ax.scatter(range(n), [bot] * n, s=8, color="k")
    ax.set_xlim(-1, n)
    ax.set_ylim(-0.2, 1.3)
    ax.axis("off")
    ax.set_title("router-built TL diagram: top caps (blue) = bracket matching; bottom cups (orange)", fontsize=9)
    ax2.imshow(mask, cmap="Greys", interpolation="nearest")
    ax2.set_xticks(range(n), list(seq), fontsize=7, family="monospace")
    ax2.set_yticks(range(n), list(seq), fontsize=7, family="monospace")
    ax2.set_xlabel("key")
    ax2.set_ylabel("query")
    ax2.set_title("attention pattern: rows [self, top partner, bottom partner]", fontsize=9)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


@cli.entry_point
def main(argv=None):
    ap = cli.ArgumentParser(__doc__)
    ap.add_argument("--seq", default="(()(()))()((()()))")
    ap.add_argument("--train-len", type=int, default=24)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--model-dim", type=int, default=16)
    ap.add_argument("--out", default="docs/img/noncrossing_router.png")
    args = ap.parse_args(argv)
    module, embed = fit_router(args.model_dim, args.train_len, args.steps, seed=0)
    toks = jnp.asarray([[ch == ")" for ch in args.seq]], jnp.int32)
    n = toks.shape[1]
    vl = jnp.array([n], jnp.int32)
    routed = module.route(embed(toks), vl)
    nl = module.pattern(routed, vl)
    p = np.asarray(routed["p"][0, 0])
    ok = sorted(diagram_np.caps(p)) == matching(args.seq)
    print("router caps:", diagram_np.caps(p))
    print("bracket matching:", matching(args.seq), "-> equal" if ok else "-> DIFFERENT")
    print(
        f"generators applied: {int(routed['word_length'][0, 0])}, Jones normal form length: "
        f"{stats.normal_form_length(p)}, nesting depth: {int(stats.diagram_stats(routed['p'][0, 0])['nesting_depth'])}"
    )
    idx, valid = np.asarray(nl.idx[0, 0]), np.asarray(nl.valid[0, 0])
    mask = np.zeros((n, n), bool)
    for a in range(n):
        mask[a, idx[a][valid[a]]] = True
    title = (
        f"{args.seq}: defect-pair router, T={T}, fitted {args.steps} steps on random length-{args.train_len} "
        f"Dyck strings; caps == matching: {ok}"
    )
    draw(args.seq, p, mask, args.out, title)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
