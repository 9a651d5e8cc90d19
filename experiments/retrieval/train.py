"""Long-range retrieval at equal attention budgets: a small causal LM trained on associative recall or passkey
retrieval (`sparse_attn.data.tasks.retrieval`), accuracy broken down by key-query distance.

    python -m experiments.retrieval --task recall --n 256 --mechanism labels_d8k2 --budget 24 --config cpu
    nice -n 10 python -m experiments.retrieval --grid cpu_core --time_limit 1800    # rerun to resume
    python -m experiments.retrieval --grid gpu --config gpu --total_s 300 --time_limit 300   # passkey 1k-16k, one GPU
    python -m experiments.retrieval --plot docs/img/retrieval.png --task recall --n 256 --budget 24 --config cpu

The loss is the cross-entropy at the answer positions only (`loss_mask`). Presets and budgets as in
`sparse_attn/studies/budget.py`, except explicit-anchor ABCA (abca, abca_hs2, abca_global): the tasks have no newline to
anchor on, so use abca_fixed (abca_learned runs, but its placement loss targets newlines, so it learns to place
none and stays the fixed pattern of its cap). Each finished run appends one JSON line to `--results` (default
experiments/results/retrieval.jsonl): accuracy per answer, per distance bucket (powers of two below n) and per
sequence (every answer right), validation loss, keys per query per layer, tokens/s, peak train-step memory,
the command and the git commit.

Writes: the workdir (metrics.jsonl, checkpoints/, result.json, loss_curves.png); one JSON line per finished run
in --results; --plot PNG.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import os
import shlex
import sys
import time

import jax
import jax.numpy as jnp
import optax

from experiments.retrieval.configs import GRIDS, SETUPS, Setup
from sparse_attn.data.tasks import AssociativeRecall, Passkey, TaskBatches, eval_batches
from sparse_attn.models import TransformerConfig, TransformerLM
from sparse_attn.studies import cli
from sparse_attn.studies.curves import plot_run
from sparse_attn.studies.budget import (
    attention_for_budget,
    budget_names,
    check_budget_name,
    keys_per_query,
    recorded_fields,
)
from sparse_attn.studies.cells import Cell, finite, model_and_train, peak_mib, read_rows, stats_curve
from sparse_attn.studies.runs import default_results, git_commit, print_status, run_module
from sparse_attn.studies.overrides import apply_overrides
from sparse_attn.train import TrainConfig
from sparse_attn.train import train_and_evaluate as train_loop

RESULTS = os.path.join("experiments", "results", "retrieval.jsonl")
EXPLICIT = ("abca", "abca_hs2", "abca_global")
EVAL_STEP = 2**30  # evaluate as after every schedule when the loop passes no step


def make_task(name: str, n: int, setup: Setup):
    sizes = dict(num_train=1_000_000, num_validation=setup.num_validation)
    if name == "recall":
        return AssociativeRecall(seq_len=n, num_pairs=setup.num_pairs, num_queries=setup.num_queries,
                                 num_keys=setup.num_keys, num_values=setup.num_values, **sizes)
    if name == "passkey":
        return Passkey(seq_len=n, **sizes)
    raise ValueError(f"unknown task {name!r}; choose recall or passkey")


def distance_edges(n: int) -> tuple[int, ...]:
    """Bucket edges: [1, n/16), [n/16, n/8), [n/8, n/4), [n/4, n/2), [n/2, n]."""
    inner = sorted({max(n >> k, 2) for k in (4, 3, 2, 1)})
    return (1, *inner, n + 1)


def bucket_labels(edges) -> list[str]:
    return [f"{lo}-{hi - 1}" for lo, hi in itertools.pairwise(edges)]


def loss_fn(model, batch: dict, step):
    out = model(batch["inputs"], step=step)
    ce = optax.softmax_cross_entropy_with_integer_labels(out.logits.astype(jnp.float32), batch["targets"])
    mask = batch["loss_mask"].astype(jnp.float32)
    nll = jnp.sum(ce * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    hit = (jnp.argmax(out.logits, -1) == batch["targets"]).astype(jnp.float32)
    acc = jnp.sum(hit * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    return nll + out.aux_loss, {"nll": nll, "accuracy": acc, "aux_loss": out.aux_loss, **out.stats}


def make_eval_fn(n: int):
    edges = distance_edges(n)

    def eval_fn(model, batch: dict, step=None) -> dict:
        out = model(batch["inputs"], step=EVAL_STEP if step is None else step)
        pos = batch["answer_pos"]
        logits = jnp.take_along_axis(out.logits.astype(jnp.float32), pos[..., None], axis=1)  # [B, Q, V]
        w = batch["weight"].astype(jnp.float32)[:, None]
        correct = (jnp.argmax(logits, -1) == batch["answer"]).astype(jnp.float32) * w
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch["answer"]) * w
        m = {"correct": correct.sum(), "count": jnp.sum(w * jnp.ones_like(correct)), "nll_sum": nll.sum(),
             "seq_correct": jnp.sum(jnp.min(correct, axis=1)), "seq_count": w.sum()}
        for label, (lo, hi) in zip(bucket_labels(edges), itertools.pairwise(edges), strict=True):
            inside = ((batch["distance"] >= lo) & (batch["distance"] < hi)).astype(jnp.float32) * w
            m[f"correct/{label}"] = jnp.sum(correct * inside)
            m[f"count/{label}"] = jnp.sum(inside)
        full = jnp.all(batch["weight"] == 1).astype(jnp.float32)
        m["full"] = full
        for k, v in out.stats.items():
            if k.endswith("/keys_per_query"):
                m[k] = full * v
        return m

    return eval_fn


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What a retrieval run's command-line overrides address: `model.<field>=...`, `train.<field>=...`."""

    model: TransformerConfig
    train: TrainConfig


