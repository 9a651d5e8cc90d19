"""Train-step time and compile time of the byte LM per attention mechanism, default executor vs "reference".

    nice -n 10 python -m experiments.benchmarks.lm_step                      # smoke shapes: 2 x 128, n=128, batch 32
    nice -n 10 python -m experiments.benchmarks.lm_step --seq_len 256 --tag n256

Each (mechanism, implementation) builds the smoke model with that mechanism in every layer, times
`jax.jit(train_step).lower(state, batch)` (trace + lower) and `.compile()`, then the median wall time of one
compiled step on real corpus windows. `--rounds` repeats the whole sweep with the configurations interleaved, so a
slow phase of the shared machine hits every configuration alike; the table gives the median over rounds and the
default/reference ratio side by side. Results: `experiments/results/bench_lm_step[_tag].{json,md}`.

Writes: experiments/results/bench_lm_step{_TAG}.{md,json}.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import statistics
import time

import jax

from experiments.lm import configs as lm_configs
from sparse_attn.data import RandomWindows
from sparse_attn.models import TransformerLM
from sparse_attn.studies import bench as benchlib
from sparse_attn.studies import cli
from sparse_attn.studies import lm as lm_objective
from sparse_attn.studies.mechanisms import mechanism_names
from sparse_attn.train import state as state_lib
from sparse_attn.train import step as step_lib

# "default" is what the registry picks (None); "xla" the blocked XLA executor, the default the measurement behind
# dense's CPU default ("reference", sparse_attn/executors/reference.py) compared against.
IMPLS = {"default": None, "reference": "reference", "xla": "xla"}
NO_IMPLEMENTATION = ("labels",)  # mechanisms without an implementation option: one row


def build(name: str, impl: str | None, seq_len: int, batch: int):
    cfg = lm_configs.smoke()
    train = dataclasses.replace(cfg.train, seq_len=seq_len, global_batch=batch)
    att = lm_configs.attention_by_name(name, seq_len, implementation=impl)
    model_cfg = dataclasses.replace(cfg.model, attention=att)
    make_model = lambda rngs: TransformerLM(model_cfg, rngs=rngs)  # noqa: E731
    tx = state_lib.make_optimizer(train)
    graphdef = state_lib.graphdef_of(make_model)
    step = step_lib.make_train_step(graphdef, tx, lm_objective.loss_fn, state_lib.learning_rate_schedule(train))
    init = jax.jit(state_lib._init_fn(make_model, tx, train.seed))
    return step, init


def measure(name, impl, seq_len, batch, batches, repeats) -> dict:
    step, init = build(name, impl, seq_len, batch)
    state = init()
    jitted = jax.jit(step, donate_argnums=0)
    t0, c0 = time.perf_counter(), time.process_time()
    lowered = jitted.lower(state, batches[0])
    t1, c1 = time.perf_counter(), time.process_time()
    compiled = lowered.compile()
    t2, c2 = time.perf_counter(), time.process_time()
    state, m = compiled(state, batches[0])  # warm-up
    losses = [float(m["loss"])]
    times, cpu = [], []
    for i in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        state, m = compiled(state, batches[(i + 1) % len(batches)])
        jax.block_until_ready(m)
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        losses.append(float(m["loss"]))
    fusions = len(re.findall(r"= \S+ fusion\(", compiled.as_text()))  # XLA:CPU compile time tracks this count
    return dict(lower_s=t1 - t0, compile_s=t2 - t1, lower_cpu_s=c1 - c0, compile_cpu_s=c2 - c1, fusions=fusions,
                step_s=statistics.median(times), step_cpu_s=statistics.median(cpu), losses=losses)


@cli.entry_point
def main(argv=None) -> dict:
    p = cli.ArgumentParser(__doc__)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5, help="timed steps per measurement (median)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved sweeps (median over rounds)")
    p.add_argument("--mechanisms", default=",".join(mechanism_names(causal=True)))
    p.add_argument("--impls", default="default,reference")
    p.add_argument("--tag", default="")
    p.add_argument("--out", default="experiments/results")
    args = p.parse_args(argv)
    names = check_names(p, "--mechanisms", args.mechanisms, mechanism_names(causal=True))
    impls = check_names(p, "--impls", args.impls, tuple(IMPLS))

    corpus = lm_configs.smoke().data.load()
    it = RandomWindows(corpus.train_U8, seed=0, global_batch=args.batch, seq_len=args.seq_len,
                       process_index=0, process_count=1)
    batches = [next(it) for _ in range(args.repeats + 1)]
    configs = [(m, i) for m in names for i in impls
               if not (m in NO_IMPLEMENTATION and i != "default")]
    raw = {c: [] for c in configs}
    for r in range(args.rounds):
        for name, impl in configs:
            res = measure(name, IMPLS[impl], args.seq_len, args.batch, batches, args.repeats)
            raw[(name, impl)].append(res)
            print(f"round {r} {name:10s} {impl:9s} lower {res['lower_s']:6.2f}s ({res['lower_cpu_s']:.2f} cpu) "
                  f"compile {res['compile_s']:6.2f}s ({res['compile_cpu_s']:.2f} cpu) step {res['step_s'] * 1e3:8.1f} "
                  f"ms ({res['step_cpu_s'] * 1e3:.1f} cpu) loss {res['losses'][0]:.4f}->{res['losses'][-1]:.4f}",
                  flush=True)
            report({c: v for c, v in raw.items() if v}, args, argv)  # after every measurement: a long run can stop
    return report(raw, args, argv, show=True)


def check_names(parser, flag: str, text: str, allowed: tuple[str, ...]) -> list[str]:
    """A comma-separated `flag` value as a list, each one of `allowed`, else a one-line parser error listing them."""
    names = text.split(",")
    if unknown := [n for n in names if n not in allowed]:
        parser.error(f"{flag}: unknown {', '.join(unknown)}; choose from {', '.join(allowed)}")
    return names


def report(raw: dict, args, argv, show: bool = False) -> dict:
    configs = list(raw)
    rows = []
    for name in dict.fromkeys(m for m, _ in configs):
        row = {"mechanism": name}
        for impl in IMPLS:
            runs = raw.get((name, impl))
            if runs:
                row[impl] = {k: statistics.median([x[k] for x in runs]) for k in runs[0] if k != "losses"}
                row[impl]["runs"] = runs
        if "default" in row and "reference" in row:
            d, r = row["default"], row["reference"]
            row["reference_over_default_step"] = r["step_s"] / d["step_s"]
            row["reference_over_default_step_cpu"] = r["step_cpu_s"] / d["step_cpu_s"]
            losses = zip(d["runs"][0]["losses"], r["runs"][0]["losses"], strict=True)
            row["max_abs_loss_diff"] = max(abs(a - b) for a, b in losses)
        rows.append(row)

    command = benchlib.command_line("experiments.benchmarks.lm_step", argv)
    load = os.getloadavg()
    base = os.path.join(args.out, "bench_lm_step" + (f"_{args.tag}" if args.tag else ""))
    os.makedirs(args.out, exist_ok=True)
    with open(base + ".json", "w") as f:
        json.dump(dict(command=command, environment=benchlib.environment(), load_avg_at_end=load,
                       config=vars(args), rows=rows), f, indent=1)
    def cell(r, impl, key, scale=1.0):
        if impl not in r:
            return "-"
        return f"{r[impl][key] * scale:.1f} ({r[impl][key.replace('_s', '_cpu_s')] * scale:.1f})"

    lines = [
        f"Command: `{command}`  (n={args.seq_len}, batch {args.batch}, smoke model 2 x 128 with the mechanism in "
        f"every layer; median of {args.repeats} steps, then median over {args.rounds} interleaved rounds; "
        f"load average at end {load[0]:.1f}). Wall time, process CPU time in brackets.",
        "",
        f"Environment: {benchlib.environment()}",
        "",
        "| mechanism | step ms default | step ms reference | reference / default (wall, cpu) | "
        "compile s default | compile s reference | lower s default | max loss diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = (f"{r['reference_over_default_step']:.2f}x, {r['reference_over_default_step_cpu']:.2f}x"
                 if "reference_over_default_step" in r else "-")
        diff = f"{r['max_abs_loss_diff']:.1e}" if "max_abs_loss_diff" in r else "-"
        lines.append(f"| {r['mechanism']} | {cell(r, 'default', 'step_s', 1e3)} | {cell(r, 'reference', 'step_s', 1e3)} "
                     f"| {ratio} | {cell(r, 'default', 'compile_s')} | {cell(r, 'reference', 'compile_s')} | "
                     f"{cell(r, 'default', 'lower_s')} | {diff} |")
    table = "\n".join(lines)
    with open(base + ".md", "w") as f:
        f.write(table + "\n")
    if show:
        print(table)
    return {"rows": rows}


if __name__ == "__main__":
    main()
