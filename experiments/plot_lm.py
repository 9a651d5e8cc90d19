"""Plots of the LM grid's rows (docs/results.md, "Language modelling"): validation bits/byte against training step per
variant, and final bits/byte against attention forward FLOPs per sequence.

    python -m experiments.plot_lm --config cpu_short --n 256 --out docs/img/lm_cpu_short_n256

writes `<out>_curves.png` and `<out>_bpb_vs_flops.png` from `--results` (default experiments/results/lm.jsonl).
Per variant: the mean over its seeds at each evaluated step, and every seed's final point (error bars: min to max).
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from experiments.lm_grid import RESULTS, read_rows


def grouped(rows: list[dict], config: str, n: int) -> dict[str, list[dict]]:
    """LM rows of `config` and `n` by variant, in first-seen order."""
    out: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("kind") == "lm" and r.get("config") == config and r.get("n") == n and "valid_curve" in r:
            out.setdefault(r["variant"], []).append(r)
    if not out:
        raise ValueError(f"no LM rows with config={config!r} and n={n}")
    return out


def mean_curve(runs: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(steps, mean bits/byte) over the steps every run evaluated."""
    by_step = [{p["step"]: p["bits_per_byte"] for p in r["valid_curve"] if p.get("bits_per_byte") is not None}
               for r in runs]
    steps = sorted(set.intersection(*(set(c) for c in by_step)))
    return np.array(steps), np.array([np.mean([c[s] for c in by_step]) for s in steps])


def plot(rows: list[dict], config: str, n: int, out: str, curve_variants: list[str] | None = None) -> list[str]:
    """The two plots of `config` and `n`; the curves only of `curve_variants` (default: every variant)."""
    from matplotlib.figure import Figure  # noqa: PLC0415 — only plotting needs it

    groups = grouped(rows, config, n)
    paths = [f"{out}_curves.png", f"{out}_bpb_vs_flops.png"]
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)

    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    for variant, runs in groups.items():
        if curve_variants is not None and variant not in curve_variants:
            continue
        steps, bpb = mean_curve(runs)
        ax.plot(steps, bpb, marker="o", label=f"{variant} ({len(runs)} seeds)")
    ax.set(xlabel="training step", ylabel="validation bits/byte", title=f"LM {config}, n = {n}: mean over seeds")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(paths[0], dpi=110)

    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    for variant, runs in groups.items():
        flops = np.mean([r["attn_fwd_flops_per_seq"] for r in runs])
        bpb = np.array([r["valid_bits_per_byte"] for r in runs])
        err = [[bpb.mean() - bpb.min()], [bpb.max() - bpb.mean()]]
        ax.errorbar([flops], [bpb.mean()], yerr=err, marker="o", capsize=3, label=variant)
    ax.set_xscale("log")
    ax.set(xlabel="attention forward FLOPs per sequence (all layers, measured keys)",
           ylabel="final validation bits/byte", title=f"LM {config}, n = {n}: bits/byte vs attention FLOPs")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=110)
    return paths


def main(argv=None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="cpu_short")
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--results", default=RESULTS)
    parser.add_argument("--out", required=True, help="path prefix of the two PNG files")
    args = parser.parse_args(argv)
    paths = plot(read_rows(args.results), args.config, args.n, args.out)
    for p in paths:
        print("wrote", p)
    return paths


if __name__ == "__main__":
    main()
