"""Render the language-modelling and retrieval tables of docs/results.md from the result lines in
experiments/results/lm.jsonl and retrieval.jsonl, with their plots and their companion files (statistics over
training and the commits of every cell: experiments/results/lm_details.md, retrieval_details.md).

    python -m experiments.reports.lm [--results_dir DIR --out docs/results.md --plots_dir docs/img --details_dir DIR]

One table per (config, n, budget) of the LM rows and per (task, config, n, budget) of the retrieval rows, one line
per mechanism (a budget-grid preset: `local`, `labels_d8k2`, `abca_fixed`, ...) with every seed's number beside the
mean ± std (sample std; none for one seed), the latest row of a repeated seed winning. Only the text between each
section's markers is rewritten: the prose that reads the tables lives outside them. `experiments.reports.results`
calls this after the classification section.

Writes: the LM and retrieval sections of --out (docs/results.md), their plots under --plots_dir and the companion
files under --details_dir.
"""

from __future__ import annotations

import os
import statistics

from experiments.reports import plot_lm
from experiments.retrieval import train as retrieval_train
from experiments.reports.doc_sections import write_section
from experiments.reports.rows import mechanism, read_rows
from sparse_attn.studies import cli
from sparse_attn.studies.budget import RECORDED_FIELDS, budget_names

LM_MARKERS = ("<!-- lm:begin (python -m experiments.reports.lm writes this section) -->", "<!-- lm:end -->")
RETRIEVAL_MARKERS = ("<!-- retrieval:begin (python -m experiments.reports.lm writes this section) -->",
                     "<!-- retrieval:end -->")
DETAILS_FILES = {"lm": "lm_details.md", "retrieval": "retrieval_details.md"}
# Table order: the registry's (dense, the windowed baselines, the label presets, the ABCA presets, the block-
# selection baselines); a preset not registered follows them, alphabetically.
ORDER = budget_names()
SHOWN_PARAMS = RECORDED_FIELDS
# The flag that picks a row's preset on the grid runners' command lines.
RUNNER_FLAG = "--mechanism"


def _latest_per_seed(rows: list[dict], key) -> dict[tuple, list[dict]]:
    """Rows grouped by `key(row)`, one per seed (the last line of a repeated seed), seeds ascending."""
    groups: dict[tuple, dict[int, dict]] = {}
    for r in rows:
        groups.setdefault(key(r), {})[r.get("seed", 0)] = r
    return {k: [v[s] for s in sorted(v)] for k, v in groups.items()}


def _mean_std(values: list[float], spec: str) -> str:
    if not values:
        return "–"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return format(mean, spec)
    return f"{format(mean, spec)} ± {format(statistics.stdev(values), spec.lstrip('+'))}"


def _mean(values):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def describe(attention: dict) -> str:
    """`LocalAttention: radius 24` from a row's `attention` record."""
    params = ", ".join(f"{k.replace('_', ' ')} {attention[k]}" for k in SHOWN_PARAMS if k in attention)
    return f"{attention.get('type', '?')}" + (f": {params}" if params else "")


def _order(name: str) -> tuple:
    return (ORDER.index(name) if name in ORDER else len(ORDER), name)


def _layer_keys(row: dict) -> float | None:
    """Keys per query, mean over layers (measured where the row measured it)."""
    keys = [layer["keys_per_query"] for layer in row.get("layers") or []] or [
        k for k in row.get("keys_per_query") or [] if k is not None]
    return statistics.fmean(keys) if keys else row.get("planned_keys_per_query")


def _keys(rs: list[dict], spec: str) -> str:
    """Measured keys per query of each seed, and the planned count where the measured mean is 10% off it."""
    measured = [_layer_keys(r) for r in rs]
    planned = rs[0].get("planned_keys_per_query")
    text = " / ".join(format(k, spec) for k in measured)
    if planned and abs(statistics.fmean(measured) / planned - 1) > 0.1:
        text += f" (planned {format(planned, spec)})"
    return text


