"""The classification plots: accuracy against n and memory, loss against training FLOPs, per task (PNG)."""

from __future__ import annotations

import collections
import os

from experiments.reports.classification_tables import (
    CHANCE,
    _order,
)


def plot_task(task: str, entries: list[dict], plots_dir: str) -> list[str]:
    """`classify_<task>_{acc_vs_n,acc_vs_memory,loss_vs_flops}.png`, one series per (config, mechanism)."""
    from matplotlib.figure import Figure  # noqa: PLC0415 — only the report needs it

    series = collections.defaultdict(list)
    for e in entries:
        if e["acc"] is not None:
            series[(e["config"], e["mechanism"])].append(e)
    curves = {(e["config"], e["mechanism"], e["n"]): e["curve"] for e in entries if e["curve"]}
    paths = []
    for kind in ("n", "memory", "flops"):
        fig = Figure(figsize=(7, 4.2))
        ax = fig.add_subplot()
        if kind == "flops":
            for (config, name, n), curve in sorted(curves.items(), key=lambda kv: (kv[0][0], kv[0][2],
                                                                                        _order(kv[0][1]))):
                ax.plot([f for f, _ in curve], [v for _, v in curve], marker=".",
                        label=f"{name} n={n} ({config})")
            ax.set_xscale("log")
            ax.set(xlabel="training FLOPs", ylabel="validation loss (nats)", title=f"{task}: loss per training FLOP")
            if curves:
                ax.legend(fontsize=6, ncol=2)
        else:
            for (config, name), es in sorted(series.items(), key=lambda kv: (kv[0][0], _order(kv[0][1]))):
                es = sorted(es, key=lambda e: e["n"])
                label = f"{name} ({config})"
                if kind == "n":
                    ax.errorbar([e["n"] for e in es], [e["acc"] for e in es], yerr=[e["acc_std"] or 0 for e in es],
                                marker="o", capsize=3, label=label)
                else:
                    pts = [e for e in es if e["peak"] is not None]
                    ax.scatter([e["peak"] for e in pts], [e["acc"] for e in pts], label=label)
                    for e in pts:
                        ax.annotate(str(e["n"]), (e["peak"], e["acc"]), fontsize=7, xytext=(3, 3),
                                    textcoords="offset points")
            if task in CHANCE:
                ax.axhline(CHANCE[task], color="grey", ls=":", lw=1, label="majority class")
            ax.set_xscale("log", base=2 if kind == "n" else 10)
            ax.set(xlabel="sequence length n" if kind == "n" else "peak train-step memory (MiB)",
                   ylabel="validation accuracy", title=f"{task}: accuracy vs {kind}")
            if series:
                ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        stem = {"n": "acc_vs_n", "memory": "acc_vs_memory", "flops": "loss_vs_flops"}[kind]
        path = os.path.join(plots_dir, f"classify_{task}_{stem}.png")
        fig.savefig(path, dpi=100, bbox_inches="tight")
        paths.append(path)
    return paths