def eval_summary(ev: dict) -> dict:
    """The log line of an evaluation: rates from the summed counts."""
    rate = lambda a, b: float(ev[a]) / float(ev[b]) if float(ev[b]) else float("nan")  # noqa: E731
    return {"accuracy": rate("correct", "count"), "seq_accuracy": rate("seq_correct", "seq_count"),
            "loss": rate("nll_sum", "count")}  # fmt: skip


def run(task_name: str, config: str, cell: Cell, *, workdir: str, results: str | None, command: str = "",
        log=print, overrides=(), profile_steps=None) -> dict:
    """Train one (task, n, mechanism, budget, seed) run, resuming in `workdir`; append its row to `results`.
    `overrides`: "field.path=value" items (`studies.overrides`) on `RunConfig`; `profile_steps`: (a, b), a
    `jax.profiler` trace of steps a to b in `<workdir>/profile`."""
    if cell.mechanism in EXPLICIT:
        raise ValueError(f"{cell.mechanism}: the retrieval tasks have no anchor token; use abca_fixed")
    setup = SETUPS[config]
    task = make_task(task_name, cell.n, setup)
    att = attention_for_budget(cell.mechanism, n=cell.n, keys_per_query_target=cell.budget)
    model, train = model_and_train(setup.scale, cell.n, att, cell.seed)
    # Every checkpoint stays: `experiments.retrieval.diagnose --step` reads a run over its training.
    train = dataclasses.replace(train, keep_period=train.checkpoint_every)
    model = dataclasses.replace(model, vocab_size=task.vocab_size)
    chosen = apply_overrides(RunConfig(model, train), overrides)
    model, train = chosen.model, chosen.train
    shard = dict(process_index=jax.process_index(), process_count=jax.process_count())
    valid = list(eval_batches(task.source("validation"), global_batch=train.global_batch, **shard))
    summary = train_loop(
        train, workdir,
        make_model=lambda rngs: TransformerLM(model, rngs=rngs),
        loss_fn=loss_fn, eval_fn=make_eval_fn(cell.n),
        train_iter=TaskBatches(task.source("train"), global_batch=train.global_batch, seed=cell.seed, **shard),
        eval_batches=lambda: valid,
        experiment={"task_name": task_name, "task": task, "mechanism": cell.mechanism, "model": model},
        allowed_changes=("model.attention*.implementation",),
        log=log,
        eval_summary=eval_summary,
        profile_steps=profile_steps,
    )
    ev = summary["eval"]
    ratio = lambda a, b: float(a) / float(b) if b else None  # noqa: E731
    edges = distance_edges(cell.n)
    row = {
        "kind": "retrieval", "task": task_name, "config": config, "n": cell.n, "mechanism": cell.mechanism,
        "budget_keys_per_query": cell.budget, "seed": cell.seed, "steps": summary["step"],
        "accuracy": ratio(ev["correct"], ev["count"]), "seq_accuracy": ratio(ev["seq_correct"], ev["seq_count"]),
        "valid_loss": ratio(ev["nll_sum"], ev["count"]),
        "accuracy_by_distance": {lab: {"accuracy": ratio(ev[f"correct/{lab}"], ev[f"count/{lab}"]),
                                       "fraction": ratio(ev[f"count/{lab}"], ev["count"])}
                                 for lab in bucket_labels(edges)},
        "planned_keys_per_query": keys_per_query(att, cell.n),
        "keys_per_query": [ratio(ev[f"layer{i}/keys_per_query"], ev["full"]) if f"layer{i}/keys_per_query" in ev
                           else None for i in range(model.num_layers)],
        "attention": {"type": type(att).__name__, **recorded_fields(att)},
        "task_config": dataclasses.asdict(task),
        "tokens_per_s": finite(summary.get("tokens_per_s")), "wall_s": summary.get("wall_s"),
        "memory_mib": {**summary.get("memory_mib", {}), "peak_mib": peak_mib(summary.get("memory_mib", {}))},
        "param_count": summary["param_count"], "stats_curve": stats_curve(workdir),
        "model": {"layers": model.num_layers, "dim": model.model_dim, "heads": model.num_heads, "mlp": model.mlp_dim},
        "global_batch": train.global_batch, "backend": jax.default_backend(), "jax": jax.__version__,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command, "commit": git_commit(), "workdir": workdir,
    }
    if jax.process_index() == 0:  # the run's own summary and curves, beside its checkpoints
        with open(os.path.join(workdir, "result.json"), "w") as f:
            json.dump(row, f, indent=1)
        plot_run(workdir, train=lambda r: r.get("loss"), valid=lambda r: r["nll_sum"] / r["count"]
                 if r.get("count") else None, ylabel="answer loss (nats)")  # fmt: skip
    if results and jax.process_index() == 0:
        os.makedirs(os.path.dirname(os.path.abspath(results)), exist_ok=True)
        with open(results, "a") as f:
            f.write(json.dumps(row) + "\n")
    return row