def _seeds(rs: list[dict]) -> str:
    return ", ".join(str(r.get("seed", 0)) for r in rs)


def _commits(rs: list[dict]) -> str:
    def short(commit: str) -> str:  # `6b4592e+dirty`: the hash shortened, the suffix kept
        head, plus, tail = commit.partition("+")
        return head[:7] + plus + tail
    return ", ".join(dict.fromkeys(short(str(r.get("commit", "?"))) for r in rs))


def lm_table(rows: list[dict]) -> str:
    """Rows of one (config, n, budget): a line per mechanism, gap to dense per seed where dense ran that seed."""
    by_name = _latest_per_seed(rows, mechanism)
    dense = {r.get("seed", 0): r["valid_bits_per_byte"] for r in by_name.get("dense", [])}
    lines = ["| mechanism | config | seeds | keys/query, measured | valid bits/byte per seed | mean ± std | "
             "gap to dense | attn/dense | peak train-step MiB |", "|" + "---|" * 9]
    for name in sorted(by_name, key=_order):
        rs = by_name[name]
        bpb = [r["valid_bits_per_byte"] for r in rs]
        gaps = [100 * (r["valid_bits_per_byte"] / dense[r.get("seed", 0)] - 1) for r in rs
                if r.get("seed", 0) in dense]
        gap = "–" if name == "dense" or not gaps else _mean_std(gaps, "+.1f") + "%"
        peak = _mean([(r.get("memory_mib") or {}).get("peak_mib") for r in rs])
        lines.append(
            f"| {name} | {describe(rs[0].get('attention', {}))} | {_seeds(rs)} | {_keys(rs, '.1f')} | "
            f"{' / '.join(f'{b:.3f}' for b in bpb)} | {_mean_std(bpb, '.3f')} | {gap} | "
            f"{_mean([r.get('attn_vs_dense') for r in rs]):.2f} | {'–' if peak is None else f'{peak:.1f}'} |")
    return "\n".join(lines)


def commits_table(rows: list[dict]) -> str:
    """A line per mechanism: its seeds and the commits their code was taken from (`+dirty`: with local changes)."""
    by_name = _latest_per_seed(rows, mechanism)
    lines = ["| mechanism | seeds | commits |", "|---|---|---|"]
    lines += [f"| {name} | {_seeds(by_name[name])} | {_commits(by_name[name])} |" for name in sorted(by_name, key=_order)]
    return "\n".join(lines)


