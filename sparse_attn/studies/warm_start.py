"""The supervised router warm start as an option of the classifier experiments (docs/noncrossing.md, "Warm start").

Before task training, layer 0's defect-pair router of a `TransformerClassifier` is fitted for a few hundred steps
to the bracket matching of Dyck words (the teacher-forced BCE of `sparse_attn.modules.noncrossing.warm_start`,
through the embedding it reads). It is supervision the other arms of a comparison do not get, so runs that use it
say so: `experiments/classification/train.py --router_warm_start STEPS` labels its rows `<attention>+warm<STEPS>`.

    fit_router(model, dyck_batches(task, "train", 32, 200, num_layers, offset=...), 200, lr=1e-2)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from sparse_attn.data.tasks.common import batch as task_batch
from sparse_attn.data.tasks.dyck import Dyck
from sparse_attn.models import TransformerConfig
from sparse_attn.modules.noncrossing import NoncrossingAttentionConfig
from sparse_attn.modules.noncrossing.warm_start import bracket_targets, warm_start_loss


def route_layers(config: TransformerConfig) -> int:
    """Layer 0's number of routing layers T; a clear error unless layer 0 is a defect-pair router on n points."""
    att = config.layer_attention()[0]
    if not (isinstance(att, NoncrossingAttentionConfig) and att.router == "defect_pair" and not att.doubled):
        raise ValueError(f"the router warm start fits layer 0's defect-pair router; layer 0 is {att!r}")
    return att.num_route_layers


def dyck_batches(task: Dyck, split: str, size: int, num: int, num_layers: int, offset: int = 0,
                 teacher: bool = True) -> Iterator[dict]:
    """`num` consecutive batches of `size` examples from example `offset` of `split`, with the words' opening
    brackets (`opens`) and, if `teacher`, the warm start's targets for `num_layers` routing layers."""
    src = task.source(split)
    if offset < 0 or offset + num * size > len(src):
        raise ValueError(f"examples [{offset}, {offset + num * size}) are outside the {len(src)} of {split!r}")
    for i in range(num):
        b = task_batch(src, range(offset + i * size, offset + (i + 1) * size))
        opens = (b["inputs"] >= 1) & (b["inputs"] <= task.k)
        out = {**{k: jnp.asarray(v) for k, v in b.items()}, "opens": opens}
        if teacher:
            out.update(bracket_targets(opens, b["valid_len"], num_layers))
        yield out


def layer0_features(model, tokens_BxN, valid_len_B):
    """What layer 0's router reads: the normalised embeddings, padding selected to 0 (as the module does)."""
    x = model.blocks[0].norm1(model.embed(tokens_BxN))
    live = jnp.arange(tokens_BxN.shape[1])[None, :, None] < valid_len_B[:, None, None]
    return jnp.where(live, x, 0.0)


def router_loss(model, batch: dict):
    """The warm start's BCE on layer 0's router (every head), through the embedding it reads."""
    x = layer0_features(model, batch["inputs"], batch["valid_len"])
    return warm_start_loss(model.blocks[0].attn, x, batch), None


def adam_step(model, loss_fn, lr: float):
    """(optimizer, step) for Adam at a constant `lr` on `loss_fn(model, batch) -> (loss, aux)`;
    `step(model, optimizer, batch)` updates `model` in place and returns the loss."""
    opt = nnx.Optimizer(model, optax.adam(lr), wrt=nnx.Param)

    @nnx.jit
    def step(model, opt, b):
        (loss, _), g = nnx.value_and_grad(loss_fn, has_aux=True)(model, b)
        opt.update(model, g)
        return loss

    return opt, step


def fit_router(model, batches: Iterator[dict], steps: int, *, lr: float, log_every: int = 50,
               log: Callable[[str], None] = print) -> list[float]:
    """Adam at a constant `lr` on `router_loss` for `steps` batches, updating `model` in place (every parameter
    the loss reaches: layer 0's scorer and the embedding). Returns the losses."""
    opt, step = adam_step(model, router_loss, lr)
    losses = []
    for i in range(steps):
        b = next(batches)
        losses.append(step(model, opt, {k: v for k, v in b.items() if k != "opens"}))
        if i % log_every == 0 or i == steps - 1:
            log(f"warm-start step {i:4d} loss {float(losses[-1]):.4f}")
    return [float(x) for x in np.asarray(losses)]
