"""Byte-level causal LM on the embedded corpus (the interpreter's stdlib source); attention chosen per layer.

Smoke run (the README's main job; CPU, no download):

    .venv/bin/python -m experiments.lm --config smoke --workdir runs/lm_smoke

Hardware: 2 CPU cores (no accelerator), CPython 3.11 stdlib (12.1 MB). Measured: 5 min 42 s wall while
the machine was shared with other jobs (load ~12; the run got 52% of the 2 cores, 180 CPU-seconds), so
expect about 2-3 minutes on an idle machine. Result: validation bits per byte 2.158 at step 500 (2.454 at
step 250; a byte unigram model scores 4.7 and a bigram 3.5 on this corpus). The run is deterministic.
Outputs in the workdir: `metrics.jsonl`, `loss_curves.png`, `summary.json`, `checkpoints/`. Re-running
the command resumes from the last checkpoint; a finished run only re-evaluates. A resume with another
model, data or schedule is refused naming the fields; `--allow_change train.num_steps` (an fnmatch
pattern, repeatable) accepts a change on purpose, e.g. extending a run with a longer schedule.

Mechanism per layer: `--mechanism local,dense` (one name per layer, or one name for all layers; `--help` lists
the registered names).
Multi-host: see `sparse_attn/train/distributed.py` and docs/training.md.

Writes: the workdir: metrics.jsonl, checkpoints/, summary.json, loss_curves.png.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax

from experiments.lm.configs import CONFIGS, LMConfig, attention_by_name
from sparse_attn.data import (
    RandomWindows,
    ShakespeareSource,
    SplitFilesSource,
    StdlibSource,
    TextSource,
    TfdsSource,
    eval_batches,
)
from sparse_attn.models import TransformerLM
from sparse_attn.studies import cli
from sparse_attn.studies.curves import plot_run
from sparse_attn.studies.lm import corpus_fingerprint, eval_fn, loss_fn
from sparse_attn.studies.mechanisms import mechanism_names, parse_names
from sparse_attn.studies.overrides import apply_overrides
from sparse_attn.train import distributed
from sparse_attn.train import train_and_evaluate as train_loop

# ---------------------------------------------------------------------------------------------- model and loss

# ---------------------------------------------------------------------------------------------- run

# May differ on resume without --allow_change: the executor computes the same attention (tested
# against the reference); stored runs from before name the executor the LM configs pinned ("reference" for dense on
# CPU), which the executor registry now picks for None (sparse_attn/executors/reference.py).
ALWAYS_ALLOWED = ("model.attention*.implementation",)


def train_and_evaluate(config: LMConfig, workdir: str, log=print, allowed_changes=(), profile_steps=None) -> dict:
    """Train (or resume) in `workdir`; write metrics, `summary.json` and `loss_curves.png`.

    `allowed_changes`: config paths (fnmatch patterns) a resume may change, e.g. `train.num_steps`.
    `profile_steps`: (a, b), a `jax.profiler` trace of steps a to b in `<workdir>/profile` (docs/training.md).
    """
    tc = config.train
    corpus = config.data.load()
    log(f"corpus: {corpus.summary()}")
    shard = dict(global_batch=tc.global_batch, seq_len=tc.seq_len,
                 process_index=jax.process_index(), process_count=jax.process_count())
    summary = train_loop(
        tc, workdir,
        make_model=lambda rngs: TransformerLM(config.model, rngs=rngs),
        loss_fn=loss_fn, eval_fn=eval_fn,
        train_iter=RandomWindows(corpus.train_U8, seed=tc.seed, **shard),
        eval_batches=lambda: eval_batches(corpus.valid_U8, num_batches=tc.eval_batches, **shard),
        experiment={"model": config.model, "data": config.data, "corpus": corpus_fingerprint(corpus)},
        allowed_changes=(*ALWAYS_ALLOWED, *allowed_changes),
        log=log,
        profile_steps=profile_steps,
    )
    summary["corpus"] = corpus.summary()
    if jax.process_index() == 0:
        with open(os.path.join(workdir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1, default=str)
        summary["plot"] = plot_loss_curves(workdir)
    return summary


def plot_loss_curves(workdir: str) -> str:
    """Train and validation bits per byte against step, as `<workdir>/loss_curves.png`."""
    bpb = lambda r: r.get("bits_per_byte")  # noqa: E731
    return plot_run(workdir, train=bpb, valid=bpb, ylabel="bits per byte")


def print_summary(summary: dict) -> None:
    ev, tr = summary["eval"], summary.get("train", {})
    lines = [
        f"steps            {summary['step']}",
        f"parameters       {summary['param_count']:,}",
        f"devices          {summary['num_devices']}",
        f"train bits/byte  {tr.get('bits_per_byte', float('nan')):.4f} (step {tr.get('step', '-')})",
        f"valid bits/byte  {ev['bits_per_byte']:.4f} (step {ev['step']})",
        f"tokens/s         {summary['tokens_per_s']:,.0f}",
        f"wall             {summary['wall_s']:.1f} s",
        f"checkpoints      {summary['checkpoint_dir']}",
        f"loss curves      {summary.get('plot', '-')}",
    ]
    print("\n".join(["== summary =="] + lines))


def data_source(args):
    """The data source the flags name (None: the config's own)."""
    if args.text:
        return TextSource(path=args.text)
    if args.train_file:
        return SplitFilesSource(train=args.train_file, valid=args.valid_file, test=args.test_file)
    if args.tfds:
        return TfdsSource(name=args.tfds)
    return {"stdlib": StdlibSource(), "shakespeare": ShakespeareSource(), None: None}[args.corpus]


@cli.entry_point
def main(argv=None) -> dict:
    parser = cli.ArgumentParser(__doc__)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="smoke")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--mechanism", help="comma-separated, one per layer or one for all: "
                        f"{', '.join(mechanism_names(causal=True))}")
    parser.add_argument("--num_steps", type=int)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--text", help="train on this text file or folder instead of the stdlib corpus")
    source.add_argument("--train_file", help="official splits as files (with --valid_file, optional --test_file), "
                        "e.g. WikiText-103-raw's wiki.train.raw")
    source.add_argument("--tfds", metavar="NAME", help="a TFDS text dataset (the data extra; prepared locally)")
    source.add_argument("--corpus", choices=("stdlib", "shakespeare"),
                        help="an offline corpus: the stdlib source (default) or Shakespeare's plays (the corpora "
                             "extra)")
    parser.add_argument("--valid_file")
    parser.add_argument("--test_file")
    parser.add_argument("--allow_change", action="append", default=[], metavar="FIELD",
                        help="on resume, accept this config field (fnmatch pattern) differing from the "
                             "checkpoint's, e.g. train.num_steps to extend a run; repeatable")
    parser.add_argument("--coordinator", help="multi-host: host:port of process 0, or 'auto'")
    parser.add_argument("--num_processes", type=int)
    parser.add_argument("--process_id", type=int)
    cli.add_profile_steps(parser)
    cli.add_overrides(parser)
    args = parser.parse_args(argv)

    distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    config = CONFIGS[args.config]()
    # Sizes first (--mechanism builds one attention config per layer), then every override again, last.
    config = apply_overrides(config, [o for o in args.overrides if not o.startswith("model.attention")])
    if args.mechanism:
        names = parse_names(args.mechanism, config.model.num_layers)
        att = tuple(attention_by_name(n, config.train.seq_len) for n in names)
        config = dataclasses.replace(config, model=dataclasses.replace(config.model, attention=att))
    if args.num_steps is not None:
        config = dataclasses.replace(config, train=dataclasses.replace(config.train, num_steps=args.num_steps))
    if (args.valid_file or args.test_file) and not args.train_file:
        parser.error("--valid_file and --test_file go with --train_file")
    if args.train_file and not args.valid_file:
        parser.error("--train_file needs --valid_file")
    source = data_source(args)
    if source is not None:
        config = dataclasses.replace(config, data=source)
    config = apply_overrides(config, args.overrides)
    summary = train_and_evaluate(config, args.workdir, allowed_changes=args.allow_change,
                                 profile_steps=args.profile_steps)
    if jax.process_index() == 0:
        print_summary(summary)
    return summary


if __name__ == "__main__":
    main()