def stats_table(rows: list[dict]) -> str:
    """The sparse mechanisms' statistics at the end of training, per layer (mean over seeds), where they log any."""
    by_name = _latest_per_seed(rows, mechanism)
    cols = plot_lm.STATS_PANELS
    lines = ["| mechanism | seeds | " + " | ".join(t for t, _ in cols) + " |", "|" + "---|" * (len(cols) + 2)]
    for name in sorted(by_name, key=_order):
        rs = by_name[name]
        cells = [_per_layer(rs, stat) for _, stat in cols]
        if name == "dense" or all(c == "–" for c in cells[1:]):
            continue
        lines.append(f"| {name} | {_seeds(rs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


def _per_layer(rs: list[dict], stat: str) -> str:
    """`L0 / L1 / ...` of the last logged value of `layer{i}/<stat>`, mean over the runs that log it."""
    layers: dict[int, list[float]] = {}
    for r in rs:
        for i, v in plot_lm.layer_values((r.get("stats_curve") or [{}])[-1], stat).items():
            layers.setdefault(i, []).append(v)
    if not layers:
        return "–"
    spec = ".4f" if stat.endswith("frac_disconnected") else ".1f"
    return " / ".join(f"{statistics.fmean(layers[i]):{spec}}" for i in sorted(layers))


def retrieval_table(rows: list[dict]) -> str:
    """Rows of one (task, config, n, budget): a line per mechanism, accuracy overall and per distance bucket."""
    by_name = _latest_per_seed(rows, mechanism)
    buckets = [b for b in next(iter(by_name.values()))[0]["accuracy_by_distance"]
               if any(r["accuracy_by_distance"].get(b, {}).get("accuracy") is not None
                      for rs in by_name.values() for r in rs)]
    lines = [f"| mechanism | config | seeds | keys/query, measured | accuracy per seed | mean ± std | "
             f"by distance {' / '.join(buckets)} | every answer of a sequence | valid loss |", "|" + "---|" * 9]
    for name in sorted(by_name, key=_order):
        rs = by_name[name]
        acc = [100 * r["accuracy"] for r in rs]
        by_bucket = " / ".join(
            f"{100 * m:.1f}" if (m := _mean([r["accuracy_by_distance"].get(b, {}).get("accuracy") for r in rs]))
            is not None else "–" for b in buckets)
        lines.append(
            f"| {name} | {describe(rs[0].get('attention', {}))} | {_seeds(rs)} | "
            f"{_keys(rs, '.2f')} | {' / '.join(f'{a:.1f}' for a in acc)}% | "
            f"{_mean_std(acc, '.1f')}% | {by_bucket}% | {_mean_std([100 * r['seq_accuracy'] for r in rs], '.1f')}% | "
            f"{_mean_std([r['valid_loss'] for r in rs], '.3f')} |")
    return "\n".join(lines)


def _details_head(title: str, section: str) -> list[str]:
    return [f"# {title}\n", "Generated by `python -m experiments.reports.lm` (also run by `python -m "
            f"experiments.reports.results`) beside the tables of docs/results.md (\"{section}\"); edit the script, "
            "not this file. Commits: the one each seed's code was taken from (`+dirty`: with uncommitted changes).\n"]


def lm_section(rows: list[dict], *, out: str, plots_dir: str, details: str) -> tuple[str, str]:
    """The LM section of the page and its companion file (commits, statistics over training)."""
    rows = [r for r in rows if r.get("kind") == "lm" and "valid_bits_per_byte" in r and mechanism(r)]
    groups = _groups(rows, lambda r: (r["config"], r["n"], r["budget_keys_per_query"]))
    parts = [f"Each cell: `python -m experiments.lm.grid --config <config> --n <n> {RUNNER_FLAG} <mechanism> "
             f"--budget <keys per query> --seed <seed>`. Statistics over training and commits: "
             f"[{os.path.basename(details)}]({_link(details, out)}).\n"] if groups else []
    extra = _details_head("Language modelling: statistics over training and commits", "Language modelling")
    for (config, n, budget), rs in groups.items():
        prefix = os.path.join(plots_dir, f"lm_{config}_n{n}")
        headline = [v for v, vs in _latest_per_seed(rs, mechanism).items() if len(vs) > 1]
        paths = plot_lm.plot(rs, config, n, prefix, curve_mechanisms=headline or None)
        title = f"LM `{config}`, n = {n}, {budget:g} keys per query"
        parts += [f"#### {title}\n", lm_table(rs) + "\n", _images(paths, out) + "\n"]
        extra += [f"## {title}\n", commits_table(rs) + "\n"]
        stats, stats_png = stats_table(rs), plot_lm.plot_stats(rs, config, n, prefix)
        if stats:
            extra += ["Mechanism statistics at the last logged training step (layer 0 / layer 1, mean over seeds; "
                      "the plot: over training, mean over seeds and layers):\n", stats + "\n",
                      _images([stats_png], details) + "\n"]
    return "\n".join(parts) or "No LM rows yet.\n", "\n".join(extra)


def retrieval_section(rows: list[dict], *, out: str, plots_dir: str, details: str) -> tuple[str, str]:
    """The retrieval section of the page and its companion file (commits)."""
    rows = [r for r in rows if "accuracy_by_distance" in r and "task" in r and mechanism(r)]
    groups = _groups(rows, lambda r: (r["task"], r["config"], r["n"], r["budget_keys_per_query"]))
    parts = [f"Each cell: `python -m experiments.retrieval --task <task> --config <config> --n <n> {RUNNER_FLAG} "
             f"<mechanism> --budget <keys per query> --seed <seed>`. Commits: "
             f"[{os.path.basename(details)}]({_link(details, out)}).\n"] if groups else []
    extra = _details_head("Long-range retrieval: single-seed probes and commits", "Long-range retrieval")
    for (task, config, n, budget), rs in groups.items():
        path = os.path.join(plots_dir, f"retrieval_{task}_{config}_n{n}_k{budget:g}.png")
        retrieval_train.plot(rs, path, title=f"{task}, n={n}, config {config}, budget {budget:g} keys/query")
        title = f"{task} `{config}`, n = {n}, {budget:g} keys per query"
        table = [retrieval_table(rs) + "\n", _images([path], out if _headline(rs) else details) + "\n"]
        if _headline(rs):
            parts += [f"#### {title}\n", *table]
        else:
            extra += [f"## {title} (one seed of every mechanism: a probe, not on the page)\n", *table]
        extra += [f"## {title}\n" if _headline(rs) else "", commits_table(rs) + "\n"]
    return "\n".join(parts) or "No retrieval rows yet.\n", "\n".join(p for p in extra if p)


def _headline(rows: list[dict]) -> bool:
    """Whether a group's table goes on the page: some mechanism in it ran more than one seed (a group of single
    seeds is a probe; its table goes to the companion file)."""
    return any(len(rs) > 1 for rs in _latest_per_seed(rows, mechanism).values())


def _groups(rows: list[dict], key) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    return dict(sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])))


