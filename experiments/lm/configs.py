"""The LM study's experiments as data: each config's docstring gives its command and the result it reproduces.

* `CONFIGS` (`python -m experiments.lm --config NAME`): one run of the byte LM on the embedded stdlib corpus.
* `SCALES` and `GRIDS` (`python -m experiments.lm.grid`): the equal-budget comparison, one mechanism in every layer,
  its rows in experiments/results/lm.jsonl (rendered into docs/results.md by `python -m experiments.reports.lm`).
"""

from __future__ import annotations

import dataclasses

from sparse_attn.data import ShakespeareSource, SplitFilesSource, StdlibSource, TextSource, TfdsSource
from sparse_attn.models import TransformerConfig
from sparse_attn.modules import LocalAttention
from sparse_attn.modules.labels import LabelRouterConfig, LabelSchedule
from sparse_attn.studies.cells import Scale, grid_cells
from sparse_attn.studies.mechanisms import Context, attention_config
from sparse_attn.train import TrainConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class LMConfig:
    """One experiment: model (attention per layer), data source, training."""

    model: TransformerConfig
    data: StdlibSource | TextSource | SplitFilesSource | ShakespeareSource | TfdsSource = StdlibSource()
    train: TrainConfig


def attention_by_name(name: str, seq_len: int, implementation: str | None = None):
    """A causal mechanism of the registry (`sparse_attn.studies.mechanisms`) for the byte LM at `seq_len`;
    `implementation=None` leaves the executor to the executor registry, which picks per platform and pattern (on
    CPU, "reference" for dense: sparse_attn/executors/reference.py has the measurement)."""
    return attention_config(name, Context.lm(seq_len, implementation), causal=True)


def smoke() -> LMConfig:
    """The README's main job. CPU, 2 cores: 2 layers (local, dense) x 128 wide (0.46M params), 128-byte context,
    2M training bytes.

    Command: `python -m experiments.lm --config smoke --workdir runs/lm_smoke`. Expected: validation 2.158 bits per
    byte at step 500 (2.454 at 250), 2 min 11 s on 2 idle cores (a byte unigram model scores 4.7, a bigram 3.5).
    """
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
    """`smoke`'s model, label attention (or local at EQUAL_PAIRS_RADIUS) in both layers; batch 8, 240 steps.

    Command: `python -m experiments.lm --config smoke_labels --workdir runs/lab_smoke_labels_defaults`; results
    and the phase-change plot: docs/labels.md ("Phase transitions"), rows experiments/results/labels_phases*.json.
    """
    config = smoke()
    seq_len = config.train.seq_len
    if attention == "labels":
        att = attention_config("labels", Context.lm(seq_len), causal=True, **label_overrides)
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
    "smoke_labels_no_ramp": lambda: smoke_labels(router=LabelRouterConfig(membership="sigmoid"),
                                                  schedule=LabelSchedule(ramp=0.0, straight_through=0.5)),
}


# ---------------------------------------------------------------------------------------------- the grid

SCALES = {
    # CI: seconds (batch 8: the tests run on 8 CPU devices).
    "smoke": Scale(layers=1, dim=32, heads=2, mlp=64, batch=8, steps=4, lr=1e-3, warmup=1, eval_every=4,
                   eval_batches=2, checkpoint_every=4),
    # CPU (2 cores): 2 x 128 (~0.4M params), 16 x n bytes per step; the smoke LM's width.
    "cpu": Scale(layers=2, dim=128, heads=4, mlp=512, batch=16, steps=600, lr=3e-3, warmup=60, eval_every=150,
                 eval_batches=16, checkpoint_every=150),
    # The same model for 300 steps, the scale of every committed LM row. Command: `python -m experiments.lm.grid
    # --config cpu_short --n 256 --mechanism <v> --budget 24 --seed <s>`. Expected (3 seeds, bits/byte, n = 256):
    # dense 2.560, local 2.441, Longformer 2.444, ABCA 2.437, labels_d8k2 2.853, labels_pos 2.540; n = 1024: dense
    # 2.501, local 2.284, Longformer 2.293, ABCA 2.277 (docs/results.md, "Language modelling").
    "cpu_short": Scale(layers=2, dim=128, heads=4, mlp=512, batch=16, steps=300, lr=3e-3, warmup=30, eval_every=100,
                       eval_batches=16, checkpoint_every=100),
}

CORE = ("dense", "local", "labels_d8k2", "abca")
GRIDS = {
    "smoke": grid_cells((64,), ("dense", "local"), 12, (0,)),
    # The smallest meaningful comparison: n = 256, 24 keys per query (dense: 128.5), one seed.
    "cpu_core": grid_cells((256,), CORE, 24, (0,)),
    # Every mechanism at 256 and 1024, 3 seeds (the headline rows).
    "cpu_all": grid_cells((256, 1024), ("dense", "local", "longformer", "bigbird", "labels_d8k2", "labels_d16k2",
                                        "labels_d4k1", "abca", "abca_hs2", "abca_global", "abca_fixed",
                                        "abca_learned"), 24, (0, 1, 2)),
}
