"""Render the classification section of docs/results.md (tables, seed-002 verdicts, PNG plots) from the result
lines in experiments/results/*.jsonl.

    .venv/bin/python -m experiments.reports.results [--results_dir DIR --out FILE --plots_dir DIR]

Works on whatever rows exist: rows are grouped by (task, config, n, attention) and summarized over seeds. Only
the part of `--out` between the classification markers is rewritten, so other sections (e.g. language
modelling) can live in the same file; to a page without the markers the section is appended. Rows from before and
after renames of per-layer statistics are read alike (`_first`). The same command then renders the language-modelling
and retrieval sections (`experiments.reports.lm`, plots in the page's img/ folder).
"""

from __future__ import annotations

import argparse
import collections
import functools
import glob
import json
import math
import os
import statistics

from experiments.reports import lm as report_lm
from experiments.reports.doc_sections import write_section
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
  forward attention FLOPs from its pattern (experiments/classify_metrics.py).
* **ms/step**: wall clock of the training loop (evaluations included) and **load**: the 1-minute load average
  sampled every 5 s during the cell (experiments/classification/grid.py). On the shared CPU machine both vary with
  the other jobs: compare times only at similar load.
* **layer statistics**: per layer, keys per query and, where the mechanism reports them, ABCA anchors per
  sequence, zone size and inserted anchors, label attention's degree and disconnected fraction, routing's
  surviving arcs; every statistic is in the JSONL rows.
* **command**: the command of the row's first seed (`--seed` selects the others); the rows also hold the commit
  the code was taken from (`git_commit`).
"""


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
            "command": runs[0].get("command", ""),
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


# ---------------------------------------------------------------------------------------------- verdicts

def _pts(v):
    return "–" if v is None else f"{v + 0.0:+.1f}".replace("-0.0", "+0.0")  # no negative zero


def cell_label(e: dict, entries: list[dict], sep: str = " ") -> str:
    """`task<sep>n`, with the step count where the same task and n ran at more than one."""
    steps = {x["steps"] for x in entries if (x["task"], x["config"], x["n"]) == (e["task"], e["config"], e["n"])}
    return f"{e['task']}{sep}{e['n']}" + (f" ({e['steps']} steps)" if len(steps) > 1 else "")


def separation(entries: list[dict]) -> list[str]:
    """Does dense beat local (and chance) on each (task, n)? Without that the task cannot rank mechanisms."""
    out = []
    by = {(e["task"], e["config"], e["n"], e["steps"], e["attention"]): e for e in entries}
    for (task, config, n, steps, att), e in sorted(by.items(), key=lambda kv: tuple(map(str, kv[0]))):
        if att != "local":
            continue
        d = by.get((task, config, n, steps, "dense"))
        if d is None or d["acc"] is None or e["acc"] is None:
            continue
        gap = -e["delta"]
        chance = d["chance"]
        above = "" if chance is None else (
            f"; dense is {_pts(100 * (d['acc'] - chance))} points from the majority class ({chance:.3f})")
        if d["loss"] is not None and e["loss"] is not None:  # loss moves before accuracy does at short budgets
            above += f"; validation loss dense {d['loss']:.3f} vs local {e['loss']:.3f}"
        cell = cell_label(e, entries, sep=" n=")
        if e["delta_std"] is None:  # one seed somewhere: no spread to compare the gap with
            out.append(f"* {cell} ({config}): one seed only, dense − local = {_pts(gap)} points (no spread "
                       f"to judge it by){above}.")
            continue
        verdict = "separates" if gap > max(1.0, 2 * e["delta_std"]) else "does **not** separate"
        out.append(f"* {cell} ({config}): dense {verdict} from local "
                   f"(dense − local = {_pts(gap)} ± {e['delta_std']:.1f} points, 2 σ needed){above}.")
    return out


def claim_hierarchical(entries: list[dict], mechanism: str, config: str) -> dict:
    """Seed 002's claim on ListOps/Dyck: within 1 point of dense at >= 2x less attention memory, every cell."""
    cells = [e for e in entries if e["attention"] == mechanism and e["config"] == config
             and e["task"] in HIERARCHICAL and e["delta"] is not None]
    if not cells:
        return {"answer": None, "cells": []}
    within = all(e["delta"] >= -1.0 for e in cells)
    pairs = all(e["attn_ratio"] is not None and e["attn_ratio"] <= 0.5 for e in cells)
    peak = all(e["peak_ratio"] is not None and e["peak_ratio"] <= 0.5 for e in cells)
    missing = sorted(set(HIERARCHICAL) - {e["task"] for e in cells})  # the answer covers the tasks run only
    return {"answer": within and pairs, "within": within, "pairs": pairs, "peak": peak, "cells": cells,
            "missing": missing}


