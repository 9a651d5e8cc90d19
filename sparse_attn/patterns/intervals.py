"""Intervals: per query one inclusive key range, plus optional global tokens and label bitmasks."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from sparse_attn.patterns import common


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Intervals:
    """Query i may attend key j iff

        valid(i) and valid(j) and (lo[i] <= j <= hi[i] or global[i] or global[j])
        and (not causal or j <= i) and (labels present -> label_bits[i] & label_bits[j] != 0)

    Attributes:
      lo, hi: int32[B|1, H|1, N] inclusive key range of each query; lo > hi is empty.
      valid_len: int32[B|1] tokens at or after it take no part (None: all valid).
      global_tokens: bool[B|1, N] tokens that attend every key and are attended by every query.
      label_bits: uint32[B|1, H|1, N, W] label sets as bitmasks (W words of 32 labels).
      causal: static; keys after the query are excluded from every clause.
      reach: static (left, right) or None (unbounded). Part of the rule: row i's range is [lo[i], hi[i]]
        intersected with [i - left, i + right] (`bounds`) in `to_dense` and every executor, so a range that exceeds
        its reach under jit (where `validate` cannot see it) is cut the same way everywhere. Executors with static
        shapes size their key-block lists from it; `validate` rejects concrete ranges that exceed it.
      max_global: static upper bound on the number of global tokens per sequence.
    """

    lo: jax.Array
    hi: jax.Array
    valid_len: jax.Array | None = None
    global_tokens: jax.Array | None = None
    label_bits: jax.Array | None = None
    causal: bool = dataclasses.field(default=False, metadata=dict(static=True))
    reach: tuple[int, int] | None = dataclasses.field(default=None, metadata=dict(static=True))
    max_global: int = dataclasses.field(default=0, metadata=dict(static=True))

    @property
    def num_tokens(self) -> int:
        return self.lo.shape[-1]

    def validate(self, batch: int | None = None, heads: int | None = None) -> Intervals:
        """Raises ValueError on bad shapes/dtypes (always) and bad values (when not traced)."""
        n = self.num_tokens
        common.check_int("Intervals.lo", self.lo, 3)
        common.check_int("Intervals.hi", self.hi, 3)
        if self.lo.shape != self.hi.shape:
            raise ValueError(f"Intervals.lo {self.lo.shape} and hi {self.hi.shape} differ in shape")
        common.check_lead("Intervals.lo", self.lo.shape, batch, heads)
        if self.valid_len is not None:
            common.check_int("Intervals.valid_len", self.valid_len, 1)
            common.check_lead("Intervals.valid_len", self.valid_len.shape, batch, None)
        if self.global_tokens is not None:
            g = self.global_tokens
            if g.dtype != jnp.bool_ or g.ndim != 2 or g.shape[1] != n:
                raise ValueError(f"Intervals.global_tokens must be bool[B|1, {n}], got {g.dtype}{g.shape}")
            common.check_lead("Intervals.global_tokens", g.shape, batch, None)
            if self.max_global < 1:
                raise ValueError("Intervals.max_global must be >= 1 when global_tokens is given")
        if self.label_bits is not None:
            lb = self.label_bits
            if lb.dtype != jnp.uint32 or lb.ndim != 4 or lb.shape[2] != n:
                raise ValueError(f"Intervals.label_bits must be uint32[B|1, H|1, {n}, W], got {lb.dtype}{lb.shape}")
            common.check_lead("Intervals.label_bits", lb.shape, batch, heads)
        if self.reach is not None and (len(self.reach) != 2 or min(self.reach) < 0):
            raise ValueError(f"Intervals.reach must be two non-negative ints, got {self.reach}")
        if common.is_concrete(self.lo, self.hi, self.valid_len, self.global_tokens):
            self._validate_values()
        return self

    def _validate_values(self) -> None:
        n = self.num_tokens
        lo, hi = common.host(self.lo), common.host(self.hi)
        rows = lo <= hi
        if np.any(rows & ((lo < 0) | (hi >= n))):
            raise ValueError(f"Intervals: a non-empty range lies outside [0, {n - 1}]")
        if self.valid_len is not None:
            vl = common.host(self.valid_len)
            if np.any((vl < 0) | (vl > n)):
                raise ValueError(f"Intervals.valid_len must lie in [0, {n}], got {vl}")
        if self.reach is not None:
            i = np.arange(n)
            left, right = self.reach
            if np.any(rows & ((lo < i - left) | (hi > i + right))):
                raise ValueError(f"Intervals: a range exceeds the declared reach {self.reach}")
        if self.global_tokens is not None:
            count = common.host(self.global_tokens).sum(-1).max()
            if count > self.max_global:
                raise ValueError(f"Intervals: {count} global tokens exceed max_global={self.max_global}")

    # -- the element rule -------------------------------------------------------------------------------------

    def bounds(self) -> tuple[jax.Array, jax.Array]:
        """(lo, hi) int32[B|1, H|1, N]: the ranges cut to the declared reach (unchanged when reach is None)."""
        if self.reach is None:
            return self.lo, self.hi
        left, right = self.reach
        i = jnp.arange(self.num_tokens, dtype=jnp.int32).reshape(1, 1, -1)
        return jnp.maximum(self.lo, i - left), jnp.minimum(self.hi, i + right)

    def allowed(self, q_pos: jax.Array, k_pos: jax.Array, *, interval_only: bool = False) -> jax.Array:
        """bool[B', H', X, Q, K] for q_pos int32[B|1, H|1, X, Q] and k_pos int32[B|1, H|1, X, K].

        `interval_only` drops the global clause (executors handle global tokens in separate passes).
        """
        x, nq, nk = q_pos.shape[2], q_pos.shape[3], k_pos.shape[3]
        flat_q = q_pos.reshape(q_pos.shape[:2] + (x * nq,))
        lead_q = jnp.broadcast_shapes(self.lo.shape[:2], q_pos.shape[:2])
        lo, hi = self.bounds()
        lo = common.take_tokens(lo, flat_q).reshape(lead_q + (x, nq, 1))
        hi = common.take_tokens(hi, flat_q).reshape(lead_q + (x, nq, 1))
        qi = q_pos[..., :, None]
        kj = k_pos[..., None, :]
        ok = (lo <= kj) & (kj <= hi)
        if self.global_tokens is not None and not interval_only:
            g = self.global_tokens[:, None, :]
            lead = jnp.broadcast_shapes(g.shape[:2], q_pos.shape[:2])
            gq = common.take_tokens(g, flat_q).reshape(lead + (x, nq, 1))
            flat_k = k_pos.reshape(k_pos.shape[:2] + (x * nk,))
            lead_k = jnp.broadcast_shapes(g.shape[:2], k_pos.shape[:2])
            gk = common.take_tokens(g, flat_k).reshape(lead_k + (x, 1, nk))
            ok = ok | gq | gk
        if self.causal:
            ok = ok & (kj <= qi)
        if self.valid_len is not None:
            vl = self.valid_len.reshape(-1, 1, 1, 1, 1)
            ok = ok & (qi < vl) & (kj < vl)
        if self.label_bits is not None:
            ok = ok & self.labels_share(q_pos, k_pos)
        return ok

    def labels_share(self, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
        """bool[B', H', X, Q, K]: query and key share at least one label."""
        lb = self.label_bits
        x, nq, nk = q_pos.shape[2], q_pos.shape[3], k_pos.shape[3]
        w = lb.shape[-1]
        lead_q = jnp.broadcast_shapes(lb.shape[:2], q_pos.shape[:2])
        lead_k = jnp.broadcast_shapes(lb.shape[:2], k_pos.shape[:2])
        bq = common.take_tokens(lb, q_pos.reshape(q_pos.shape[:2] + (x * nq,))).reshape(lead_q + (x, nq, 1, w))
        bk = common.take_tokens(lb, k_pos.reshape(k_pos.shape[:2] + (x * nk,))).reshape(lead_k + (x, 1, nk, w))
        return jnp.any((bq & bk) != 0, axis=-1)

    def to_dense(self) -> jax.Array:
        """bool[B|1, H|1, N, N]: the oracle mask."""
        n = self.num_tokens
        pos = jnp.arange(n, dtype=jnp.int32).reshape(1, 1, 1, n)
        return self.allowed(pos, pos)[:, :, 0]
