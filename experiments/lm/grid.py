"""Byte-level LM at equal attention budgets: one mechanism in every layer, budgets matched by keys per query.

    # one cell (workdir runs/lm_grid/<config>/n<n>_<mechanism>_k<budget>_s<seed>; re-running resumes)
    python -m experiments.lm.grid --config cpu --n 256 --mechanism labels_d8k2 --budget 24 --seed 0
    # a grid: every cell without a result row, each in a subprocess with a time limit (rerun to resume)
    nice -n 10 python -m experiments.lm.grid --grid cpu_core --time_limit 1800
    python -m experiments.lm.grid --report            # the table of experiments/results/lm.jsonl

Presets and the budget convention: `sparse_attn/studies/budget.py` and the mechanisms' records (the dense row is the
unmatched reference). Data: the embedded stdlib corpus (`experiments/lm/train.py`). Each finished cell appends one JSON line to `--results`
(default experiments/results/lm.jsonl) with the command and git commit: validation bits/byte (and its gap to the
dense row of the same config, n and seed when that row exists), tokens/s, peak compiled train-step memory,
attention FLOPs (measured keys per query x 4 head_dim per head and token), the matched parameter, the validation
curve and every layer's mechanism statistics over training (from the train records of `metrics.jsonl`).

Writes: one workdir per cell under --runs_dir and one JSON line per finished cell in --results.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shlex
import sys
import time

import jax

from experiments.lm import train as lm_train
from experiments.lm.configs import GRIDS, SCALES, LMConfig
from sparse_attn.data import StdlibSource
from sparse_attn.models import TransformerConfig
from sparse_attn.studies import cli
from sparse_attn.studies.budget import (
    attention_for_budget,
    budget_names,
    check_budget_name,
    keys_per_query,
    newline_windows,
    recorded_fields,
)
from sparse_attn.studies.cells import (
    Cell,
    Scale,
    finite,
    model_and_train,
    peak_mib,
    read_rows,
    row_key,
    stats_curve,
)
from sparse_attn.studies.runs import default_results, git_commit, print_status, run_module
from sparse_attn.train import TrainConfig, read_metrics

RESULTS = os.path.join("experiments", "results", "lm.jsonl")


# ---------------------------------------------------------------------------------------------- one cell

def cell_workdir(runs_dir: str, config: str, cell: Cell) -> str:
    return os.path.join(runs_dir, config, f"n{cell.n}_{cell.mechanism}_k{cell.budget:g}_s{cell.seed}")


def run_cell(config: str, cell: Cell, *, workdir: str, results: str | None, command: str = "", log=print,
             scale: Scale | None = None) -> dict:
    """Train one cell (resuming in `workdir`) and append its row to `results`. `scale` overrides `SCALES[config]`
    (`config` then only names the rows)."""
    scale = scale or SCALES[config]
    corpus = StdlibSource().load()
    tokens = newline_windows(corpus.train_U8, cell.n)  # explicit anchors' budget is measured on these windows
    att = attention_for_budget(cell.mechanism, n=cell.n, keys_per_query_target=cell.budget, tokens_BxN=tokens)
    planned = keys_per_query(att, cell.n, tokens)
    model, train = model_and_train(scale, cell.n, att, cell.seed)
    summary = lm_train.train_and_evaluate(LMConfig(model=model, train=train), workdir, log=log)
    row = result_row(config, cell, model, train, summary, workdir, planned_keys=planned, attention=att,
                     command=command, dense=dense_row(results, config, cell) if results else None)
    if results and jax.process_index() == 0:
        os.makedirs(os.path.dirname(os.path.abspath(results)), exist_ok=True)
        with open(results, "a") as f:
            f.write(json.dumps(row) + "\n")
    return row


def result_row(config: str, cell: Cell, model: TransformerConfig, train: TrainConfig, summary: dict, workdir: str, *,
               planned_keys: float, attention, command: str, dense: dict | None) -> dict:
    heads, head_dim = model.num_heads, model.model_dim // model.num_heads
    curve = stats_curve(workdir)
    last = curve[-1] if curve else {}
    layers = []
    for i in range(model.num_layers):
        measured = last.get(f"layer{i}/keys_per_query")
        keys = measured if measured is not None else planned_keys
        layers.append({"keys_per_query": keys, "keys_measured": measured is not None,
                       "attn_fwd_flops_per_seq": 4.0 * head_dim * heads * keys * train.seq_len,
                       "stats": {k.split("/", 1)[1]: v for k, v in last.items() if k.startswith(f"layer{i}/")}})
    attn_fwd = sum(layer["attn_fwd_flops_per_seq"] for layer in layers)
    bpb = summary["eval"]["bits_per_byte"]
    tok_s = summary.get("tokens_per_s")
    valid = read_metrics(workdir, "valid") if os.path.exists(os.path.join(workdir, "metrics.jsonl")) else {}
    tuned = recorded_fields(attention)
    row = {
        "kind": "lm", "config": config, "n": cell.n, "mechanism": cell.mechanism, "budget_keys_per_query": cell.budget,
        "seed": cell.seed, "steps": summary["step"],
        "valid_bits_per_byte": float(bpb),
        "train_bits_per_byte": finite(summary.get("train", {}).get("bits_per_byte")),
        "gap_to_dense_pct": 100.0 * (float(bpb) / dense["valid_bits_per_byte"] - 1.0) if dense else None,
        "planned_keys_per_query": planned_keys, "dense_keys_per_query": (cell.n + 1) / 2,
        "attention": {"type": type(attention).__name__, **tuned},
        "attn_fwd_flops_per_seq": attn_fwd, "attn_vs_dense": attn_fwd / (model.num_layers * 4.0 * head_dim * heads
                                                                         * cell.n * (cell.n + 1) / 2),
        "tokens_per_s": finite(tok_s), "wall_s": summary.get("wall_s"),
        "memory_mib": {**summary.get("memory_mib", {}), "peak_mib": peak_mib(summary.get("memory_mib", {}))},
        "param_count": summary["param_count"],
        "layers": layers, "stats_curve": curve,
        "valid_curve": [{"step": s, "bits_per_byte": r.get("bits_per_byte")} for s, r in sorted(valid.items())],
        "model": {"layers": model.num_layers, "dim": model.model_dim, "heads": heads, "mlp": model.mlp_dim},
        "global_batch": train.global_batch, "eval_every": train.eval_every,
        "backend": jax.default_backend(), "device": str(jax.devices()[0].device_kind), "jax": jax.__version__,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command, "commit": git_commit(), "workdir": workdir,
    }
    return row


def dense_row(path: str, config: str, cell: Cell) -> dict | None:
    """The newest dense row of the same config, n and seed (its budget is irrelevant: dense is unmatched)."""
    rows = [r for r in read_rows(path) if r.get("kind") == "lm" and "valid_bits_per_byte" in r
            and (r.get("config"), r.get("n"), r.get("mechanism"), r.get("seed")) == (config, cell.n, "dense", cell.seed)]
    return rows[-1] if rows else None


# ---------------------------------------------------------------------------------------------- grid

def run_subprocess(argv: list[str], timeout_s: float, module: str = "experiments.lm.grid") -> int:
    """`python -m module argv` under `timeout_s` (cell_runs.run_module)."""
    return run_module(module, argv, timeout_s)


def run_grid(cells: list[Cell], *, config: str, results: str, runs_dir: str, time_limit_s: float,
             run=run_subprocess, log=print) -> dict[Cell, str]:
    """Run the cells without a result row, dense first within each (n, seed) so gaps can be computed."""
    status = {}
    order = sorted(cells, key=lambda c: (c.n, c.seed, c.mechanism != "dense"))
    for cell in order:
        if (config, *cell) in {row_key(r) for r in read_rows(results)}:
            status[cell] = "done before"
            continue
        argv = ["--config", config, "--n", str(cell.n), "--mechanism", cell.mechanism, "--budget", f"{cell.budget:g}",
                "--seed", str(cell.seed), "--results", results,
                "--workdir", cell_workdir(runs_dir, config, cell)]
        log(f"== {cell}")
        t0 = time.perf_counter()
        rc = run(argv, time_limit_s)
        status[cell] = {0: "finished", 124: "timed out (rerun to resume)"}.get(rc, f"failed (exit {rc})")
        log(f"   {status[cell]} in {time.perf_counter() - t0:.0f} s")
    return status


def report(rows: list[dict]) -> str:
    """A markdown table: one line per (config, n, mechanism, budget), mean over seeds; gap vs the dense mean."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("kind") == "lm":
            groups.setdefault(row_key(r)[:4], []).append(r)
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    dense = {(k[0], k[1]): mean([r["valid_bits_per_byte"] for r in v]) for k, v in groups.items() if k[2] == "dense"}
    lines = ["| config | n | mechanism | keys/query (target, measured) | seeds | bits/byte | gap to dense | "
             "attn/dense | tokens/s | peak MiB | command |", "|" + "---|" * 11]
    for (config, n, mechanism, budget), rs in sorted(groups.items()):
        bpb = mean([r["valid_bits_per_byte"] for r in rs])
        d = dense.get((config, n))
        gap = f"{100 * (bpb / d - 1):+.2f}%" if d and mechanism != "dense" else "–"
        keys = mean([mean([layer["keys_per_query"] for layer in r["layers"]]) for r in rs if r.get("layers")])
        tok = [r["tokens_per_s"] for r in rs if r.get("tokens_per_s")]
        peak = [r["memory_mib"]["peak_mib"] for r in rs if r.get("memory_mib", {}).get("peak_mib")]
        ratio = [r["attn_vs_dense"] for r in rs if r.get("attn_vs_dense") is not None]
        target = "–" if mechanism == "dense" else f"{budget:g}"
        lines.append(f"| {config} | {n} | {mechanism} | {target}, {keys:.1f} | {len(rs)} | {bpb:.4f} | {gap} | "
                     f"{mean(ratio):.2f} | {f'{mean(tok):,.0f}' if tok else '–'} | {f'{mean(peak):.1f}' if peak else '–'} | "
                     f"`{rs[0].get('command', '')}` |")
    return "\n".join(lines)


