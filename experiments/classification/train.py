"""Sequence classification (the non-crossing research document's study): a bidirectional encoder with a mechanism
chosen per layer.

    .venv/bin/python -m experiments.classification --task listops --n 512 --mechanism dense --config small

Tasks (`sparse_attn.data.tasks`, docs/tasks.md): listops, dyck (n = padded length), pathfinder (n = size**2),
digits (n = 64), cifar10 (n = 1024 grayscale or 3072 RGB; needs the TFDS data prepared). Mechanism: one name
for every layer or one per layer, `--mechanism dense,dense,noncrossing_defect,noncrossing_defect,dense,dense`
(`--help` lists the registered names). Pixel tasks feed one token per pixel (as LRA).

Configs (each function's docstring has its command and expected result): `smoke` (CI, seconds), `small`
(CPU, minutes), `cpu` (the CPU grid of docs/results.md), `full` (the research document's 6 x 256 encoder; a GPU job:
experiments/gpu/classify.py). Pathfinder at n = 128 / 512 is an 11x11 / 22x22 image padded to n. The workdir gets the loop's `metrics.jsonl`,
`checkpoints/` (re-running resumes), and `result.json`: validation accuracy (per depth/distance bucket for
ListOps/Dyck), loss, training FLOPs (sparse_attn/studies/classification.py), compiled train-step memory, time per
step, tokens/s and every layer's statistics. `--results FILE` also appends the result as one JSON line (the
grid, `experiments/classification/grid.py`, and the report, `experiments/reports/results.py`, read those). The
"valid" records of `metrics.jsonl` are batch means of sums (`correct`, `count`, ...): accuracy = correct / count.

Writes: the workdir (metrics.jsonl, checkpoints/, result.json, loss_curves.png, accuracy.png); with --results, one
JSON line there.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import shlex
import sys

import jax

from experiments.classification.configs import CONFIGS, ClassifyConfig
from sparse_attn.data.prefetch import PrefetchBatches
from sparse_attn.data.tasks import eval_batches
from sparse_attn.models import TransformerClassifier
from sparse_attn.studies import classification as cm
from sparse_attn.studies import cli
from sparse_attn.studies.curves import plot_run
from sparse_attn.studies import warm_start as rws
from sparse_attn.studies.mechanisms import mechanism_names
from sparse_attn.studies.overrides import apply_overrides
from sparse_attn.studies.runs import git_commit
from sparse_attn.studies.tasks import TASKS, task_buckets
from sparse_attn.train import read_metrics
from sparse_attn.train import train_and_evaluate as train_loop

# ---------------------------------------------------------------------------------------------- run

def router_warm_start(config: ClassifyConfig, log=print):
    """The train loop's `warm_start` for `config`: layer 0's router fitted on the last training words (one batch
    of `global_batch` a step; Dyck words carry no class information for the router's targets), or None."""
    steps, size = config.router_warm_start, config.train.global_batch
    if not steps:
        return None
    offset = len(config.task.source("train")) - steps * size
    if offset < 0:
        raise ValueError(f"router_warm_start: {steps} steps of {size} words need {steps * size} training words, "
                         f"the task has {offset + steps * size}")
    num_layers = rws.route_layers(config.model)

    def warm_start(model) -> None:
        batches = rws.dyck_batches(config.task, "train", size, steps, num_layers, offset=offset)
        rws.fit_router(model, batches, steps, lr=config.router_warm_lr, log=log)

    return warm_start


def warm_start_record(config: ClassifyConfig) -> dict:
    """The warm start's part of the checkpointed experiment: nothing without one, so that runs started before the
    option existed still resume; a resume with another warm start (or none) is refused."""
    if not config.router_warm_start:
        return {}
    return {"router_warm_start": config.router_warm_start, "router_warm_lr": config.router_warm_lr}


# May differ on resume: executors compute the same attention (tested against the reference).
ALWAYS_ALLOWED = ("model.attention*.implementation",)


def train_and_evaluate(config: ClassifyConfig, workdir: str, log=print, allowed_changes=(), command: str = "",
                       profile_steps=None) -> dict:  # fmt: skip
    """Train (or resume) in `workdir`; returns the result row (also `<workdir>/result.json`). `profile_steps`:
    (a, b), a `jax.profiler` trace of steps a to b in `<workdir>/profile` (docs/training.md)."""
    tc, task = config.train, config.task
    shard = dict(process_index=jax.process_index(), process_count=jax.process_count())
    train_source = task.source("train")
    valid_source = task.source("validation")
    num_valid = min(config.num_validation, len(valid_source))
    # Built once: generated tasks cost ~1 ms per example, and every evaluation reads the same set.
    valid = list(eval_batches(valid_source, global_batch=tc.global_batch, num_examples=num_valid, **shard))
    buckets = task_buckets(task)
    train_iter = PrefetchBatches(train_source, global_batch=tc.global_batch, seed=tc.seed, **shard)
    try:
        summary = train_loop(
            tc, workdir,
            make_model=lambda rngs: TransformerClassifier(config.model, rngs=rngs),
            loss_fn=cm.classification_loss,
            eval_fn=cm.make_eval_fn(config.model, tc.seq_len, buckets),
            train_iter=train_iter,
            eval_batches=lambda: valid,
            experiment={"name": config.name, "task_name": config.task_name, "task": task,
                        "mechanisms": list(config.mechanisms), "model": config.model, "num_validation": num_valid,
                        **warm_start_record(config)},
            allowed_changes=(*ALWAYS_ALLOWED, *allowed_changes),
            log=log,
            warm_start=router_warm_start(config, log),
            profile_steps=profile_steps,
        )
    finally:
        train_iter.close()
    row = json_safe(result_row(config, summary, workdir, num_validation=num_valid, command=command))
    if jax.process_index() == 0:
        with open(os.path.join(workdir, "result.json"), "w") as f:
            json.dump(row, f, indent=1)
        rate = lambda r: r["correct"] / r["count"] if r.get("count") else None  # noqa: E731
        plot_run(workdir, train=lambda r: None, valid=rate, ylabel="validation accuracy", name="accuracy.png")
        plot_run(workdir, train=lambda r: r.get("loss"), valid=lambda r: r["nll_sum"] / r["count"]
                 if r.get("count") else None, ylabel="loss (nats)")  # fmt: skip
    return row



def result_row(config: ClassifyConfig, summary: dict, workdir: str, *, num_validation: int, command: str = "") -> dict:
    """One JSON line of results: the run's identity, accuracy, FLOPs, memory, speed and statistics."""
    m = config.model
    heads, head_dim = m.num_heads, m.model_dim // m.num_heads
    evals = cm.summarize({k: v for k, v in summary["eval"].items() if k != "step"}, task_buckets(config.task),
                         heads=heads, head_dim=head_dim)
    tc = config.train
    flops = cm.training_flops(
        param_count=summary["param_count"], embed_params=m.vocab_size * m.model_dim,
        head_params=m.model_dim * m.num_classes + m.num_classes, global_batch=tc.global_batch, seq_len=tc.seq_len,
        attn_fwd_flops_per_example=evals["attn_fwd_flops_per_example"],
    )
    mem = summary.get("memory_mib", {})
    peak = (mem.get("argument_mib", 0) + mem.get("output_mib", 0) - mem.get("alias_mib", 0)
            + mem.get("temp_mib", 0)) if mem else float("nan")
    tok_s = summary["tokens_per_s"]
    train = summary.get("train", {})
    return {
        "kind": "classify",
        "task": config.task_name, "n": tc.seq_len, "mechanism": attention_label(config),
        "router_warm_start": config.router_warm_start,
        "config": config.name, "seed": tc.seed, "steps": summary["step"],
        "accuracy": evals["accuracy"], "valid_loss": evals["valid_loss"],
        "accuracy_by_bucket": evals.get("accuracy_by_bucket"),
        "train_loss": train.get("nll"), "train_accuracy": train.get("accuracy"),
        "param_count": summary["param_count"],
        "flops": {**flops, "total": flops["per_step"] * summary["step"]},
        "curve": loss_curve(workdir, flops["per_step"]),
        "memory_mib": {**mem, "peak_mib": peak},
        "step_s": tc.global_batch * tc.seq_len / tok_s if tok_s and math.isfinite(tok_s) else None,
        "tokens_per_s": tok_s if math.isfinite(tok_s) else None,
        "wall_s": summary["wall_s"],
        "layers": [{"mechanism": a, **layer} for a, layer in zip(config.mechanisms, evals["layers"], strict=True)],
        "model": {"layers": m.num_layers, "dim": m.model_dim, "heads": m.num_heads, "mlp": m.mlp_dim},
        "global_batch": tc.global_batch, "num_validation": num_validation,
        "backend": jax.default_backend(), "device": str(jax.devices()[0].device_kind),
        "jax": jax.__version__,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command, "workdir": workdir, "git_commit": git_commit(),
    }


def loss_curve(workdir: str, flops_per_step: float) -> list[dict]:
    """Validation accuracy and loss at every evaluation against cumulative training FLOPs ("loss per FLOP")."""
    if not os.path.exists(os.path.join(workdir, "metrics.jsonl")):  # only process 0 writes metrics
        return []
    return [{"step": step, "train_flops": step * flops_per_step, "accuracy": r["correct"] / r["count"],
             "valid_loss": r["nll_sum"] / r["count"]}
            for step, r in read_metrics(workdir, "valid").items() if r.get("count")]


def attention_spec(names: tuple[str, ...]) -> str:
    """The `--mechanism` value for per-layer names: one name if every layer has it (the grid's key)."""
    return names[0] if len(set(names)) == 1 else ",".join(names)


def attention_label(config: ClassifyConfig) -> str:
    """The rows' mechanism name: the attention spec, `+warm<steps>` when the router was warm-started."""
    return with_warm(attention_spec(config.mechanisms), config.router_warm_start)


def with_warm(spec: str, warm_steps: int) -> str:
    return f"{spec}+warm{warm_steps}" if warm_steps else spec


def json_safe(x):
    """NaN/inf (e.g. an empty bucket's accuracy) -> None, so every line is strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def default_workdir(args) -> str:
    att = with_warm(args.mechanism.replace(",", "+"), args.router_warm_start)
    return os.path.join("runs", "classify", f"{args.task}_n{args.n}_{att}_{args.config}_s{args.seed}")


def parse_args(argv=None) -> argparse.Namespace:
    parser = cli.ArgumentParser(__doc__)
    parser.add_argument("--task", choices=TASKS, required=True)
    parser.add_argument("--n", type=int, required=True, help="sequence length (images: pixels)")
    parser.add_argument("--mechanism", default="dense",
                        help=f"comma-separated, one per layer or one for all: {', '.join(mechanism_names(encoder=True))}")
    parser.add_argument("--config", choices=sorted(CONFIGS), default="small")
    parser.add_argument("--seed", type=int, default=0, help="init and batch order (the data set is fixed)")
    parser.add_argument("--num_steps", type=int)
    parser.add_argument("--workdir", help="default runs/classify/<task>_n<n>_<mechanism>_<config>_s<seed>")
    parser.add_argument("--results", help="append the result row to this JSONL file")
    parser.add_argument("--router_warm_start", type=int, default=0, metavar="STEPS",
                        help="dyck: first fit layer 0's defect-pair router to the bracket matching for STEPS steps")
    parser.add_argument("--router_warm_lr", type=float, default=1e-2, help="the warm start's Adam learning rate")
    parser.add_argument("--allow_change", action="append", default=[], metavar="FIELD",
                        help="on resume, accept this config field (fnmatch pattern) differing; repeatable")
    cli.add_profile_steps(parser)
    cli.add_overrides(parser)
    return parser.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> ClassifyConfig:
    config = CONFIGS[args.config](args.task, args.n, args.mechanism, args.seed)
    if args.num_steps is not None:
        config = dataclasses.replace(config, train=dataclasses.replace(config.train, num_steps=args.num_steps))
    if args.router_warm_start:
        config = dataclasses.replace(config, router_warm_start=args.router_warm_start,
                                     router_warm_lr=args.router_warm_lr)
    return apply_overrides(config, args.overrides)


@cli.entry_point
def main(argv=None) -> dict:
    args = parse_args(argv)
    config = config_from_args(args)
    command = "python -m experiments.classification " + shlex.join(argv if argv is not None else sys.argv[1:])
    row = train_and_evaluate(config, args.workdir or default_workdir(args), allowed_changes=args.allow_change,
                             command=command, profile_steps=args.profile_steps)
    if args.results and jax.process_index() == 0:
        os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
        with open(args.results, "a") as f:
            f.write(json.dumps(row) + "\n")
    print(json.dumps({k: row[k] for k in ("task", "n", "mechanism", "steps", "accuracy", "valid_loss", "step_s")}))
    return row


if __name__ == "__main__":
    main()