def run_grid(cells, *, config: str, results: str, runs_dir: str, time_limit_s: float,
             total_s: float | None = None, min_cell_s: float = 30.0, run_cmd=run_module,
             clock=time.monotonic, log=print, overrides=()) -> dict:
    """Each (task, cell) without a result row, in a subprocess with a time limit (rerun to resume). `total_s`:
    the whole grid's wall clock; a cell gets min(time_limit_s, what is left) and none starts under `min_cell_s`.
    `overrides`: passed to every cell."""
    status = {}
    t_end = None if total_s is None else clock() + total_s
    for task_name, cell in cells:
        key = (task_name, config, cell.n, cell.mechanism, cell.budget, cell.seed)
        done = {(r.get("task"), r.get("config"), r.get("n"), r.get("mechanism"), r.get("budget_keys_per_query"),
                 r.get("seed")) for r in read_rows(results)}
        if key in done:
            status[key] = "done before"
            continue
        limit = time_limit_s if t_end is None else min(time_limit_s, t_end - clock())
        if t_end is not None and limit < min_cell_s:
            status[key] = "not run (out of time: run again to continue)"
            continue
        workdir = os.path.join(runs_dir, config, f"{task_name}_n{cell.n}_{cell.mechanism}_k{cell.budget:g}_s{cell.seed}")
        argv = ["--task", task_name, "--config", config, "--n", str(cell.n), "--mechanism", cell.mechanism,
                "--budget", f"{cell.budget:g}", "--seed", str(cell.seed), "--results", results, "--workdir", workdir,
                *overrides]
        log(f"== {key}")
        t0 = time.perf_counter()
        rc = run_cmd("experiments.retrieval", argv, limit)
        status[key] = {0: "finished", 124: "timed out (rerun to resume)"}.get(rc, f"failed (exit {rc})")
        log(f"   {status[key]} in {time.perf_counter() - t0:.0f} s")
    return status


