"""Label attention through its phases on the byte LM: train loss against step with the phase boundaries, and the
jump of the loss at each switch against the same statistic at ordinary steps (docs/labels.md, "Phase transitions").

    python -m experiments.reports.label_phases --runs runs/lab_smoke_labels_defaults runs/lab_smoke_labels \
        runs/lab_smoke_labels_local_r19 --paired_with runs/lab_smoke_labels_local_r19 \
        --out experiments/results/labels_phases.json --plot docs/img/labels_phases.png

(the full list of runs and their commands: docs/labels.md, "Phase transitions: measurement"). Over seeds:

    python -m experiments.reports.label_phases --seed_pairs runs/lab_s0:runs/local_s0 runs/lab_s1:runs/local_s1 \
        --out experiments/results/labels_phases_3seeds.json

Each run directory is an `experiments.lm` workdir (its metrics.jsonl; a run still going is read as far as it got).

Writes: the --out JSON summary and the --plot PNG.
"""

from __future__ import annotations

import json
import os

import numpy as np

from sparse_attn.studies import cli
from sparse_attn.train import read_metrics

WINDOW = 10  # steps averaged on each side of a switch


def jump_stat(loss: np.ndarray, s: int, w: int = WINDOW) -> float:
    """mean(loss[s : s + w]) - mean(loss[s - w : s]): the change of the train loss across step s."""
    return float(np.mean(loss[s : s + w]) - np.mean(loss[s - w : s]))


def step_fit(loss: np.ndarray, s: int, w: int = 15) -> float:
    """The step at s of a least-squares fit level + slope + step over [s - w, s + w): a jump net of the trend (a loss
    rising steadily through the ramp has no step, but a positive `jump_stat`)."""
    t = np.arange(s - w, s + w, dtype=np.float64)
    design = np.stack([np.ones_like(t), t - s, (t >= s).astype(np.float64)], axis=1)
    return float(np.linalg.lstsq(design, loss[s - w : s + w], rcond=None)[0][2])


PHASE_NAMES = ("soft", "ramp", "straight_through", "hard")


def boundaries(train: dict) -> dict:
    """The steps where layer 0's logged phase changes: {phase name: first step in it}."""
    steps = sorted(train)
    key = next((k for k in train[steps[0]] if k.startswith("layer0/") and k.endswith("/phase") or k == "layer0/phase"),
               None)
    if key is None:
        return {}
    out, prev = {}, train[steps[0]][key]
    for s in steps[1:]:
        if train[s][key] != prev:
            prev = train[s][key]
            out[PHASE_NAMES[int(prev)]] = s - steps[0]  # index into the loss array
    return out


def analyse(workdir: str) -> dict:
    train, valid = read_metrics(workdir, "train"), read_metrics(workdir, "valid")
    steps = np.asarray(sorted(train))
    loss = np.asarray([train[s]["nll"] for s in steps])
    keys = {k: float(np.mean([train[s][k] for s in steps[-20:]])) for k in train[steps[-1]] if "keys_per_query" in k}
    bounds = boundaries(train)
    # The ramp's last 5 steps: the weight its forward still puts on edges the hard pattern drops.
    st = bounds.get("straight_through")
    dropped = {k: float(np.mean([train[s][k] for s in steps[max(st - 5, 0) : st]]))
               for k in train[steps[0]] if k.endswith("dropped_mass")} if st else {}
    return dict(steps=steps.tolist(), train_nll=loss.tolist(), keys_per_query_last20=keys, boundaries=bounds,
                dropped_mass_ramp_end=dropped, valid={int(s): v["bits_per_byte"] for s, v in valid.items()},
                last_train=train[steps[-1]])


def paired_over_seeds(pairs: list[tuple[str, str]]) -> dict:
    """Each (label run, reference run) pair on the same seed's batches: the paired step at each switch, its noise,
    the final validation of both; then mean ± standard error over the pairs."""
    rows = []
    for run, ref in pairs:
        r, a = analyse(run), analyse(ref)
        diff = np.asarray(r["train_nll"]) - np.asarray(a["train_nll"])
        bounds = r["boundaries"]
        far = [s for s in range(40, len(diff) - 15) if all(abs(s - b) >= 30 for b in bounds.values())]
        rows.append(dict(run=run, reference=ref, steps={k: step_fit(diff, b) for k, b in bounds.items()},
                         raw_jumps={k: jump_stat(np.asarray(r["train_nll"]), b) for k, b in bounds.items()},
                         noise_std=float(np.std([step_fit(diff, s) for s in far])),
                         valid=r["valid"][max(r["valid"])], reference_valid=a["valid"][max(a["valid"])],
                         keys_per_query_last20=r["keys_per_query_last20"]))
    summary = {}
    for k in rows[0]["steps"]:
        v = np.asarray([row["steps"][k] for row in rows])
        summary[k] = dict(mean=float(v.mean()), se=float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else None)
    valid = np.asarray([row["valid"] for row in rows])
    ref_valid = np.asarray([row["reference_valid"] for row in rows])
    return dict(pairs=rows, paired_steps=summary, valid_mean=float(valid.mean()), valid_std=float(valid.std(ddof=1)),
                reference_valid_mean=float(ref_valid.mean()), reference_valid_std=float(ref_valid.std(ddof=1)))