def claim_images(entries: list[dict], mechanism: str, config: str) -> dict:
    """Seed 002's claim on images: the mechanism fails (more than 1 point below dense) on every image cell."""
    cells = [e for e in entries if e["attention"] == mechanism and e["config"] == config
             and e["task"] in IMAGES and e["delta"] is not None]
    if not cells:
        return {"answer": None, "cells": []}
    return {"answer": all(e["delta"] < -1.0 for e in cells), "cells": cells}


def informative(entries: list[dict], config: str) -> str:
    """How many (task, n) cells can rank mechanisms: dense above chance and ahead of local by 2 sigma."""
    dense = [e for e in entries if e["config"] == config and e["attention"] == "dense" and e["acc"] is not None]
    local = {(e["task"], e["n"], e["steps"]): e for e in entries if e["config"] == config and e["attention"] == "local"}
    above = [d for d in dense if d["chance"] is not None and d["acc"] > d["chance"] + AT_CHANCE_PTS / 100]
    ahead = [d for d in above if (loc := local.get((d["task"], d["n"], d["steps"]))) is not None
             and loc["delta_std"] is not None and -loc["delta"] > max(1.0, 2 * loc["delta_std"])]
    name = lambda es: ", ".join(cell_label(e, entries) for e in es) or "none"  # noqa: E731
    return (f"Dense is above chance (more than {AT_CHANCE_PTS:g} points over the majority class) on "
            f"{len(above)} of {len(dense)} task/length cells ({name(above)}) and ahead of local by 2 σ on "
            f"{len(ahead)} ({name(ahead)}). Where it is neither, \"within 1 point of dense\" and \"fails\" "
            "compare models that have not learned the task, and the answers above carry no evidence either way.")


def _yes(v):
    return "n/a (no cells)" if v is None else ("**yes**" if v else "**no**")


def verdicts(entries: list[dict]) -> str:
    lines = []
    configs = sorted({e["config"] for e in entries if e["delta"] is not None})
    for config in configs:
        mechanisms = sorted({e["attention"] for e in entries if e["config"] == config and e["attention"] != "dense"},
                            key=_order)
        lines.append(f"**Config `{config}`.** Claim 1: within 1 point of dense on ListOps and Dyck (every n run) "
                     "at ≥ 2× less attention memory (attn/dense ≤ 0.5; the measured whole-step peak is shown "
                     "beside it). Claim 2: fails on images (more than 1 point below dense at every n run).\n")
        lines.append("| mechanism | claim 1 | within 1 pt (Δ per cell) | attn/dense ≤ 0.5 | step peak ≤ 0.5× dense "
                     "| claim 2 (fails on images) | Δ on images |")
        lines.append("|---|---|---|---|---|---|---|")
        for m in mechanisms:
            h, im = claim_hierarchical(entries, m, config), claim_images(entries, m, config)
            hd = ", ".join(f"{cell_label(e, entries)}: {_pts(e['delta'])}" for e in h["cells"]) or "–"
            idl = ", ".join(f"{cell_label(e, entries)}: {_pts(e['delta'])}" for e in im["cells"]) or "–"
            name = f"**{m}** (seed 002's)" if m == SEED_MECHANISM else m
            only = f" (no {', '.join(h['missing'])} cells)" if h.get("missing") else ""
            lines.append(f"| {name} | {_yes(h['answer'])}{only} | {_yes(h.get('within'))}: {hd} | {_yes(h.get('pairs'))} "
                         f"| {_yes(h.get('peak'))} | {_yes(im['answer'])} | {idl} |")
        lines.append("")
        if SEED_MECHANISM in mechanisms:
            h, im = claim_hierarchical(entries, SEED_MECHANISM, config), claim_images(entries, SEED_MECHANISM, config)
            lines.append(f"**Answers for seed 002's mechanism ({SEED_MECHANISM}, `{config}`): claim 1 "
                         f"{_yes(h['answer'])}; claim 2 {_yes(im['answer'])}.**\n")
        lines.append(informative(entries, config) + "\n")
        sep = separation([e for e in entries if e["config"] == config])
        if sep:
            lines.append("Whether the tasks can tell mechanisms apart at this scale (a claim of \"within 1 point "
                         "of dense\" means little where dense does not beat local or chance):\n")
            lines += sep
            lines.append("")
    return "\n".join(lines)


