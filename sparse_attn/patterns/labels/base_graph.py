"""The base graph H of label attention (docs/labels.md): a sliding window ∪ landmark edges ∪ self.

Window: query u may attend keys [u - radius, u + radius] (causal: [u - radius, u]) — a foundation `Intervals`.
Landmarks: every `landmark_every`-th position (0, g, 2g, ...); every query may attend every landmark (causal:
landmarks at or before it). Landmark queries keep their plain window (edges are query -> landmark, as
docs/labels.md defines them).
Padding (positions >= valid_len) neither attends nor is attended.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from sparse_attn.patterns.baselines import sliding_window
from sparse_attn.patterns.intervals import Intervals


@dataclasses.dataclass(frozen=True, kw_only=True)
class BaseGraph:
    """Static description of H. `landmark_every=0` means no landmarks."""

    radius: int
    landmark_every: int = 0
    causal: bool = False

    def __post_init__(self):
        if not isinstance(self.radius, int) or self.radius < 0:
            raise ValueError(f"BaseGraph.radius must be an int >= 0, got {self.radius!r}")
        if not isinstance(self.landmark_every, int) or self.landmark_every < 0:
            raise ValueError(f"BaseGraph.landmark_every must be an int >= 0 (0: none), got {self.landmark_every!r}")

    def landmarks(self, n: int) -> np.ndarray:
        """int32[L] landmark positions (static: they depend only on n)."""
        if self.landmark_every == 0:
            return np.zeros((0,), np.int32)
        return np.arange(0, n, self.landmark_every, dtype=np.int32)

    def window(self, n: int, valid_len=None, label_bits=None) -> Intervals:
        """The window part of H as a foundation `Intervals` (optionally carrying label bitmasks)."""
        win = sliding_window(n, self.radius, causal=self.causal, valid_len=valid_len)
        return dataclasses.replace(win, label_bits=label_bits) if label_bits is not None else win

    def in_window(self, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
        """bool: k lies in q's window (self included); positions broadcast."""
        d = q_pos - k_pos
        return (d >= 0) & (d <= self.radius) if self.causal else jnp.abs(d) <= self.radius

    def is_landmark(self, pos: jax.Array) -> jax.Array:
        if self.landmark_every == 0:
            return jnp.zeros(jnp.shape(pos), bool)
        return pos % self.landmark_every == 0

    def landmark_edge(self, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
        """bool: (q, k) is a landmark edge of H that the window does not already hold."""
        ok = self.is_landmark(k_pos) & ~self.in_window(q_pos, k_pos)
        return ok & (k_pos <= q_pos) if self.causal else ok

    def edges(self, q_pos: jax.Array, k_pos: jax.Array, valid_len=None) -> jax.Array:
        """bool: (q, k) ∈ E(H) ∪ self, with both valid. valid_len: int32[B] broadcast against leading axes."""
        ok = self.in_window(q_pos, k_pos) | self.landmark_edge(q_pos, k_pos)
        if valid_len is not None:
            vl = jnp.reshape(valid_len, (-1,) + (1,) * (ok.ndim - 1))
            ok = ok & (q_pos < vl) & (k_pos < vl)
        return ok

    def dense(self, n: int, valid_len=None) -> jax.Array:
        """bool[B|1, N, N]: E(H) ∪ self as a dense matrix (tests and small problems only)."""
        pos = jnp.arange(n, dtype=jnp.int32)
        return jnp.broadcast_to(
            self.edges(pos[None, :, None], pos[None, None, :], valid_len),
            (1 if valid_len is None else jnp.shape(valid_len)[0], n, n),
        )

    def num_edges_per_query(self, n: int) -> int:
        """Upper bound on |N_H(u)| including self (for capacities and FLOP estimates)."""
        w = min(self.radius, n - 1)
        return (w + 1 if self.causal else 2 * w + 1) + len(self.landmarks(n))
