"""Pure train and eval steps: the model is `nnx.merge`d inside jit from the split state.

`loss_fn(model, batch, step) -> (loss, metrics)` and `eval_fn(model, batch, step) -> metrics`
are supplied by the experiment; both get the train state's step, so a model whose behaviour follows the step
(label attention's phases) is evaluated in the phase it trains in (docs/labels.md); `loss` already
includes the attention modules' weighted auxiliary losses (the models collect them).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from sparse_attn.train.state import TrainState

LossFn = Callable[[nnx.Module, dict, jax.Array], tuple[jax.Array, dict]]
EvalFn = Callable[[nnx.Module, dict, jax.Array], dict]


def make_train_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, loss_fn: LossFn,
                    lr_schedule: optax.Schedule):
    """`train_step(state, batch) -> (state, metrics)`: one AdamW update (not yet jitted)."""

    def train_step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
        model = nnx.merge(graphdef, state.params, state.rest)
        model.train()

        def objective(model):
            return loss_fn(model, batch, state.step)

        # nnx.value_and_grad differentiates the Params and propagates other variable updates
        # (RNG counters) back to `model`, which plain jax.grad over merged state would reject.
        (loss, metrics), grads = nnx.value_and_grad(objective, has_aux=True)(model)
        _, _, rest = nnx.split(model, nnx.Param, ...)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {
            **metrics,
            "loss": loss,
            "grad_norm": optax.tree.norm(grads),  # before clipping
            "learning_rate": lr_schedule(state.step),
        }
        return TrainState(state.step + 1, params, rest, opt_state), metrics

    return train_step


def make_eval_step(graphdef: nnx.GraphDef, eval_fn: EvalFn):
    """`eval_step(params, rest, step, batch) -> metrics` with the model in eval mode (not yet jitted).

    `step`: the train state's step (the number of updates applied), passed on to `eval_fn`.
    """

    def eval_step(params: nnx.State, rest: nnx.State, step: jax.Array, batch: dict) -> dict:
        model = nnx.merge(graphdef, params, rest)
        model.eval()
        return {k: jnp.asarray(v, jnp.float32) for k, v in eval_fn(model, batch, step).items()}

    return eval_step
