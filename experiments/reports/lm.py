"""Render the language-modelling and retrieval tables of docs/results.md from the result lines in
experiments/results/lm.jsonl and retrieval.jsonl (issue 14), with their plots.

    python -m experiments.reports.lm [--results_dir DIR --out docs/results.md --plots_dir docs/img]

One table per (config, n, budget) of the LM rows and per (task, config, n, budget) of the retrieval rows, one line
per variant with every seed's number beside the mean ± std (sample std; none for one seed), the latest row of a
repeated seed winning. Only the text between each section's markers is rewritten: the prose that reads the tables
lives outside them. `experiments.reports.results` calls this after the classification section.

Writes: the LM and retrieval sections of --out (docs/results.md) and their plots under --plots_dir.
"""

from __future__ import annotations

import os
import statistics

from experiments.lm.grid import read_rows
from experiments.reports import plot_lm
from experiments.reports.doc_sections import write_section
from experiments.retrieval import train as retrieval
from sparse_attn.studies import cli
from sparse_attn.studies.budget import RECORDED_FIELDS, VARIANTS

LM_MARKERS = ("<!-- lm:begin (python -m experiments.reports.lm writes this section) -->", "<!-- lm:end -->")
RETRIEVAL_MARKERS = ("<!-- retrieval:begin (python -m experiments.reports.lm writes this section) -->",
                     "<!-- retrieval:end -->")
ORDER = list(VARIANTS)  # dense, the windowed baselines, labels variants, ABCA variants
SHOWN_PARAMS = RECORDED_FIELDS


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


def _variant_order(variant: str) -> tuple:
    return (ORDER.index(variant) if variant in ORDER else len(ORDER), variant)


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
    """Rows of one (config, n, budget): a line per variant, gap to dense per seed where dense ran that seed."""
    by_variant = _latest_per_seed(rows, lambda r: r["variant"])
    dense = {r.get("seed", 0): r["valid_bits_per_byte"] for r in by_variant.get("dense", [])}
    lines = ["| variant | attention | seeds | keys/query, measured | valid bits/byte per seed | mean ± std | "
             "gap to dense | attn/dense | peak train-step MiB | commits |", "|" + "---|" * 10]
    for variant in sorted(by_variant, key=_variant_order):
        rs = by_variant[variant]
        bpb = [r["valid_bits_per_byte"] for r in rs]
        gaps = [100 * (r["valid_bits_per_byte"] / dense[r.get("seed", 0)] - 1) for r in rs
                if r.get("seed", 0) in dense]
        gap = "–" if variant == "dense" or not gaps else _mean_std(gaps, "+.1f") + "%"
        peak = _mean([(r.get("memory_mib") or {}).get("peak_mib") for r in rs])
        lines.append(
            f"| {variant} | {describe(rs[0].get('attention', {}))} | {_seeds(rs)} | {_keys(rs, '.1f')} | "
            f"{' / '.join(f'{b:.3f}' for b in bpb)} | {_mean_std(bpb, '.3f')} | {gap} | "
            f"{_mean([r.get('attn_vs_dense') for r in rs]):.2f} | {'–' if peak is None else f'{peak:.1f}'} | "
            f"{_commits(rs)} |")
    return "\n".join(lines)


def stats_table(rows: list[dict]) -> str:
    """The sparse variants' statistics at the end of training, per layer (mean over seeds), where they log any."""
    by_variant = _latest_per_seed(rows, lambda r: r["variant"])
    cols = plot_lm.STATS_PANELS
    lines = ["| variant | seeds | " + " | ".join(t for t, _ in cols) + " |", "|" + "---|" * (len(cols) + 2)]
    for variant in sorted(by_variant, key=_variant_order):
        rs = by_variant[variant]
        cells = [_per_layer(rs, stat) for _, stat in cols]
        if variant == "dense" or all(c == "–" for c in cells[1:]):
            continue
        lines.append(f"| {variant} | {_seeds(rs)} | " + " | ".join(cells) + " |")
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
    """Rows of one (task, config, n, budget): a line per variant, accuracy overall and per distance bucket."""
    by_variant = _latest_per_seed(rows, lambda r: r["variant"])
    buckets = [b for b in next(iter(by_variant.values()))[0]["accuracy_by_distance"]
               if any(r["accuracy_by_distance"].get(b, {}).get("accuracy") is not None
                      for rs in by_variant.values() for r in rs)]
    lines = [f"| variant | attention | seeds | keys/query, measured | accuracy per seed | mean ± std | "
             f"by distance {' / '.join(buckets)} | every answer of a sequence | valid loss | commits |",
             "|" + "---|" * 10]
    for variant in sorted(by_variant, key=_variant_order):
        rs = by_variant[variant]
        acc = [100 * r["accuracy"] for r in rs]
        by_bucket = " / ".join(
            f"{100 * m:.1f}" if (m := _mean([r["accuracy_by_distance"].get(b, {}).get("accuracy") for r in rs]))
            is not None else "–" for b in buckets)
        lines.append(
            f"| {variant} | {describe(rs[0].get('attention', {}))} | {_seeds(rs)} | "
            f"{_keys(rs, '.2f')} | {' / '.join(f'{a:.1f}' for a in acc)}% | "
            f"{_mean_std(acc, '.1f')}% | {by_bucket}% | {_mean_std([100 * r['seq_accuracy'] for r in rs], '.1f')}% | "
            f"{_mean_std([r['valid_loss'] for r in rs], '.3f')} | {_commits(rs)} |")
    return "\n".join(lines)


