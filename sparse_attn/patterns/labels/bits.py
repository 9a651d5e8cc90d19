"""Label memberships as uint32 bitmasks: top-k packing, shared-label tests, lowest shared label (docs/labels.md).

d <= 32 labels use one word, d <= 64 two words, so no `jax_enable_x64` is needed. Word w holds labels 32w..32w+31.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

MAX_LABELS = 64
NO_LABEL = MAX_LABELS  # returned by `lowest_shared` when two tokens share nothing


def check_labels(num_labels: int, top_k: int) -> None:
    """ValueError unless 1 <= top_k <= num_labels <= 64."""
    if not isinstance(num_labels, int) or not 1 <= num_labels <= MAX_LABELS:
        raise ValueError(f"num_labels must be an int in [1, {MAX_LABELS}] (two uint32 words), got {num_labels!r}")
    if not isinstance(top_k, int) or not 1 <= top_k <= num_labels:
        raise ValueError(f"top_k must be an int in [1, num_labels={num_labels}], got {top_k!r}")


def num_words(num_labels: int) -> int:
    return 1 if num_labels <= 32 else 2


def top_k_labels(r_xL: jax.Array, top_k: int) -> jax.Array:
    """int32[..., k]: the k largest routing logits' labels, ascending (ties broken by the lower label)."""
    check_labels(r_xL.shape[-1], top_k)
    _, idx = jax.lax.top_k(r_xL, top_k)
    return jnp.sort(idx.astype(jnp.int32), axis=-1)


def _bit(label_x: jax.Array, word: int) -> jax.Array:
    """uint32: 1 << (label - 32 word) where the label lives in that word, else 0."""
    inside = (label_x >= 32 * word) & (label_x < 32 * (word + 1))
    shift = jnp.clip(label_x - 32 * word, 0, 31).astype(jnp.uint32)
    return jnp.where(inside, jnp.left_shift(jnp.uint32(1), shift), jnp.uint32(0))


def pack_labels(labels_xK: jax.Array, num_labels: int) -> jax.Array:
    """uint32[..., W] bitmask of k distinct labels per token (the bits are distinct, so OR == sum)."""
    words = [jnp.bitwise_or.reduce(_bit(labels_xK, w), axis=-1) for w in range(num_words(num_labels))]
    return jnp.stack(words, axis=-1).astype(jnp.uint32)


def pack_memberships(z_xL: jax.Array) -> jax.Array:
    """uint32[..., W] bitmask of a boolean membership matrix Z[..., d]."""
    d = z_xL.shape[-1]
    check_labels(d, 1)
    labels = jnp.arange(d, dtype=jnp.int32).reshape((1,) * (z_xL.ndim - 1) + (d,))
    words = []
    for w in range(num_words(d)):
        words.append(jnp.bitwise_or.reduce(jnp.where(z_xL, _bit(labels, w), jnp.uint32(0)), axis=-1))
    return jnp.stack(words, axis=-1).astype(jnp.uint32)


def shares(bits_a_xW: jax.Array, bits_b_xW: jax.Array) -> jax.Array:
    """bool[...]: the two label sets intersect (A_uv, docs/labels.md)."""
    return jnp.any((bits_a_xW & bits_b_xW) != 0, axis=-1)


def shared_count(bits_a_xW: jax.Array, bits_b_xW: jax.Array) -> jax.Array:
    """int32[...]: |S_u ∩ S_v| by popcount."""
    return jnp.sum(jax.lax.population_count(bits_a_xW & bits_b_xW).astype(jnp.int32), axis=-1)


def _ctz(x: jax.Array) -> jax.Array:
    """Count of trailing zeros of uint32 (32 for 0): popcount of the bits below the lowest set bit."""
    low = x & (~x + jnp.uint32(1))
    return jax.lax.population_count(low - jnp.uint32(1)).astype(jnp.int32)


def lowest_shared(bits_a_xW: jax.Array, bits_b_xW: jax.Array) -> jax.Array:
    """int32[...]: the lowest label both sets hold, NO_LABEL (64) when none; the owner of a pair under dedup."""
    both = bits_a_xW & bits_b_xW
    out = jnp.full(both.shape[:-1], NO_LABEL, jnp.int32)
    for w in reversed(range(both.shape[-1])):
        word = both[..., w]
        out = jnp.where(word != 0, 32 * w + _ctz(word), out)
    return out


def bits_below(bits_xW: jax.Array, label_x: jax.Array) -> jax.Array:
    """uint32[..., W]: the labels of `bits` strictly below `label`.

    A key v in bucket `label` of query u is kept iff `(bits_below(m_u, label) & m_v) == 0`, i.e. `label` is their
    lowest shared label: one AND per word instead of a count-trailing-zeros per pair.
    """
    words = []
    for w in range(bits_xW.shape[-1]):
        rel = label_x - 32 * w
        shift = jnp.clip(rel, 0, 31).astype(jnp.uint32)
        below = jnp.where(rel >= 32, jnp.uint32(0xFFFFFFFF), jnp.left_shift(jnp.uint32(1), shift) - jnp.uint32(1))
        below = jnp.where(rel <= 0, jnp.uint32(0), below)
        words.append(bits_xW[..., w] & below)
    return jnp.stack(words, axis=-1)


def memberships_from_bits(bits_xW: jax.Array, num_labels: int) -> jax.Array:
    """bool[..., d]: unpacks a bitmask (the inverse of `pack_memberships`)."""
    labels = jnp.arange(num_labels, dtype=jnp.int32)
    word = jnp.take(bits_xW, labels // 32, axis=-1)
    shift = (labels % 32).astype(jnp.uint32).reshape((1,) * (word.ndim - 1) + (num_labels,))
    return (jnp.right_shift(word, shift) & jnp.uint32(1)) == 1
