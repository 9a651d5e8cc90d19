"""The byte LM's objective, shared by the LM and retrieval studies and the checkpoint tools: next-byte cross-entropy
(nats) plus the layers' auxiliary losses, reported in bits per byte."""

from __future__ import annotations

import math
import zlib

import jax
import jax.numpy as jnp
import optax

from sparse_attn.models import TransformerLM

LN2 = math.log(2.0)


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


def corpus_fingerprint(corpus) -> dict:
    """Sizes and CRC-32s of the bytes trained and validated on: a resume on other data is refused."""
    return {**corpus.summary(), "train_crc32": zlib.crc32(corpus.train_U8.tobytes()),
            "valid_crc32": zlib.crc32(corpus.valid_U8.tobytes())}