def lm_section(rows: list[dict], *, out: str, plots_dir: str) -> str:
    rows = [r for r in rows if r.get("kind") == "lm" and "valid_bits_per_byte" in r]
    groups = _groups(rows, lambda r: (r["config"], r["n"], r["budget_keys_per_query"]))
    parts = []
    for (config, n, budget), rs in groups.items():
        prefix = os.path.join(plots_dir, f"lm_{config}_n{n}")
        headline = [v for v, vs in _latest_per_seed(rs, lambda r: r["variant"]).items() if len(vs) > 1]
        paths = plot_lm.plot(rs, config, n, prefix, curve_variants=headline or None)
        command = (f"python -m experiments.lm.grid --config {config} --n {n} --variant <variant> --budget {budget:g} "
                   f"--seed <seed>")
        parts += [f"#### LM `{config}`, n = {n}, {budget:g} keys per query\n", f"Each cell: `{command}`.\n",
                  lm_table(rs) + "\n", _images(paths, out) + "\n"]
        stats, stats_png = stats_table(rs), plot_lm.plot_stats(rs, config, n, prefix)
        if stats:
            parts += ["Mechanism statistics at the last logged training step (layer 0 / layer 1, mean over seeds; "
                      "the plot: over training, mean over seeds and layers):\n", stats + "\n",
                      _images([stats_png], out) + "\n"]
    return "\n".join(parts) or "No LM rows yet.\n"


def retrieval_section(rows: list[dict], *, out: str, plots_dir: str) -> str:
    rows = [r for r in rows if "accuracy_by_distance" in r and "task" in r]
    groups = _groups(rows, lambda r: (r["task"], r["config"], r["n"], r["budget_keys_per_query"]))
    parts = []
    for (task, config, n, budget), rs in groups.items():
        path = os.path.join(plots_dir, f"retrieval_{task}_{config}_n{n}_k{budget:g}.png")
        retrieval.plot(rs, path, title=f"{task}, n={n}, config {config}, budget {budget:g} keys/query")
        command = (f"python -m experiments.retrieval --task {task} --config {config} --n {n} --variant <variant> "
                   f"--budget {budget:g} --seed <seed>")
        parts += [f"#### {task} `{config}`, n = {n}, {budget:g} keys per query\n", f"Each cell: `{command}`.\n",
                  retrieval_table(rs) + "\n", _images([path], out) + "\n"]
    return "\n".join(parts) or "No retrieval rows yet.\n"


def _groups(rows: list[dict], key) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    return dict(sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])))


def require_dir(flag: str, path: str) -> None:
    """A directory of result rows named on the command line must be there (rather than render empty sections)."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{flag} {path}: no such directory")


def _images(paths: list[str], out: str) -> str:
    base = os.path.dirname(os.path.abspath(out))
    return " ".join(f"![{os.path.basename(p)}]({os.path.relpath(os.path.abspath(p), base)})" for p in paths)


def render(results_dir: str, out: str, *, plots_dir: str) -> list[str]:
    """Rewrite the LM and retrieval sections of `out` from `results_dir` (a section whose file is missing stays
    as it is); returns the names of the sections written."""
    written = []
    for name, markers, section in (("lm", LM_MARKERS, lm_section), ("retrieval", RETRIEVAL_MARKERS, retrieval_section)):
        path = os.path.join(results_dir, f"{name}.jsonl")
        if not os.path.exists(path):
            continue
        os.makedirs(plots_dir, exist_ok=True)
        write_section(out, section(read_rows(path), out=out, plots_dir=plots_dir), markers=markers)
        written.append(name)
    return written


@cli.entry_point
def main(argv=None) -> list[str]:
    parser = cli.ArgumentParser(__doc__)
    parser.add_argument("--results_dir", default=os.path.join("experiments", "results"))
    parser.add_argument("--out", default=os.path.join("docs", "results.md"))
    parser.add_argument("--plots_dir", default=os.path.join("docs", "img"))
    args = parser.parse_args(argv)
    require_dir("--results_dir", args.results_dir)
    written = render(args.results_dir, args.out, plots_dir=args.plots_dir)
    print(f"wrote the {' and '.join(written) or 'no'} section(s) of {args.out}")
    return written


if __name__ == "__main__":
    main()
