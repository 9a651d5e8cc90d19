"""Two jitted Adam steps of a `TransformerLM` on one batch: what the module tests use to show a mechanism trains."""

import jax.numpy as jnp
import optax
from flax import nnx


def two_train_steps(model, tokens_BxN1, *, valid_len=None, lr: float = 3e-3):
    """(loss before, loss after one update, the first step's stats) of next-token cross-entropy on tokens[:, :-1]."""
    opt = nnx.Optimizer(model, optax.adam(lr), wrt=nnx.Param)
    kwargs = {} if valid_len is None else {"valid_len": jnp.asarray(valid_len, jnp.int32)}

    @nnx.jit
    def step(m, o):
        def loss_fn(m):
            out = m(tokens_BxN1[:, :-1], **kwargs)
            return optax.softmax_cross_entropy_with_integer_labels(out.logits, tokens_BxN1[:, 1:]).mean(), out.stats

        (loss, stats), grads = nnx.value_and_grad(loss_fn, has_aux=True)(m)
        o.update(m, grads)
        return loss, stats

    loss0, stats = step(model, opt)
    loss1, _ = step(model, opt)
    return float(loss0), float(loss1), stats