@cli.entry_point
def main(argv=None):
    parser = cli.ArgumentParser(__doc__)
    parser.add_argument("--seed_pairs", nargs="+", default=None, metavar="RUN:REFERENCE",
                        help="instead of a plot: label runs each paired with a reference run on the same seed; "
                             "writes the paired steps per seed and their mean ± standard error to --out")
    parser.add_argument("--runs", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--plot")
    parser.add_argument("--paired_with", default=None,
                        help="a run without phases on the same batches (same seed, batch, steps): the jumps of the "
                             "difference, net of batch difficulty and of the trend (`step_fit`)")
    args = parser.parse_args(argv)
    if args.seed_pairs:
        pairs = [tuple(p.split(":")) for p in args.seed_pairs]
        if any(len(pair) != 2 or not all(pair) for pair in pairs):
            parser.error(f"--seed_pairs: each pair is RUN:REFERENCE, got {' '.join(args.seed_pairs)}")
        result = paired_over_seeds(pairs)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print({k: {m: round(x, 4) for m, x in v.items() if x is not None} for k, v in result["paired_steps"].items()},
              f"valid {result['valid_mean']:.3f} ± {result['valid_std']:.3f}, reference "
              f"{result['reference_valid_mean']:.3f} ± {result['reference_valid_std']:.3f}")
        return
    if not args.runs or not args.plot:
        parser.error("--runs and --plot are required without --seed_pairs")
    import matplotlib  # noqa: PLC0415 — plotting only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    results = {}
    fig, (ax, ax_diff) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, height_ratios=(3, 2))
    ref = np.asarray(analyse(args.paired_with)["train_nll"]) if args.paired_with else None
    for workdir in args.runs:
        name = os.path.basename(os.path.normpath(workdir))
        r = analyse(workdir)
        loss = np.asarray(r["train_nll"])
        n = len(loss)
        bounds = r["boundaries"]
        # The jump statistic at ordinary steps (at least 2 windows from a switch and from the warm-up), as noise.
        far = [s for s in range(40, n - WINDOW) if all(abs(s - b) >= 2 * WINDOW for b in bounds.values())]
        ordinary = np.asarray([jump_stat(loss, s) for s in far])
        r["noise_std"] = float(np.std(ordinary))
        r["jumps"] = {k: jump_stat(loss, b) for k, b in bounds.items() if WINDOW <= b <= n - WINDOW}
        last = max(r["valid"]) if r["valid"] else None  # a run still going: its latest evaluation
        if ref is not None:
            diff = loss[: len(ref)] - ref[: len(loss)]
            m = len(diff)
            far_fit = [s for s in range(40, m - 15) if all(abs(s - b) >= 30 for b in bounds.values())]
            r["paired"] = dict(reference=args.paired_with,
                               steps={k: step_fit(diff, b) for k, b in bounds.items() if 15 <= b <= m - 15},
                               noise_std=float(np.std([step_fit(diff, s) for s in far_fit])))
        r["final_valid_bits_per_byte"] = r["valid"][last] if last is not None else float("nan")
        r["final_valid_step"], r["train_steps"] = last, n
        results[name] = r
        smooth = np.convolve(loss, np.ones(5) / 5, mode="valid")
        line = ax.plot(np.arange(len(smooth)) + 3, smooth / np.log(2), lw=1.0, label=name)[0]
        if ref is not None:
            d = np.convolve(loss[: len(ref)] - ref[: len(loss)], np.ones(5) / 5, mode="valid")
            ax_diff.plot(np.arange(len(d)) + 3, d / np.log(2), lw=1.0, color=line.get_color())
        for k, b in bounds.items():
            for a in (ax, ax_diff):
                a.axvline(b, color=line.get_color(), ls=":", lw=0.8)
            ax.text(b, 1.0, k.replace("straight_through", "ST"), color=line.get_color(), rotation=90,
                    transform=ax.get_xaxis_transform(), va="top", ha="right", fontsize=7)
    start = min(40, len(loss) // 4)  # past the warm-up's fast fall, so the switches are visible
    ax.set_xlim(start, None)
    tail = [np.asarray(r["train_nll"])[start:] / np.log(2) for r in results.values()]
    ax.set_ylim(min(t.min() for t in tail) - 0.05, np.percentile(np.concatenate(tail), 99.5) + 0.1)
    ax.set(ylabel="train bits per byte (5-step mean)", title="label attention through its phases")
    ax_diff.set(xlabel="step", ylabel=f"minus {os.path.basename(os.path.normpath(args.paired_with or ''))}"
                if ref is not None else "")
    for a in (ax, ax_diff):
        a.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(args.plot, dpi=120, bbox_inches="tight")
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    for name, r in results.items():
        print(name, f"steps {r['train_steps']}, valid bits/byte {r['final_valid_bits_per_byte']:.4f} at step "
              f"{r['final_valid_step']}",
              "keys/query", r["keys_per_query_last20"], "jumps", {k: round(v, 4) for k, v in r["jumps"].items()},
              f"noise std {r['noise_std']:.4f}",
              "dropped mass at the ramp's end", {k: round(v, 4) for k, v in r["dropped_mass_ramp_end"].items()},
              *(["paired steps", {k: round(v, 4) for k, v in r["paired"]["steps"].items()},
                 f"paired noise std {r['paired']['noise_std']:.4f}"] if "paired" in r else []))


if __name__ == "__main__":
    main()