def losses(entries: list[dict]) -> str:
    """Plain sentences for every cell where a mechanism loses to dense: accuracy, step memory, time per step."""
    out = []
    by = {(e["task"], e["config"], e["n"], e["steps"], e["attention"]): e for e in entries}
    for e in entries:
        if e["attention"] == "dense":
            continue
        d = by.get((e["task"], e["config"], e["n"], e["steps"], "dense"))
        if d is None:
            continue
        what = []
        if e["delta"] is not None and e["delta"] < -1.0:
            what.append(f"accuracy {_pts(e['delta'])} points")
        if e["peak_ratio"] is not None and e["peak_ratio"] > 1.05:
            what.append(f"{e['peak_ratio']:.2f}× dense's step memory")
        if e["ms"] and d["ms"] and e["ms"] > 1.5 * d["ms"]:
            what.append(f"{e['ms'] / d['ms']:.1f}× dense's time per step (load {_fmt(e['load'], '.0f')} vs "
                        f"{_fmt(d['load'], '.0f')})")
        if what:
            cell = cell_label(e, entries, sep=" n=")
            out.append(f"* {e['attention']} on {cell} ({e['config']}): {'; '.join(what)}.")
    return "\n".join(out) if out else "No mechanism loses to dense by these measures."


# ---------------------------------------------------------------------------------------------- plots

def plot_task(task: str, entries: list[dict], plots_dir: str) -> list[str]:
    """`classify_<task>_{acc_vs_n,acc_vs_memory,loss_vs_flops}.png`, one series per (config, attention)."""
    from matplotlib.figure import Figure  # noqa: PLC0415 — only the report needs it

    series = collections.defaultdict(list)
    for e in entries:
        if e["acc"] is not None:
            series[(e["config"], e["attention"])].append(e)
    curves = {(e["config"], e["attention"], e["n"]): e["curve"] for e in entries if e["curve"]}
    paths = []
    for kind in ("n", "memory", "flops"):
        fig = Figure(figsize=(7, 4.2))
        ax = fig.add_subplot()
        if kind == "flops":
            for (config, attention, n), curve in sorted(curves.items(), key=lambda kv: (kv[0][0], kv[0][2],
                                                                                        _order(kv[0][1]))):
                ax.plot([f for f, _ in curve], [v for _, v in curve], marker=".",
                        label=f"{attention} n={n} ({config})")
            ax.set_xscale("log")
            ax.set(xlabel="training FLOPs", ylabel="validation loss (nats)", title=f"{task}: loss per training FLOP")
            if curves:
                ax.legend(fontsize=6, ncol=2)
        else:
            for (config, attention), es in sorted(series.items(), key=lambda kv: (kv[0][0], _order(kv[0][1]))):
                es = sorted(es, key=lambda e: e["n"])
                label = f"{attention} ({config})"
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
        name = {"n": "acc_vs_n", "memory": "acc_vs_memory", "flops": "loss_vs_flops"}[kind]
        path = os.path.join(plots_dir, f"classify_{task}_{name}.png")
        fig.savefig(path, dpi=100, bbox_inches="tight")
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------------------------- page

