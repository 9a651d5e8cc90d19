"""Label attention's validation loss through its phase changes on the LM grid (the target: "at every phase change
the validation loss rises by at most 1% and ends at or below its soft-phase best"), with a reference run of the same
seed read the same way (its "rise" at the same steps is what training noise alone gives).

    python -m experiments.lm.grid --config cpu_short --n 256 --mechanism labels_d8k2 --budget 24 --seed <s> \
        --eval_every 10 --results experiments/results/lm_label_phases.jsonl --runs_dir runs/lm_phases  # also labels_st, local
    python -m experiments.reports.label_phase_valid --rows experiments/results/lm_label_phases.jsonl \
        --out experiments/results/labels_phases_lm.json --plot docs/img/labels_phases_lm.png

The phase boundaries are the default schedule's (`LabelSchedule().phase_steps(steps)`: every label preset of the
budget grids keeps the default fractions). An evaluation at step s sees the state after s updates in phase(s), so the
first evaluation of a phase is its first step's.

Writes: --out (JSON: per mechanism and seed, each change's rise, the final and soft-phase-best losses; the curves stay
in --rows) and --plot;
prints the markdown table docs/labels.md quotes.
"""

from __future__ import annotations

import json

import numpy as np

from experiments.reports.rows import mechanism, read_rows
from sparse_attn.modules.labels.config import LabelSchedule
from sparse_attn.studies import cli


def boundaries(num_steps: int) -> dict[str, int]:
    """First step of each phase after the soft one under the default schedule of a `num_steps` run."""
    s = LabelSchedule().phase_steps(num_steps)  # the default fractions
    ramp, st = s.soft, s.soft + s.ramp
    return {"ramp": ramp, "straight_through": st, "hard": st + s.straight_through}


def phase_rises(curve: dict[int, float], bounds: dict[str, int], end: int) -> dict[str, float]:
    """Per change at step b: the highest validation loss of the new phase (evaluations in [b, next change)) over the
    last evaluation before b, minus 1 (0.01 = a 1% rise; negative = no rise)."""
    steps = np.asarray(sorted(curve))
    vals = np.asarray([curve[s] for s in steps])
    starts = sorted(bounds.items(), key=lambda kv: kv[1])
    out = {}
    for i, (name, b) in enumerate(starts):
        stop = starts[i + 1][1] if i + 1 < len(starts) else end + 1
        before, inside = vals[steps < b], vals[(steps >= b) & (steps < stop)]
        if len(before) and len(inside):
            out[name] = float(inside.max() / before[-1] - 1.0)
    return out


def analyse_row(row: dict, bounds: dict[str, int]) -> dict:
    curve = {int(p["step"]): float(p["bits_per_byte"]) for p in row["valid_curve"]}
    soft = [v for s, v in curve.items() if s < bounds["ramp"]]
    final = curve[max(curve)]
    return {"seed": row["seed"], "rises": phase_rises(curve, bounds, row["steps"]), "final": final,
            "soft_best": min(soft) if soft else None, "final_at_or_below_soft_best": bool(soft and final <= min(soft)),
            "keys_per_query": [layer["keys_per_query"] for layer in row["layers"]], "curve": curve}


def summarise(rows: list[dict]) -> dict:
    """{mechanism: {"seeds": [analyse_row ...], "boundaries": ...}} over rows of one config and n."""
    out = {}
    for row in rows:
        bounds = boundaries(row["steps"])
        entry = out.setdefault(mechanism(row), {"boundaries": bounds, "seeds": []})
        entry["seeds"].append(analyse_row(row, bounds))
    for entry in out.values():
        entry["seeds"].sort(key=lambda r: r["seed"])
    return out


def table(summary: dict) -> str:
    lines = ["| mechanism | seed | rise → ramp | rise → straight-through | rise → hard | soft-phase best | final "
             "| final ≤ soft best | keys/query (layers) |", "|---|---|---|---|---|---|---|---|---|"]
    for name, entry in summary.items():
        for r in entry["seeds"]:
            rises = [f"{100 * r['rises'][k]:+.1f}%" if k in r["rises"] else "–"
                     for k in ("ramp", "straight_through", "hard")]
            keys = " / ".join(f"{k:.1f}" for k in r["keys_per_query"])
            lines.append(f"| {name} | {r['seed']} | {' | '.join(rises)} | {r['soft_best']:.3f} | {r['final']:.3f} "
                         f"| {'yes' if r['final_at_or_below_soft_best'] else 'no'} | {keys} |")
    return "\n".join(lines)


def plot(summary: dict, path: str) -> None:
    import matplotlib  # noqa: PLC0415 — plotting only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(9, 4.5))
    colors = dict(zip(summary, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for name, entry in summary.items():
        for i, r in enumerate(entry["seeds"]):
            steps = sorted(r["curve"])
            ax.plot(steps, [r["curve"][s] for s in steps], color=colors[name], lw=1.0, alpha=0.85,
                    label=name if i == 0 else None)
    bounds = next(iter(summary.values()))["boundaries"]
    for name, b in bounds.items():
        ax.axvline(b, color="grey", ls=":", lw=0.8)
        ax.text(b, 1.0, name.replace("straight_through", "ST"), rotation=90, transform=ax.get_xaxis_transform(),
                va="top", ha="right", fontsize=8)
    tail = [v for e in summary.values() for r in e["seeds"] for s, v in r["curve"].items() if s >= 40]
    ax.set_xlim(40, None)
    ax.set_ylim(min(tail) - 0.05, max(tail) + 0.05)
    ax.set(xlabel="step", ylabel="validation bits per byte",
           title="validation loss at the default schedule's phase boundaries (one line per run)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120, bbox_inches="tight")


@cli.entry_point
def main(argv=None):
    parser = cli.ArgumentParser(__doc__)
    parser.add_argument("--rows", required=True, help="experiments.lm.grid rows with dense validation curves")
    parser.add_argument("--out", required=True)
    parser.add_argument("--plot")
    args = parser.parse_args(argv)
    rows = [r for r in read_rows(args.rows) if r.get("kind") == "lm"]
    if not rows:
        parser.error(f"--rows: no LM rows in {args.rows}")
    summary = summarise(rows)
    with open(args.out, "w") as f:  # the curves stay in --rows
        json.dump({v: {**e, "seeds": [{k: x for k, x in r.items() if k != "curve"} for r in e["seeds"]]}
                   for v, e in summary.items()}, f, indent=1)
    if args.plot:
        plot(summary, args.plot)
    print(table(summary))


if __name__ == "__main__":
    main()
