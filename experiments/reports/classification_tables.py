"""The classification rows as tables: result lines grouped by (task, config, n, attention) and summarized over
seeds, the headline and detail tables of docs/results.md's classification section."""

from __future__ import annotations

import collections
import functools
import glob
import json
import math
import os
import statistics

from sparse_attn.studies.tasks import make_task

BEGIN = "<!-- classification:begin (python -m experiments.reports.results writes this section) -->"
END = "<!-- classification:end -->"
NOTE_FILE = "classify_note.md"  # the machine, its load and the scale of the runs in results_dir

# Majority-class accuracy (docs/tasks.md), the floor a model that learned nothing reaches, for rows that do not
# say how many validation examples they used; otherwise `majority` counts the labels of those examples.
CHANCE = {"listops": 0.19, "dyck": 0.5, "pathfinder": 0.5, "digits": 0.1, "cifar10": 0.1}
AT_CHANCE_PTS = 2.0  # accuracy within this many points of the majority class counts as "at chance"


@functools.lru_cache(maxsize=64)
def majority(task: str, n: int, num_validation: int | None) -> float | None:
    """Accuracy of always answering the most frequent label on the first `num_validation` validation examples."""
    if not num_validation:
        return CHANCE.get(task)
    try:
        source = make_task(task, n, num_train=1, num_validation=num_validation).source("validation")
    except (ValueError, ImportError, FileNotFoundError):  # unknown task, missing extra or data
        return CHANCE.get(task)
    count = min(len(source), num_validation)
    labels = collections.Counter(int(source[i]["label"]) for i in range(count))
    return max(labels.values()) / count if count else None
HIERARCHICAL = ("listops", "dyck")
IMAGES = ("pathfinder", "digits", "cifar10")
SEED_MECHANISM = "noncrossing_defect"  # seed 002's mechanism (non-crossing routing, defect-pair router)

HOW_TO_RUN = """### How to run

```bash
# one cell (a workdir under runs/classify/; re-running resumes)
python -m experiments.classification --task dyck --n 128 --attention noncrossing_defect --config cpu --num_steps 600 \\
    --results experiments/results/dyck.jsonl
# the CPU grid, one cell at a time in its priority order (rerun to resume, finished cells are skipped)
nice -n 10 python -m experiments.classification.grid --grid cpu --config cpu --time_limit 1200 --deadline 07:55
# seed scale on one GPU: as many `seed` cells as fit the budget, results and this report under $OUT (on a lent
# device it runs as a stage of `python -m experiments.gpu.session`: docs/kernels.md, "One device call")
python -m experiments.gpu.classify --budget 570 --out "$OUT"
python -m experiments.reports.results   # this section (add --results_dir "$OUT" for the GPU rows alone)
```
"""

COLUMNS = """### Columns

* **seeds**: runs (init and batch-order seeds) in the row; the data set is the same for every seed.
* **accuracy**: validation accuracy over real examples, mean ± sample std over seeds; **Δ dense**: mean minus
  dense's mean at the same task, n and config, in points (1 point = 0.01). **chance**: the majority class.
* **attn/dense**: allowed attention pairs relative to dense (mean over layers): the attention memory of an
  implementation that stores one score per allowed pair. **peak MiB**: XLA's compiled memory analysis of the
  whole train step (arguments + outputs − aliased + temporaries), with its ratio to dense.
* **train FLOP**: total training FLOPs, 6 · params · tokens for projections and MLPs plus 3 × each layer's
  forward attention FLOPs from its pattern (sparse_attn/studies/classification.py).
* **ms/step**: wall clock of the training loop (evaluations included) and **load**: the 1-minute load average
  sampled every 5 s during the cell (experiments/classification/grid.py). On the shared CPU machine both vary with
  the other jobs: compare times only at similar load.
* **layer statistics**: per layer, keys per query and, where the mechanism reports them, ABCA anchors per
  sequence, zone size and inserted anchors, label attention's degree and disconnected fraction, routing's
  surviving arcs; every statistic is in the JSONL rows.
* **command**: the command of the row's first seed (`--seed` selects the others), under the script's current
  module name (rows from before the experiments/ folders recorded `experiments.classify`; the flags are the same);
  the rows also hold the commit the code was taken from (`git_commit`).
"""


# Old module name -> current, for the commands rows recorded before the scripts moved into folders (issue 36).
MOVED = {"python -m experiments.classify ": "python -m experiments.classification "}


def current_command(command: str) -> str:
    """`command` as recorded, its module renamed to the one that runs it now."""
    for old, new in MOVED.items():
        if command.startswith(old):
            return new + command[len(old):]
    return command