@cli.entry_point
def main(argv=None) -> dict:
    parser = cli.ArgumentParser(__doc__)
    parser.add_argument("--config", choices=sorted(SCALES), default="cpu")
    parser.add_argument("--grid", choices=sorted(GRIDS), help="run every cell of this grid (subprocesses)")
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--mechanism", default="dense", help=", ".join(budget_names()))
    parser.add_argument("--budget", type=float, default=24.0, help="target keys per query (allowed pairs / token)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", help="default runs/lm_grid/<config>/n<n>_<mechanism>_k<budget>_s<seed>")
    parser.add_argument("--results", help=f"append rows here (default: {RESULTS}; <runs_dir>/results.jsonl for "
                        "the smoke config)")
    parser.add_argument("--runs_dir", default=os.path.join("runs", "lm_grid"))
    parser.add_argument("--time_limit", type=float, default=3600, help="seconds per cell (--grid)")
    parser.add_argument("--eval_every", type=int, help="validate every this many steps instead of the config's (a "
                        "denser validation curve, e.g. around label attention's phase changes; training is unchanged)")
    parser.add_argument("--report", action="store_true", help="print the table of --results and exit")
    args = parser.parse_args(argv)
    if args.results is None:
        args.results = default_results(RESULTS, args.runs_dir, config=args.config)
    if args.report:
        print(report(read_rows(args.results)))
        return {}
    if args.grid:
        status = run_grid(GRIDS[args.grid], config=args.config, results=args.results, runs_dir=args.runs_dir,
                          time_limit_s=args.time_limit)
        return print_status(status)
    check_budget_name(args.mechanism)
    cell = Cell(args.n, args.mechanism, args.budget, args.seed)
    command = "python -m experiments.lm.grid " + shlex.join(argv if argv is not None else sys.argv[1:])
    scale = dataclasses.replace(SCALES[args.config], eval_every=args.eval_every) if args.eval_every else None
    row = run_cell(args.config, cell, workdir=args.workdir or cell_workdir(args.runs_dir, args.config, cell),
                   results=args.results, command=command, scale=scale)
    print(json.dumps({k: row[k] for k in ("n", "mechanism", "steps", "valid_bits_per_byte", "gap_to_dense_pct",
                                          "planned_keys_per_query", "tokens_per_s")}))
    return row


if __name__ == "__main__":
    main()
