"""Label attention through its phases on the byte LM: train loss against step with the phase boundaries, and the
jump of the loss at each switch against the same statistic at ordinary steps (docs/labels.md, "Phase transitions").

    python -m experiments.plot_label_phases --runs runs/lab_smoke_labels runs/lab_smoke_labels_no_ramp \
        runs/lab_smoke_labels_local --out experiments/results/labels_phases.json --plot docs/img/labels_phases.png

Each run directory is an `experiments.lm` workdir (its metrics.jsonl; a run still going is read as far as it got).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from sparse_attn.train import read_metrics

WINDOW = 10  # steps averaged on each side of a switch


def jump_stat(loss: np.ndarray, s: int, w: int = WINDOW) -> float:
    """mean(loss[s : s + w]) - mean(loss[s - w : s]): the change of the train loss across step s."""
    return float(np.mean(loss[s : s + w]) - np.mean(loss[s - w : s]))


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
    return dict(steps=steps.tolist(), train_nll=loss.tolist(), keys_per_query_last20=keys, boundaries=boundaries(train),
                valid={int(s): v["bits_per_byte"] for s, v in valid.items()}, last_train=train[steps[-1]])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", nargs="+", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--plot", required=True)
    args = parser.parse_args(argv)
    import matplotlib  # noqa: PLC0415 — plotting only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    results = {}
    fig, ax = plt.subplots(figsize=(9, 4.5))
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
        r["final_valid_bits_per_byte"] = r["valid"][last] if last is not None else float("nan")
        r["final_valid_step"], r["train_steps"] = last, n
        results[name] = r
        smooth = np.convolve(loss, np.ones(5) / 5, mode="valid")
        line = ax.plot(np.arange(len(smooth)) + 3, smooth / np.log(2), lw=1.0, label=name)[0]
        for k, b in bounds.items():
            ax.axvline(b, color=line.get_color(), ls=":", lw=0.8)
            ax.text(b, 1.0, k.replace("straight_through", "ST"), color=line.get_color(), rotation=90,
                    transform=ax.get_xaxis_transform(), va="top", ha="right", fontsize=7)
    ax.set(xlabel="step", ylabel="train bits per byte (5-step mean)", title="label attention through its phases")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(args.plot, dpi=120, bbox_inches="tight")
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    for name, r in results.items():
        print(name, f"steps {r['train_steps']}, valid bits/byte %.4f at step {r['final_valid_step']}"
              % r["final_valid_bits_per_byte"],
              "keys/query", r["keys_per_query_last20"], "jumps", {k: round(v, 4) for k, v in r["jumps"].items()},
              "noise std %.4f" % r["noise_std"])


if __name__ == "__main__":
    main()