def section(rows: list[dict], entries: list[dict], *, out: str, plots_dir: str, note: str) -> tuple[str, list[str]]:
    """The classification section's markdown and the plots it links."""
    configs = sorted({e["config"] for e in entries})
    parts = ["## Classification (seed 002's study)\n",
             "Generated by `python -m experiments.reports.results` from `experiments/results/<task>.jsonl` (one "
             "JSON line per finished run, written by `experiments/classification/grid.py` or `experiments/classification/train.py "
             "--results`); edit the script, not this section.\n"]
    if not entries:
        parts.append("No results yet: run the grid (below).\n")
    else:
        backends = sorted({f"{r.get('backend', '?')} ({r.get('device', '?')}, jax {r.get('jax', '?')})" for r in rows})
        status = f"Configs present: {', '.join(f'`{c}`' for c in configs)}. Backends: {', '.join(backends)}."
        if "seed" not in configs:
            status += (" **No seed-scale (`--config seed`) rows yet**: every number below is from small models "
                       "trained briefly on CPU, so it says how the mechanisms compare at that scale only.")
        parts.append(status + "\n")
    if note:
        parts.append(note + "\n")
    parts.append(HOW_TO_RUN)
    parts.append(COLUMNS)
    plots = []
    if entries:
        parts.append("### Seed 002's claims at the scales run\n")
        parts.append(verdicts(entries) or "No mechanism ran beside dense yet.\n")
        parts.append("### Where a mechanism loses to dense\n")
        parts.append("Accuracy more than 1 point below dense, compiled step memory above dense's, or more than "
                     "1.5× dense's time per step (times under load; see the load column):\n")
        parts.append(losses(entries) + "\n")
    base = os.path.dirname(os.path.abspath(out))
    for task in sorted({e["task"] for e in entries}):
        es = [e for e in entries if e["task"] == task]
        parts.append(f"### {task}\n")
        for config in sorted({e["config"] for e in es}):
            ec = [e for e in es if e["config"] == config]
            parts.append(f"`--config {config}`, chance (majority class) {CHANCE.get(task, float('nan')):.2f}:\n")
            parts.append(headline_table(ec) + "\n")
            parts.append("<details><summary>per-bucket accuracy, loss, layer statistics, commits</summary>\n")
            parts.append(detail_table(ec) + "\n\n</details>\n")
        paths = plot_task(task, es, plots_dir)
        plots += paths
        parts.append(" ".join(f"![{task} {os.path.basename(p)}]({os.path.relpath(p, base)})" for p in paths) + "\n")
    return "\n".join(parts), plots


def render(results_dir: str, out: str, *, plots_dir: str, note: str = "") -> list[str]:
    """Write the classification section of `out` and its plots to `plots_dir`; returns the plot paths.
    `note`: a paragraph under the status line (e.g. the machine and its load)."""
    rows = load_rows(results_dir)
    entries = summarize(rows)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    os.makedirs(plots_dir, exist_ok=True)
    text, plots = section(rows, entries, out=out, plots_dir=plots_dir, note=note)
    write_section(out, text, markers=(BEGIN, END), replaces="# Classification results")
    return plots


def main(argv=None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results_dir", default=os.path.join("experiments", "results"))
    parser.add_argument("--out", default=os.path.join("docs", "results.md"))
    parser.add_argument("--plots_dir", default=os.path.join("experiments", "results"))
    parser.add_argument("--note", default="", help="a paragraph under the status line (machine, load, caveats)")
    parser.add_argument("--note_file", help=f"read the note from this file (default: <results_dir>/{NOTE_FILE})")
    args = parser.parse_args(argv)
    note = args.note
    note_file = args.note_file or os.path.join(args.results_dir, NOTE_FILE)
    if not note and os.path.exists(note_file):
        with open(note_file) as f:
            note = f.read().strip()
    paths = render(args.results_dir, args.out, plots_dir=args.plots_dir, note=note)
    print(f"wrote {args.out} and {len(paths)} plots")
    # The LM and retrieval sections of the same page (their plots beside the page, as docs/results.md's were).
    report_lm.render(args.results_dir, args.out, plots_dir=os.path.join(os.path.dirname(args.out) or ".", "img"))
    return paths


if __name__ == "__main__":
    main()
