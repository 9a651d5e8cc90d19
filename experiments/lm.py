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

Attention per layer: `--attention local,dense` (one name per layer, or one name for all layers; names in
`ATTENTION_NAMES`: dense, local, longformer, bigbird, labels, abca).
Multi-host: see `sparse_attn/train/distributed.py` and docs/training.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import zlib

import jax
import jax.numpy as jnp
import optax

from experiments.attention_names import parse_names
from sparse_attn.data import RandomWindows, StdlibSource, TextSource, TfdsSource, eval_batches
from sparse_attn.models import TransformerConfig, TransformerLM
from sparse_attn.modules import BigBirdAttention, DenseAttention, LocalAttention, LongformerAttention
from sparse_attn.train import TrainConfig, distributed, read_metrics
from sparse_attn.train import train_and_evaluate as train_loop

LN2 = math.log(2.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LMConfig:
    """One experiment: model (attention per layer), data source, training."""

    model: TransformerConfig
    data: StdlibSource | TextSource | TfdsSource = StdlibSource()
    train: TrainConfig


# ---------------------------------------------------------------------------------------------- configs

def _labels(window: int, seq_len: int):
    from sparse_attn.modules.labels import LabelAttentionConfig  # noqa: PLC0415 — research mechanism

    return LabelAttentionConfig(radius=window, block=min(128, seq_len), soft_block=min(64, seq_len))


def _abca(window: int, impl: str | None):
    from sparse_attn.modules.abca import AnchorAttentionConfig  # noqa: PLC0415 — research mechanism

    # Anchors at newline bytes (the corpus is source code: zones are lines), at most `window` bytes apart.
    return AnchorAttentionConfig(
        placement="explicit", anchor_id=ord("\n"), vocab_size=256, max_zone=window, implementation=impl
    )


# Causal mechanisms only: non-crossing routing attention is bidirectional (encoders).
ATTENTION_NAMES = ("dense", "local", "longformer", "bigbird", "labels", "abca")


# The implementation each mechanism runs on CPU when none is asked for, by measurement (`python -m
# experiments.bench_lm_step --rounds 3` at n = 128 on a quiet machine, `--seq_len 512 --batch 8 --rounds 2 --tag n512`
# at load ~4; experiments/results/bench_lm_step{,_n512}.md; reference/default CPU time): dense takes "reference"
# (0.97x at 128, 0.84x at 512: the materialised softmax beats the blocked "xla" default); local (1.03x, 1.45x),
# Longformer (0.94x, 1.27x), BigBird (0.84x, 1.16x) and ABCA (1.35x at 128) keep their default executors, which win
# from the grids' lengths (256-1024) on. Losses agree to 5e-7. Labels pick only their hard phase's executor
# (`LabelAttentionConfig.implementation`). Accelerators use None.
CPU_IMPLEMENTATION = {"dense": "reference", "local": None, "longformer": None, "bigbird": None, "abca": None}
AUTO = "auto"


def pinned_implementation(name: str) -> str | None:
    """The implementation `attention_by_name` gives mechanism `name` on this backend."""
    return CPU_IMPLEMENTATION.get(name) if jax.default_backend() == "cpu" else None


def attention_by_name(name: str, seq_len: int, implementation: str | None = AUTO):
    """The mechanisms available to `--attention`; `implementation=AUTO` takes `pinned_implementation(name)`."""
    impl = pinned_implementation(name) if implementation == AUTO else implementation
    window = max(seq_len // 4, 1)
    table = {
        "dense": lambda: DenseAttention(implementation=impl),
        "local": lambda: LocalAttention(radius=window, implementation=impl),
        "longformer": lambda: LongformerAttention(radius=window, num_global=1, implementation=impl),
        "bigbird": lambda: BigBirdAttention(radius=window, num_global=1, num_random=1, block=min(32, seq_len),
                                            implementation=impl),
        "labels": lambda: _labels(window, seq_len),
        "abca": lambda: _abca(window, impl),
    }
    assert tuple(table) == ATTENTION_NAMES
    if name not in table:
        raise ValueError(f"unknown attention {name!r}; choose from {sorted(table)}")
    return table[name]()


def smoke() -> LMConfig:
    """CPU, 2 cores: 2 layers (local, dense) x 128 wide (0.46M params), 128-byte context, 2M training bytes."""
    seq_len = 128
    return LMConfig(
        model=TransformerConfig(
            vocab_size=256, model_dim=128, num_heads=4, num_layers=2, mlp_dim=512,
            attention=(attention_by_name("local", seq_len), attention_by_name("dense", seq_len)),
        ),
        train=TrainConfig(
            seed=0, global_batch=32, seq_len=seq_len, num_steps=500, learning_rate=3e-3, warmup_steps=50,
            weight_decay=0.1, grad_clip=1.0, checkpoint_every=250, keep_checkpoints=2, eval_every=250,
            eval_batches=16,
        ),
    )


def base() -> LMConfig:
    """One GPU (H100/H200 class): 6 layers x 512 wide (~19M params), 1024-byte context, 131M training
    bytes (~13 passes over the 10 MB corpus; watch the validation curve for overfitting).

    Command: `python -m experiments.lm --config base --workdir runs/lm_base`. Not yet run: record the
    wall clock and validation bits per byte here after the first run.
    """
    seq_len = 1024
    return LMConfig(
        model=TransformerConfig(
            vocab_size=256, model_dim=512, num_heads=8, num_layers=6, mlp_dim=2048,
            attention=attention_by_name("dense", seq_len),
        ),
        train=TrainConfig(
            seed=0, global_batch=64, seq_len=seq_len, num_steps=2000, learning_rate=1e-3, warmup_steps=200,
            checkpoint_every=500, eval_every=250, eval_batches=32,
        ),
    )


# Label attention through every phase (docs/labels.md, "Phase transitions: measurement"): the smoke model with
# label attention in both layers at its defaults (the schedule scaled to num_steps), and fixed local attention of
# radius EQUAL_PAIRS_RADIUS (5 keys per query: balanced top-2-of-32 labels give ~5; trained routers gave 7.6-16.7,
# see the docs). A smaller batch and fewer steps than `smoke`:
# on the 2 shared cores at load ~36 a label step of this size took ~10 s and the compile ~25 min.
EQUAL_PAIRS_RADIUS = 4


def smoke_labels(attention: str = "labels", **label_overrides) -> LMConfig:
    """`smoke`'s model, label attention (or local at EQUAL_PAIRS_RADIUS) in both layers; batch 8, 240 steps."""
    from sparse_attn.modules.labels import LabelAttentionConfig  # noqa: PLC0415 — research mechanism

    config = smoke()
    seq_len = config.train.seq_len
    if attention == "labels":
        att = LabelAttentionConfig(radius=max(seq_len // 4, 1), block=min(128, seq_len),
                                   soft_block=min(64, seq_len), **label_overrides)
    else:
        att = LocalAttention(radius=EQUAL_PAIRS_RADIUS)
    model = dataclasses.replace(config.model, attention=(att, att))
    train = dataclasses.replace(config.train, global_batch=8, num_steps=240, warmup_steps=24, checkpoint_every=120,
                                eval_every=40, eval_batches=4)
    return LMConfig(model=model, train=train)


CONFIGS = {
    "smoke": smoke,
    "base": base,
    "smoke_labels": smoke_labels,
    "smoke_labels_local": lambda: smoke_labels("local"),
    # The transition before the ramp, for comparison: σ(R/τ) memberships, soft -> straight-through at once.
    "smoke_labels_no_ramp": lambda: smoke_labels(membership="sigmoid", ramp_frac=0.0, straight_through_frac=0.5),
}


# ---------------------------------------------------------------------------------------------- model and loss

def loss_fn(model: TransformerLM, batch: dict, step: jax.Array):
    out = model(batch["inputs"], step=step)
    nll = optax.softmax_cross_entropy_with_integer_labels(out.logits.astype(jnp.float32), batch["targets"]).mean()
    metrics = {"nll": nll, "bits_per_byte": nll / LN2, "aux_loss": out.aux_loss, **out.stats}
    return nll + out.aux_loss, metrics


def eval_fn(model: TransformerLM, batch: dict, step: jax.Array) -> dict:
    """Validation metrics at the train state's `step`: step-scheduled layers (label attention) run their phase."""
    out = model(batch["inputs"], step=step)
    nll = optax.softmax_cross_entropy_with_integer_labels(out.logits.astype(jnp.float32), batch["targets"]).mean()
    return {"nll": nll, "bits_per_byte": nll / LN2}


# ---------------------------------------------------------------------------------------------- run

# May differ on resume without --allow_change: the executor computes the same attention (tested
# against the reference), and the CPU pin per mechanism (CPU_IMPLEMENTATION) may change with new measurements.
ALWAYS_ALLOWED = ("model.attention*.implementation",)


def corpus_fingerprint(corpus) -> dict:
    """Sizes and CRC-32s of the bytes trained and validated on: a resume on other data is refused."""
    return {**corpus.summary(), "train_crc32": zlib.crc32(corpus.train_U8.tobytes()),
            "valid_crc32": zlib.crc32(corpus.valid_U8.tobytes())}


def train_and_evaluate(config: LMConfig, workdir: str, log=print, allowed_changes=()) -> dict:
    """Train (or resume) in `workdir`; write metrics, `summary.json` and `loss_curves.png`.

    `allowed_changes`: config paths (fnmatch patterns) a resume may change, e.g. `train.num_steps`.
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
    )
    summary["corpus"] = corpus.summary()
    if jax.process_index() == 0:
        with open(os.path.join(workdir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1, default=str)
        summary["plot"] = plot_loss_curves(workdir)
    return summary


def plot_loss_curves(workdir: str) -> str:
    """Train and validation bits per byte against step, as `<workdir>/loss_curves.png`."""
    import matplotlib  # noqa: PLC0415 — only the summary needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    train, valid = read_metrics(workdir, "train"), read_metrics(workdir, "valid")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(list(train), [r["bits_per_byte"] for r in train.values()], lw=0.8, label="train")
    ax.plot(list(valid), [r["bits_per_byte"] for r in valid.values()], "o-", label="validation")
    ax.set(xlabel="step", ylabel="bits per byte", title=os.path.basename(os.path.abspath(workdir)))
    ax.grid(alpha=0.3)
    ax.legend()
    path = os.path.join(workdir, "loss_curves.png")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


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


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="smoke")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--attention", help="comma-separated names, one per layer (or one for all)")
    parser.add_argument("--num_steps", type=int)
    parser.add_argument("--text", help="train on this text file or folder instead of the stdlib corpus")
    parser.add_argument("--allow_change", action="append", default=[], metavar="FIELD",
                        help="on resume, accept this config field (fnmatch pattern) differing from the "
                             "checkpoint's, e.g. train.num_steps to extend a run; repeatable")
    parser.add_argument("--coordinator", help="multi-host: host:port of process 0, or 'auto'")
    parser.add_argument("--num_processes", type=int)
    parser.add_argument("--process_id", type=int)
    args = parser.parse_args(argv)

    distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    config = CONFIGS[args.config]()
    if args.attention:
        names = parse_names(args.attention, config.model.num_layers)
        att = tuple(attention_by_name(n, config.train.seq_len) for n in names)
        config = dataclasses.replace(config, model=dataclasses.replace(config.model, attention=att))
    if args.num_steps is not None:
        config = dataclasses.replace(config, train=dataclasses.replace(config.train, num_steps=args.num_steps))
    if args.text:
        config = dataclasses.replace(config, data=TextSource(path=args.text))
    summary = train_and_evaluate(config, args.workdir, allowed_changes=args.allow_change)
    if jax.process_index() == 0:
        print_summary(summary)
    return summary


if __name__ == "__main__":
    main()