def require_dir(flag: str, path: str) -> None:
    """A directory of result rows named on the command line must be there (rather than render empty sections)."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{flag} {path}: no such directory")


def _link(path: str, page: str) -> str:
    """`path` relative to the folder of `page`, for a markdown link."""
    return os.path.relpath(os.path.abspath(path), os.path.dirname(os.path.abspath(page)))


def _images(paths: list[str], page: str) -> str:
    return " ".join(f"![{os.path.basename(p)}]({_link(p, page)})" for p in paths)


def render(results_dir: str, out: str, *, plots_dir: str, details_dir: str | None = None) -> list[str]:
    """Rewrite the LM and retrieval sections of `out` from `results_dir` and their companion files under
    `details_dir` (default: `plots_dir`); a section whose rows file is missing stays as it is. Returns the names of
    the sections written."""
    written = []
    for name, markers, section in (("lm", LM_MARKERS, lm_section), ("retrieval", RETRIEVAL_MARKERS, retrieval_section)):
        path = os.path.join(results_dir, f"{name}.jsonl")
        if not os.path.exists(path):
            continue
        details = os.path.join(details_dir or plots_dir, DETAILS_FILES[name])
        os.makedirs(plots_dir, exist_ok=True)
        os.makedirs(os.path.dirname(os.path.abspath(details)), exist_ok=True)
        text, extra = section(read_rows(path), out=out, plots_dir=plots_dir, details=details)
        write_section(out, text, markers=markers)
        with open(details, "w") as f:
            f.write(extra.rstrip("\n") + "\n")
        written.append(name)
    return written


@cli.entry_point
def main(argv=None) -> list[str]:
    parser = cli.ArgumentParser(__doc__)
    parser.add_argument("--results_dir", default=os.path.join("experiments", "results"))
    parser.add_argument("--out", default=os.path.join("docs", "results.md"))
    parser.add_argument("--plots_dir", default=os.path.join("docs", "img"))
    parser.add_argument("--details_dir", default=os.path.join("experiments", "results"),
                        help="where the companion files (statistics, commits) go, linked from the page")
    args = parser.parse_args(argv)
    require_dir("--results_dir", args.results_dir)
    written = render(args.results_dir, args.out, plots_dir=args.plots_dir, details_dir=args.details_dir)
    print(f"wrote the {' and '.join(written) or 'no'} section(s) of {args.out}")
    return written


if __name__ == "__main__":
    main()
