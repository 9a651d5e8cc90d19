"""What building each pattern once per forward saves: layers sharing a prepared pattern vs each layer building its own.

    nice -n 10 python -m experiments.benchmarks.shared_patterns                 # 4 layers x 128, n=1024, batch 8

The byte LM with one baseline mechanism in all `--layers` layers (equal configs, so one pattern serves them all),
trained one step at a time. "shared": the model builds the pattern and its statistics once per forward
(`models.transformer.shared_per_config`, `ctx.shared`); "per_layer": the same model with that hook disabled, so
every layer builds its own (the behaviour before it existed; XLA may still merge the identical copies). Reported per
mechanism and mode: trace + lower and compile time (wall and process CPU), fusions in the compiled step, and the
median step time, the modes interleaved over `--rounds`. Results: `experiments/results/bench_shared_patterns.{json,md}`.

Writes: experiments/results/bench_shared_patterns.{md,json}.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from unittest import mock

import jax

from experiments.benchmarks import lm_step as bench_lm_step
from experiments.lm import configs as lm_configs
from sparse_attn.data import RandomWindows
from sparse_attn.models import TransformerLM, transformer
from sparse_attn.studies import bench as benchlib
from sparse_attn.studies import cli
from sparse_attn.studies import lm as lm_objective
from sparse_attn.studies.mechanisms import mechanism_names
from sparse_attn.train import state as state_lib
from sparse_attn.train import step as step_lib

MODES = ("shared", "per_layer")


def build(name: str, seq_len: int, batch: int, layers: int):
    cfg = lm_configs.smoke()
    train = dataclasses.replace(cfg.train, seq_len=seq_len, global_batch=batch)
    model_cfg = dataclasses.replace(cfg.model, num_layers=layers, attention=lm_configs.attention_by_name(name, seq_len))
    make_model = lambda rngs: TransformerLM(model_cfg, rngs=rngs)  # noqa: E731
    tx = state_lib.make_optimizer(train)
    graphdef = state_lib.graphdef_of(make_model)
    step = step_lib.make_train_step(graphdef, tx, lm_objective.loss_fn, state_lib.learning_rate_schedule(train))
    return step, jax.jit(state_lib._init_fn(make_model, tx, train.seed))


def measure(name: str, mode: str, args, batches) -> dict:
    hook = transformer.shared_per_config if mode == "shared" else (lambda *a, **k: {})
    with mock.patch.object(transformer, "shared_per_config", hook):
        jax.clear_caches()  # each mode compiles from scratch
        build_fn = lambda *a: build(name, args.seq_len, args.batch, args.layers)  # noqa: E731
        with mock.patch.object(bench_lm_step, "build", build_fn):
            return bench_lm_step.measure(name, None, args.seq_len, args.batch, batches, args.repeats)


@cli.entry_point
def main(argv=None) -> dict:
    p = cli.ArgumentParser(__doc__)
    p.add_argument("--seq_len", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    benchlib.add_timing_args(p, out_dir=None, batch=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--mechanisms", default="local,longformer,bigbird")
    p.add_argument("--out", default="experiments/results")
    args = p.parse_args(argv)
    names = bench_lm_step.check_names(p, "--mechanisms", args.mechanisms, mechanism_names(causal=True))
    command = benchlib.command_line("experiments.benchmarks.shared_patterns", argv)

    corpus = lm_configs.smoke().data.load()
    it = RandomWindows(corpus.train_U8, seed=0, global_batch=args.batch, seq_len=args.seq_len, process_index=0,
                       process_count=1)
    batches = [next(it) for _ in range(args.repeats + 1)]
    raw = {(m, mode): [] for m in names for mode in MODES}
    for r in range(args.rounds):
        for name, mode in raw:
            res = measure(name, mode, args, batches)
            raw[(name, mode)].append(res)
            print(f"round {r} {name:10s} {mode:9s} lower {res['lower_cpu_s']:.2f} cpu-s compile "
                  f"{res['compile_cpu_s']:.2f} cpu-s fusions {res['fusions']} step {res['step_s'] * 1e3:.1f} ms "
                  f"loss {res['losses'][0]:.4f}->{res['losses'][-1]:.4f}", flush=True)

    med = {c: {k: statistics.median(x[k] for x in runs) for k in runs[0] if k != "losses"} for c, runs in raw.items()}
    lines = [
        f"Command: `{command}` ({args.layers} layers x 128, n={args.seq_len}, batch {args.batch}; median of "
        f"{args.repeats} steps, median over {args.rounds} interleaved rounds; load average at end "
        f"{os.getloadavg()[0]:.1f}).",
        "",
        "| mechanism | mode | lower cpu-s | compile cpu-s | fusions | step ms | same losses |",
        "|---|---|---|---|---|---|---|",
    ]
    for (name, mode), m in med.items():
        same = raw[(name, mode)][0]["losses"] == raw[(name, "shared")][0]["losses"]
        lines.append(f"| {name} | {mode} | {m['lower_cpu_s']:.2f} | {m['compile_cpu_s']:.2f} | {m['fusions']:.0f} | "
                     f"{m['step_s'] * 1e3:.1f} | {'yes' if same else 'no'} |")
    table = "\n".join(lines)
    print(table)
    base = os.path.join(args.out, "bench_shared_patterns")
    os.makedirs(args.out, exist_ok=True)
    with open(base + ".md", "w") as f:
        f.write(table + "\n")
    with open(base + ".json", "w") as f:
        rows = [dict(mechanism=n, mode=mo, **med[(n, mo)], runs=raw[(n, mo)]) for n, mo in raw]
        json.dump(dict(command=command, environment=benchlib.environment(), config=vars(args), rows=rows), f, indent=1)
    return med


if __name__ == "__main__":
    main()
