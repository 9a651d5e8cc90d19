"""The classification rows as tables: result lines grouped by (task, config, n, mechanism) and summarized over
seeds; the headline tables of docs/results.md's classification section and the detail tables of its companion file
(experiments/results/classification_details.md)."""

from __future__ import annotations

import collections
import functools
import glob
import math
import os
import re
import statistics

from experiments.reports.rows import mechanism, read_rows
from sparse_attn.studies.tasks import make_task

BEGIN = "<!-- classification:begin (python -m experiments.reports.results writes this section) -->"
END = "<!-- classification:end -->"
DETAILS_FILE = "classification_details.md"  # the companion file: every column of every cell

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
SEED_MECHANISM = "noncrossing_defect"  # the non-crossing research document's mechanism (defect-pair router)

LEGEND = """**accuracy**: mean ± sample std over seeds (init and batch order); **Δ dense**: minus dense's mean in the
same cell, in points; **(chance)**: within 2 points of the majority class; **attn/dense**: allowed attention pairs
relative to dense; **peak MiB**: XLA's compiled memory of the whole train step, with its ratio to dense.
"""

DETAILS_COLUMNS = """Columns: **by bucket**: accuracy per task-specific bucket (nesting depth, distance), mean over seeds;
**loss**: validation loss; **temp MiB**: the compiled step's temporaries; **train FLOP**: 6 · params · tokens for
projections and MLPs plus 3 × each layer's forward attention FLOPs from its pattern
(sparse_attn/studies/classification.py); **ms/step** and **tokens/s**: wall clock of the training loop (evaluations
included) and **load**: the 1-minute load average sampled during the cell, on a CPU shared with other jobs, so
times compare only at similar load; **layer statistics**: per layer, keys per query and, where the mechanism
reports them, ABCA anchors per sequence, zone size and inserted anchors, label attention's degree and disconnected
fraction, routing's surviving arcs; **command**: the first seed's (`--seed` selects the others), under the module
name that runs it now.
"""


# Old module name -> current, for the commands rows recorded before the scripts moved into folders.
MOVED = {"python -m experiments.classify ": "python -m experiments.classification "}
# Old flag or value -> current, for the commands rows recorded before the renames (CHANGELOG.md).
RENAMED = {" --attention ": " --mechanism ", " --config seed ": " --config full "}
FULL_CONFIGS = ("full", "seed")  # the research document's scale (`seed` before the rename)
# An absolute path into the checkout the row ran in (`/somewhere/runs/grid/...`): shown from the repository root.
CHECKOUT_PATH = re.compile(r"(?<=\s)/\S*?/(?=(?:runs|experiments)/)")


def current_command(command: str) -> str:
    """`command` as recorded, under the module and flag names that run it now, its paths relative to the repository
    root."""
    for old, new in MOVED.items():
        if command.startswith(old):
            command = new + command[len(old):]
            break
    for old, new in RENAMED.items():
        command = command.replace(old, new)
    return CHECKOUT_PATH.sub("", command)


def load_rows(results_dir: str) -> list[dict]:
    """Every `kind == "classify"` line of `<results_dir>/*.jsonl` (unreadable lines skipped)."""
    return [row for path in sorted(glob.glob(os.path.join(results_dir, "*.jsonl"))) for row in read_rows(path)
            if row.get("kind") == "classify" and "task" in row and mechanism(row) is not None]


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
    """One entry per (task, config, n, mechanism, steps), seeds pooled; the latest row of a repeated seed wins.
    Entries gain `delta` (points vs dense) and `peak_ratio` (vs dense) where dense ran the same cell."""
    groups = collections.defaultdict(dict)
    for row in rows:
        key = (row["task"], row.get("config", ""), row["n"], mechanism(row), row.get("steps") or 0)
        groups[key][row.get("seed")] = row
    out = []
    for (task, config, n, name, _), by_seed in sorted(
            groups.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]), kv[0][2], kv[0][4], _order(kv[0][3]))):
        runs = [by_seed[s] for s in sorted(by_seed, key=str)]
        accs = [r["accuracy"] for r in runs if r.get("accuracy") is not None]
        buckets = collections.defaultdict(list)
        for r in runs:
            for label, b in (r.get("accuracy_by_bucket") or {}).items():
                if b and b.get("accuracy") is not None:
                    buckets[label].append(b["accuracy"])
        out.append({
            "task": task, "config": config, "n": n, "mechanism": name, "seeds": len(runs),
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
    dense = {(e["task"], e["config"], e["n"], e["steps"]): e for e in out if e["mechanism"] == "dense"}
    for e in out:
        d = dense.get((e["task"], e["config"], e["n"], e["steps"]))
        if d is None or e["mechanism"] == "dense":
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


def _order(name: str) -> tuple:
    return (ORDER.index(name), "") if name in ORDER else (len(ORDER), name)


def _acc(e: dict) -> str:
    return _fmt(e["acc"], ".3f") + ("" if e["acc_std"] is None else f" ± {e['acc_std']:.3f}")


def headline_table(entries: list[dict]) -> str:
    head = "| n | mechanism | seeds | steps | accuracy | Δ dense (pts) | attn/dense | peak MiB (× dense) |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for e in entries:
        acc = _acc(e)
        if e["acc"] is not None and e["chance"] is not None and e["acc"] <= e["chance"] + AT_CHANCE_PTS / 100:
            acc += " (chance)"
        delta = "–" if e["delta"] is None else _pts(e["delta"]) + (
            "" if e["delta_std"] is None else f" ± {e['delta_std']:.1f}")
        peak = _fmt(e["peak"], ".1f") + ("" if e["peak_ratio"] is None else f" ({e['peak_ratio']:.2f}×)")
        lines.append(f"| {e['n']} | {e['mechanism']} | {e['seeds']} | {e['steps']} | {acc} | {delta} "
                     f"| {_fmt(e['attn_ratio'], '.2f')} | {peak} |")
    return "\n".join(lines)


def detail_table(entries: list[dict]) -> str:
    head = ("| n | mechanism | seeds | steps | accuracy | by bucket | loss | temp MiB | train FLOP | ms/step | load "
            "| tokens/s | layer statistics | commits | command |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for e in entries:
        buckets = ", ".join(f"{k}: {v:.2f}" for k, v in e["buckets"].items()) or "–"
        lines.append(
            f"| {e['n']} | {e['mechanism']} | {e['seeds']} | {e['steps']} | {_acc(e)} | {buckets} "
            f"| {_fmt(e['loss'], '.3f')} | {_fmt(e['temp'], '.1f')} | {_fmt(e['flop'], '.3g')} | {_fmt(e['ms'], '.0f')} "
            f"| {_fmt(e['load'], '.1f')} | {_fmt(e['tok_s'], ',.0f')} | {e['layer_stats']} "
            f"| {', '.join(e['commits']) or '–'} | `{e['command']}` |")
    return "\n".join(lines)
