"""Train state, optimizer and sharded initialization (abstract init -> shardings -> jitted init)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from sparse_attn.train import mesh as mesh_lib
from sparse_attn.train.config import TrainConfig

ModelFactory = Callable[[nnx.Rngs], nnx.Module]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
    """All that a step reads and writes; a pytree, saved whole by the checkpointer.

    `params` are the `nnx.Param`s; `rest` is every other model variable (RNG streams,
    counters, statistics) so that `nnx.merge(graphdef, params, rest)` rebuilds the model.
    """

    step: jax.Array  # int32 scalar: the number of updates applied
    params: nnx.State
    rest: nnx.State
    opt_state: Any


# The TrainConfig fields the learning-rate schedule is built from.
SCHEDULE_FIELDS = ("learning_rate", "warmup_steps", "num_steps", "end_lr_fraction")


def learning_rate_schedule(config: TrainConfig) -> optax.Schedule:
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=config.learning_rate,
        warmup_steps=config.warmup_steps,
        decay_steps=max(config.num_steps, config.warmup_steps + 1),
        end_value=config.learning_rate * config.end_lr_fraction,
    )


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    """Clip by global norm, then AdamW; no weight decay on vectors (norm scales, biases)."""
    decay_mask = lambda params: jax.tree.map(lambda x: x.ndim >= 2, params)  # noqa: E731
    return optax.chain(
        optax.clip_by_global_norm(config.grad_clip),
        optax.adamw(
            learning_rate_schedule(config),
            b1=config.b1,
            b2=config.b2,
            weight_decay=config.weight_decay,
            mask=decay_mask,
        ),
    )


def _init_fn(make_model: ModelFactory, tx: optax.GradientTransformation, seed: int):
    def init() -> TrainState:
        model = make_model(nnx.Rngs(seed))
        _, params, rest = nnx.split(model, nnx.Param, ...)
        return TrainState(jnp.zeros((), jnp.int32), params, rest, tx.init(params))

    return init


def graphdef_of(make_model: ModelFactory) -> nnx.GraphDef:
    """The static model structure, without allocating parameters."""
    graphdef, _, _ = nnx.split(nnx.eval_shape(lambda: make_model(nnx.Rngs(0))), nnx.Param, ...)
    return graphdef


def abstract_state(make_model: ModelFactory, tx, config: TrainConfig, mesh) -> tuple[TrainState, TrainState]:
    """Shapes of the train state and the shardings it is laid out with on `mesh`."""
    shapes = jax.eval_shape(_init_fn(make_model, tx, config.seed))
    return shapes, mesh_lib.state_shardings(shapes, mesh)


def init_state(make_model: ModelFactory, tx, config: TrainConfig, shardings: TrainState) -> TrainState:
    """Initialize directly into the sharded layout (no host-side full copy)."""
    return jax.jit(_init_fn(make_model, tx, config.seed), out_shardings=shardings)()


def warm_started(state: TrainState, graphdef: nnx.GraphDef, warm_start: Callable[[nnx.Module], None], tx,
                 shardings: TrainState) -> TrainState:
    """`state` after `warm_start(model)` updated its model in place, with a fresh optimizer state, laid out as
    `shardings` again."""
    model = nnx.merge(graphdef, state.params, state.rest)
    warm_start(model)
    _, params, rest = nnx.split(model, nnx.Param, ...)
    return jax.device_put(TrainState(state.step, params, rest, tx.init(params)), shardings)


def with_shardings(shapes: TrainState, shardings: TrainState) -> TrainState:
    """ShapeDtypeStructs carrying shardings: restore targets for orbax."""
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


def param_count(state_or_shapes: TrainState) -> int:
    return sum(x.size for x in jax.tree.leaves(state_or_shapes.params))
