"""Evaluation and a restored checkpoint run label attention in the phase training reached (docs/labels.md,
"Evaluation and inference"): a tiny label LM trained past every switch, evaluated, restored and stepped once more."""

import numpy as np
import optax
import pytest

from sparse_attn.data import eval_batches
from sparse_attn.models import TransformerConfig, TransformerLM
from sparse_attn.modules.labels import LabelAttentionConfig, LabelCapacity, LabelRouterConfig, LabelSchedule
from sparse_attn.train import TrainConfig, read_metrics, train_and_evaluate

# 4 steps: soft (state step 0), ramp (1), straight-through (2), hard from 3. num_steps fixed in the config, so the
# resumed run below (5 steps) keeps the schedule. The hard phase runs the dense reference executor: what is tested
# is which phase runs, not the executor (test_label_module.py checks both agree), and the bucketed executor's band
# tiers took a quarter of this test's time to compile.
ATT = LabelAttentionConfig(num_labels=4, top_k=1, radius=4, router=LabelRouterConfig(hidden=8),
                           capacity=LabelCapacity(block=8, soft_block=8), schedule=LabelSchedule(num_steps=4),
                           implementation="reference")
MODEL = TransformerConfig(vocab_size=256, model_dim=16, num_heads=2, num_layers=1, mlp_dim=32, attention=(ATT,))
DATA = np.frombuffer(b"label attention evaluates in the phase it trained in. " * 8, np.uint8)
SHAPE = dict(global_batch=4, seq_len=16, num_batches=1)


class OneBatch:
    """The evaluation batch, as the training data too: train and eval forwards see the same tokens."""

    def __next__(self):
        return next(eval_batches(DATA, **SHAPE))

    def get_state(self):
        return {}

    def set_state(self, state):
        pass


def phase(stats):
    """Layer 0's phase statistic (filed as layer0/phase, or under the mechanism's name, layer0/labels/phase)."""
    return stats["layer0/labels/phase"] if "layer0/labels/phase" in stats else stats["layer0/phase"]


def nll(model, batch, step):
    out = model(batch["inputs"], step=step)
    return optax.softmax_cross_entropy_with_integer_labels(out.logits, batch["targets"]).mean(), out


def loss_fn(model, batch, step):
    value, out = nll(model, batch, step)
    return value + out.aux_loss, {"nll": value, "phase": phase(out.stats)}


def eval_fn(model, batch, step):
    value, out = nll(model, batch, step)
    return {"nll": value, "phase": phase(out.stats), "nll_at_step0": nll(model, batch, 0)[0]}


def run(workdir, num_steps, learning_rate):
    config = TrainConfig(global_batch=4, seq_len=16, num_steps=num_steps, learning_rate=learning_rate, num_devices=1,
                         warmup_steps=0, weight_decay=0.0, checkpoint_every=4, eval_every=num_steps,
                         eval_batches=1, progress=False)  # fmt: skip
    return train_and_evaluate(
        config, str(workdir), make_model=lambda rngs: TransformerLM(MODEL, rngs=rngs), loss_fn=loss_fn,
        eval_fn=eval_fn, train_iter=OneBatch(), eval_batches=lambda: eval_batches(DATA, **SHAPE),
        allowed_changes=("train.num_steps", "train.learning_rate"), log=lambda msg: None,
    )  # fmt: skip


def test_evaluation_and_restore_use_the_trained_phase(tmp_path):
    trained = run(tmp_path, 4, 1e-2)
    assert trained["eval"]["phase"] == 3  # hard, as the last training steps
    phases = [r["phase"] for r in read_metrics(str(tmp_path), "train").values()]
    assert phases == [0, 1, 2, 3]
    # Resume from the step-4 checkpoint and take one more step with a zero learning rate: its training forward
    # (the restored weights, in the phase of step 4) and the evaluation after it see the same weights and tokens.
    resumed = run(tmp_path, 5, 0.0)
    last_train = read_metrics(str(tmp_path), "train")[5]
    assert last_train["phase"] == 3
    assert trained["eval"]["nll"] == pytest.approx(last_train["nll"], rel=1e-5)
    assert resumed["eval"]["nll"] == pytest.approx(last_train["nll"], rel=1e-5)
    # What evaluating at step 0 (the soft phase, τ = 1: the old default) would have reported instead.
    assert abs(trained["eval"]["nll_at_step0"] - trained["eval"]["nll"]) > 1e-3

