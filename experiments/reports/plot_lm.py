"""Plots of the LM grid's rows (docs/results.md, "Language modelling"): validation bits/byte against training step per
mechanism, final bits/byte against attention forward FLOPs per sequence, and the mechanisms' statistics over training
(the retrieval grid's accuracy against key-query distance is `experiments.retrieval.train.plot`).

    python -m experiments.reports.plot_lm --config cpu_short --n 256 --out docs/img/lm_cpu_short_n256

writes `<out>_curves.png`, `<out>_bpb_vs_flops.png` and `<out>_stats.png` from `--results` (default
experiments/results/lm.jsonl).
Per mechanism: the mean over its seeds at each evaluated step, and every seed's final point (error bars: min to max).

Writes: the --out PNG.
"""

from __future__ import annotations

import os

import numpy as np

from experiments.reports.rows import mechanism, read_rows
from sparse_attn.studies import cli

RESULTS = os.path.join("experiments", "results", "lm.jsonl")


def grouped(rows: list[dict], config: str, n: int) -> dict[str, list[dict]]:
    """LM rows of `config` and `n` by mechanism, in first-seen order."""
    out: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("kind") == "lm" and r.get("config") == config and r.get("n") == n and "valid_curve" in r:
            out.setdefault(mechanism(r), []).append(r)
    if not out:
        raise ValueError(f"no LM rows with config={config!r} and n={n}")
    return out


def mean_curve(runs: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(steps, mean bits/byte) over the steps every run evaluated."""
    by_step = [{p["step"]: p["bits_per_byte"] for p in r["valid_curve"] if p.get("bits_per_byte") is not None}
               for r in runs]
    steps = sorted(set.intersection(*(set(c) for c in by_step)))
    return np.array(steps), np.array([np.mean([c[s] for c in by_step]) for s in steps])


def plot(rows: list[dict], config: str, n: int, out: str, curve_mechanisms: list[str] | None = None) -> list[str]:
    """The two plots of `config` and `n`; the curves only of the mechanisms in `curve_mechanisms` (default: all)."""
    from matplotlib.figure import Figure  # noqa: PLC0415 — only plotting needs it

    groups = grouped(rows, config, n)
    paths = [f"{out}_curves.png", f"{out}_bpb_vs_flops.png"]
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)

    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    for name, runs in groups.items():
        if curve_mechanisms is not None and name not in curve_mechanisms:
            continue
        steps, bpb = mean_curve(runs)
        ax.plot(steps, bpb, marker="o", label=f"{name} ({len(runs)} seeds)")
    ax.set(xlabel="training step", ylabel="validation bits/byte", title=f"LM {config}, n = {n}: mean over seeds")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(paths[0], dpi=110)

    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    for name, runs in groups.items():
        flops = np.mean([r["attn_fwd_flops_per_seq"] for r in runs])
        bpb = np.array([r["valid_bits_per_byte"] for r in runs])
        err = [[bpb.mean() - bpb.min()], [bpb.max() - bpb.mean()]]
        ax.errorbar([flops], [bpb.mean()], yerr=err, marker="o", capsize=3, label=name)
    ax.set_xscale("log")
    ax.set(xlabel="attention forward FLOPs per sequence (all layers, measured keys)",
           ylabel="final validation bits/byte", title=f"LM {config}, n = {n}: bits/byte vs attention FLOPs")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=110)
    return paths


# Mechanism statistics over training (label degree and disconnected fraction with a trained router; ABCA's anchors,
# zones and inserted anchors): (panel title, statistic under `layer{i}/`); a mechanism shows where it logs it.
STATS_PANELS = (
    ("keys per query (measured)", "keys_per_query"),
    ("labels: mean degree (keys sharing a label)", "labels/mean_degree"),
    ("labels: fraction of tokens disconnected", "labels/frac_disconnected"),
    ("ABCA: anchors per sequence", "abca/anchors"),
    ("ABCA: mean zone (tokens)", "abca/mean_zone"),
    ("ABCA: anchors inserted by the zone cap", "abca/inserted_anchors"),
)


def layer_values(point: dict, stat: str) -> dict[int, float]:
    """{layer: value} of `layer{i}/<stat>` in one `stats_curve` point (logged values only)."""
    out = {}
    for k, v in point.items():
        layer, _, name = k.partition("/")
        if layer.startswith("layer") and name == stat and v is not None:
            out[int(layer[5:])] = v
    return out


def stat_curve(runs: list[dict], stat: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(steps, mean over seeds and layers) of `layer{i}/<stat>` from the rows' `stats_curve`, over the steps every
    run logged; None when no run reports it."""
    per_run = []
    for r in runs:
        points = {}
        for p in r.get("stats_curve") or []:
            vals = layer_values(p, stat)
            if vals:
                points[p["step"]] = float(np.mean(list(vals.values())))
        if points:
            per_run.append(points)
    if not per_run:
        return None
    steps = sorted(set.intersection(*(set(c) for c in per_run)))
    return np.array(steps), np.array([np.mean([c[s] for c in per_run]) for s in steps])


def plot_stats(rows: list[dict], config: str, n: int, out: str) -> str | None:
    """One figure of `STATS_PANELS` against training step for the sparse mechanisms of `config` and `n` (mean over
    seeds and layers); None when none logged statistics."""
    from matplotlib.figure import Figure  # noqa: PLC0415 — only plotting needs it

    groups = {v: rs for v, rs in grouped(rows, config, n).items() if v != "dense"}
    curves = [[(v, c) for v, rs in groups.items() if (c := stat_curve(rs, stat)) is not None]
              for _, stat in STATS_PANELS]
    if not any(curves):
        return None
    fig = Figure(figsize=(12, 6.6))
    for i, ((title, _), panel) in enumerate(zip(STATS_PANELS, curves, strict=True)):
        ax = fig.add_subplot(2, 3, i + 1)
        for name, (steps, values) in panel:
            ax.plot(steps, values, label=name)
        ax.set(title=title, xlabel="training step")
        ax.grid(alpha=0.3)
        if panel:
            ax.legend(fontsize=6)
    fig.suptitle(f"LM {config}, n = {n}: mechanism statistics over training (mean over seeds and layers)")
    fig.tight_layout()
    path = f"{out}_stats.png"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


@cli.entry_point
def main(argv=None) -> list[str]:
    parser = cli.ArgumentParser(__doc__)
    parser.add_argument("--config", default="cpu_short")
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--results", default=RESULTS)
    parser.add_argument("--out", required=True, help="path prefix of the PNG files")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.results):
        raise FileNotFoundError(f"--results {args.results}: no such file")
    rows = read_rows(args.results)
    paths = plot(rows, args.config, args.n, args.out)
    paths += [p for p in [plot_stats(rows, args.config, args.n, args.out)] if p]
    for p in paths:
        print("wrote", p)
    return paths


if __name__ == "__main__":
    main()