def plot(rows: list[dict], path: str, *, title: str = "") -> str:
    """Accuracy per distance bucket, one line per mechanism (mean over its seeds, bars from min to max), chance
    dotted; `rows` of one (task, config, n, budget). Saved to `path` (PNG)."""
    import numpy as np  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415 — only the plot needs it

    by_name: dict[str, list[dict]] = {}
    for r in rows:
        by_name.setdefault(r["mechanism"], []).append(r)
    labels = [b for b in (rows[0]["accuracy_by_distance"] if rows else [])  # buckets some answer falls in
              if any(r["accuracy_by_distance"].get(b, {}).get("accuracy") is not None for r in rows)]
    fig = Figure(figsize=(7, 4.2))
    ax = fig.add_subplot()
    for name, rs in by_name.items():
        acc_SxB = np.array([[np.nan if (a := r["accuracy_by_distance"].get(lab, {}).get("accuracy")) is None else a
                             for lab in labels] for r in rs], dtype=float)
        mean_B = np.nanmean(acc_SxB, axis=0)
        att = rs[0]["attention"]
        radius = f", radius {att['radius']}" if "radius" in att else (
            f", interval {att['interval']}" if "interval" in att else "")
        kpq = np.mean([k for k in rs[0]["keys_per_query"] if k is not None] or [rs[0]["planned_keys_per_query"]])
        ax.errorbar(np.arange(len(labels)), mean_B,
                    yerr=[mean_B - np.nanmin(acc_SxB, axis=0), np.nanmax(acc_SxB, axis=0) - mean_B], marker="o",
                    capsize=3, label=f"{name} ({kpq:.1f} keys/query{radius}; {len(rs)} seed{'s' * (len(rs) > 1)})")
    chance = {"recall": lambda c: 1 / c["num_values"], "passkey": lambda c: 0.1}  # passkey: one digit of 10
    if rows and rows[0]["task"] in chance:
        ax.axhline(chance[rows[0]["task"]](rows[0]["task_config"]), color="grey", ls=":", lw=1, label="chance")
    ax.set_xticks(np.arange(len(labels)), labels)
    ax.set(xlabel="key-query distance (tokens)", ylabel="answer accuracy", ylim=(0, 1.02), title=title)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path


@cli.entry_point
def main(argv=None) -> dict:
    parser = cli.ArgumentParser(__doc__)
    parser.add_argument("--task", choices=("recall", "passkey"), default="recall")
    parser.add_argument("--config", choices=sorted(SETUPS), default="cpu")
    parser.add_argument("--grid", choices=sorted(GRIDS))
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--mechanism", default="dense", help=", ".join(v for v in budget_names() if v not in EXPLICIT))
    parser.add_argument("--budget", type=float, default=24.0, help="target keys per query")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir")
    parser.add_argument("--results", help=f"append rows here (default: {RESULTS}; <runs_dir>/results.jsonl for "
                        "the smoke config or a run with overrides)")
    parser.add_argument("--runs_dir", default=os.path.join("runs", "retrieval"))
    parser.add_argument("--time_limit", type=float, default=3600, help="seconds per run (--grid)")
    parser.add_argument("--total_s", type=float, help="seconds for the whole --grid (default: no limit)")
    parser.add_argument("--min_cell_s", type=float, default=30.0, help="start no --grid run with less time left")
    parser.add_argument("--plot", metavar="PNG", help="plot accuracy vs distance of the --results rows of --task, "
                        "--config, --n and --budget (one line per mechanism) to PNG; trains nothing")
    cli.add_profile_steps(parser)
    cli.add_overrides(parser)
    args = parser.parse_args(argv)
    if args.results is None:
        args.results = default_results(RESULTS, args.runs_dir, config=args.config, scratch=bool(args.overrides))
    if args.plot:
        rows = [r for r in read_rows(args.results) if (r.get("task"), r.get("config"), r.get("n"),
                r.get("budget_keys_per_query")) == (args.task, args.config, args.n, args.budget)]
        if not rows:
            parser.error(f"no rows of {args.task} / {args.config} / n={args.n} / budget {args.budget:g} "
                         f"in {args.results}")
        title = f"{args.task}, n={args.n}, config {args.config}, budget {args.budget:g} keys/query"
        print(plot(rows, args.plot, title=title))
        return {"plot": args.plot}
    if args.grid:
        status = run_grid(GRIDS[args.grid], config=args.config, results=args.results, runs_dir=args.runs_dir,
                          time_limit_s=args.time_limit, total_s=args.total_s, min_cell_s=args.min_cell_s,
                          overrides=args.overrides)
        return print_status(status)
    check_budget_name(args.mechanism)
    cell = Cell(args.n, args.mechanism, args.budget, args.seed)
    workdir = args.workdir or os.path.join(args.runs_dir, args.config,
                                           f"{args.task}_n{cell.n}_{cell.mechanism}_k{cell.budget:g}_s{cell.seed}")
    command = "python -m experiments.retrieval " + shlex.join(argv if argv is not None else sys.argv[1:])
    row = run(args.task, args.config, cell, workdir=workdir, results=args.results, command=command,
              overrides=args.overrides, profile_steps=args.profile_steps)
    print(json.dumps({k: row[k] for k in ("task", "n", "mechanism", "steps", "accuracy", "seq_accuracy",
                                          "accuracy_by_distance")}))
    return row


if __name__ == "__main__":
    main()