def load_rows(results_dir: str) -> list[dict]:
    """Every `kind == "classify"` line of `<results_dir>/*.jsonl` (unreadable lines skipped)."""
    rows = []
    for path in sorted(glob.glob(os.path.join(results_dir, "*.jsonl"))):
        with open(path) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(row, dict) and row.get("kind") == "classify" and "task" in row:
                    rows.append(row)
    return rows


def _first(d: dict | None, *keys):
    """The first of `keys` present (not None) in `d`: statistics were renamed between runs."""
    for k in keys:
        if d and d.get(k) is not None:
            return d[k]
    return None


def _attn_ratio(layer: dict):
    return _first(layer, "attn_vs_dense", "attn_flops_vs_dense", "pairs_vs_dense")


def _keys(layer: dict):
    return _first(layer, "keys_per_query", "keys_per_live_query", "mean_keys_per_query")


def _peak(row: dict):
    mem = row.get("memory_mib") or {}
    if mem.get("peak_mib") is not None:
        return mem["peak_mib"]
    if mem.get("temp_mib") is not None:
        return (mem.get("argument_mib", 0) + mem.get("output_mib", 0) - mem.get("alias_mib", 0) + mem["temp_mib"])
    return None


def _load(row: dict):
    load = row.get("load")
    return load.get("mean") if isinstance(load, dict) else load


def _mean(values):
    values = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.fmean(values) if values else None


# Layer statistics shown in the table (all of them are in the JSONL rows).
# Each short name reads the first of its keys present: `{mechanism}/{key}` since statistics are filed by
# mechanism (docs/architecture.md, "Statistics"), the bare key in older rows.
STATS = {"anchors": ("abca/anchors",), "zone": ("abca/mean_zone",), "inserted": ("abca/inserted_anchors",),
         "degree": ("labels/mean_degree", "mean_degree"),
         "disconnected": ("labels/frac_disconnected", "frac_disconnected"), "arcs": ("noncrossing/arcs", "arcs")}


def _layer_stats(runs: list[dict]) -> str:
    """`L0 keys 28.8; L1 keys 3.0 arcs 1.2`: keys per query and the listed statistics, mean over seeds."""
    parts = []
    for i in range(max((len(r.get("layers", [])) for r in runs), default=0)):
        layers = [r["layers"][i] for r in runs if len(r.get("layers", [])) > i]
        vals = {"keys": _mean(_keys(layer) for layer in layers)}
        for short, keys in STATS.items():
            vals[short] = _mean(_first(layer.get("stats"), *keys) for layer in layers)
        shown = " ".join(f"{k} {v:.3g}" for k, v in vals.items() if v is not None)
        parts.append(f"L{i} {shown}" if shown else f"L{i} –")
    return "; ".join(parts) or "–"


def _mean_curve(runs: list[dict]) -> list[tuple[float, float]]:
    """(train FLOPs, validation loss) at each evaluation step, mean over the seeds that have it."""
    by_step = collections.defaultdict(list)
    for r in runs:
        for point in r.get("curve") or []:
            if point.get("valid_loss") is not None and point.get("train_flops") is not None:
                by_step[point["step"]].append((point["train_flops"], point["valid_loss"]))
    return [(statistics.fmean(f for f, _ in pts), statistics.fmean(v for _, v in pts))
            for _, pts in sorted(by_step.items())]


def _fmt(v, spec):
    return "–" if v is None else format(v, spec)


def summarize(rows: list[dict]) -> list[dict]:
    """One entry per (task, config, n, attention, steps), seeds pooled; the latest row of a repeated seed wins.
    Entries gain `delta` (points vs dense) and `peak_ratio` (vs dense) where dense ran the same cell."""
    groups = collections.defaultdict(dict)
    for row in rows:
        key = (row["task"], row.get("config", ""), row["n"], row["attention"], row.get("steps") or 0)
        groups[key][row.get("seed")] = row
    out = []
    for (task, config, n, attention, _), by_seed in sorted(
            groups.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]), kv[0][2], kv[0][4], _order(kv[0][3]))):
        runs = [by_seed[s] for s in sorted(by_seed, key=str)]
        accs = [r["accuracy"] for r in runs if r.get("accuracy") is not None]
        buckets = collections.defaultdict(list)
        for r in runs:
            for label, b in (r.get("accuracy_by_bucket") or {}).items():
                if b and b.get("accuracy") is not None:
                    buckets[label].append(b["accuracy"])
        out.append({
            "task": task, "config": config, "n": n, "attention": attention, "seeds": len(runs),
            "acc": _mean(accs), "acc_std": statistics.stdev(accs) if len(accs) > 1 else None,
            "buckets": {k: statistics.fmean(v) for k, v in buckets.items()},
            "loss": _mean(r.get("valid_loss") for r in runs),
            "flop": _mean((r.get("flops") or {}).get("total") for r in runs),
            "attn_ratio": _mean(_mean(_attn_ratio(layer) for layer in r.get("layers", [])) for r in runs),
            "peak": _mean(_peak(r) for r in runs),
            "temp": _mean((r.get("memory_mib") or {}).get("temp_mib") for r in runs),
            "ms": _mean(1e3 * r["step_s"] if r.get("step_s") else None for r in runs),
            "tok_s": _mean(r.get("tokens_per_s") for r in runs),
            "load": _mean(_load(r) for r in runs),
            "layer_stats": _layer_stats(runs),
            "curve": _mean_curve(runs),
            "steps": runs[0].get("steps"), "backend": runs[0].get("backend", "?"),
            "commits": sorted({str(r["git_commit"]) for r in runs if r.get("git_commit")}),
            "command": current_command(runs[0].get("command", "")),
            "chance": majority(task, n, runs[0].get("num_validation")),
            "delta": None, "peak_ratio": None, "delta_std": None,
        })
    dense = {(e["task"], e["config"], e["n"], e["steps"]): e for e in out if e["attention"] == "dense"}
    for e in out:
        d = dense.get((e["task"], e["config"], e["n"], e["steps"]))
        if d is None or e["attention"] == "dense":
            continue
        if d["acc"] is not None and e["acc"] is not None:
            e["delta"] = 100 * (e["acc"] - d["acc"])
            if e["acc_std"] is not None and d["acc_std"] is not None:  # std of the difference of the means
                e["delta_std"] = 100 * math.sqrt(e["acc_std"] ** 2 / e["seeds"] + d["acc_std"] ** 2 / d["seeds"])
        if d["peak"] and e["peak"] is not None:
            e["peak_ratio"] = e["peak"] / d["peak"]
    return out


def _pts(v):
    return "–" if v is None else f"{v + 0.0:+.1f}".replace("-0.0", "+0.0")  # no negative zero


ORDER = ("dense", "local", "longformer", "bigbird", "abca", "abca_fixed", "abca_learned", "labels",
         "noncrossing_defect", "noncrossing_brick", "noncrossing_adjacent")


def _order(attention: str) -> tuple:
    return (ORDER.index(attention), "") if attention in ORDER else (len(ORDER), attention)


def headline_table(entries: list[dict]) -> str:
    head = ("| n | attention | seeds | steps | accuracy | Δ dense (pts) | attn/dense | peak MiB (× dense) "
            "| train FLOP | ms/step | load | command |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for e in entries:
        acc = _fmt(e["acc"], ".3f") + ("" if e["acc_std"] is None else f" ± {e['acc_std']:.3f}")
        if e["acc"] is not None and e["chance"] is not None and e["acc"] <= e["chance"] + AT_CHANCE_PTS / 100:
            acc += " (chance)"
        delta = "–" if e["delta"] is None else _pts(e["delta"]) + (
            "" if e["delta_std"] is None else f" ± {e['delta_std']:.1f}")
        peak = _fmt(e["peak"], ".1f") + ("" if e["peak_ratio"] is None else f" ({e['peak_ratio']:.2f}×)")
        lines.append(
            f"| {e['n']} | {e['attention']} | {e['seeds']} | {e['steps']} | {acc} | {delta} "
            f"| {_fmt(e['attn_ratio'], '.2f')} | {peak} | {_fmt(e['flop'], '.3g')} | {_fmt(e['ms'], '.0f')} "
            f"| {_fmt(e['load'], '.1f')} | `{e['command']}` |")
    return "\n".join(lines)


def detail_table(entries: list[dict]) -> str:
    head = ("| n | attention | seeds | accuracy | by bucket | loss | temp MiB | tokens/s | layer statistics "
            "| commits |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for e in entries:
        acc = _fmt(e["acc"], ".3f") + ("" if e["acc_std"] is None else f" ± {e['acc_std']:.3f}")
        buckets = ", ".join(f"{k}: {v:.2f}" for k, v in e["buckets"].items()) or "–"
        lines.append(
            f"| {e['n']} | {e['attention']} | {e['seeds']} | {acc} | {buckets} | {_fmt(e['loss'], '.3f')} "
            f"| {_fmt(e['temp'], '.1f')} | {_fmt(e['tok_s'], ',.0f')} | {e['layer_stats']} "
            f"| {', '.join(e['commits']) or '–'} |")
    return "\n".join(lines)


