"""Packed executor for ABCA: zones in fixed-width slots, run as a batch of small dense attentions.

Why packing (measured, see docs/abca.md): a block list sized for the worst-case span (`block + 2 max_zone` keys per
query block) computes ~3x the pairs a zone needs. Here each slot starts at an anchor and holds whole consecutive
zones, at most `width` queries, and reads the `width + 1` contiguous keys from its start (the last zone's right
anchor included): the seed's O(k m^2), with several short zones sharing a slot.

Static shapes, data-dependent work: the slot count is the worst case (two consecutive slots always cover more than
`width` tokens, so at most 2 ceil(N / (width + 1)) slots), but slots are processed in chunks under `lax.map`, a chunk
past the last used slot is skipped by `lax.cond`, and each chunk is rematerialised in the backward pass, so time
follows the used slots and memory one chunk, not the worst case.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from sparse_attn.executors.softmax import masked_softmax


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SlotLayout:
    """start: int32[B, S] first position of each slot (N when unused); slot_of: int32[B, N]; used: int32[B]."""

    start: jax.Array
    slot_of: jax.Array
    used: jax.Array
    width: int = dataclasses.field(metadata={"static": True})


def max_slots(n: int, width: int) -> int:
    """Worst-case number of slots: slots i and i+2 start more than `width` apart."""
    return min(n, 2 * math.ceil(n / (width + 1)))


def slot_layout(left_BxN: jax.Array, valid_len_B: jax.Array, width: int) -> SlotLayout:
    """Greedy slots: s_0 = 0; s_{i+1} = the last anchor <= s_i + width while s_i + width < valid_len.

    `left_BxN` is the nearest anchor <= t; consecutive anchors must lie at most `width` apart (the zone cap).
    """
    b, n = left_BxN.shape
    num = max_slots(n, width)
    vl = valid_len_B.astype(jnp.int32)
    bi = jnp.arange(b)

    def step(s_B, _):
        nxt = s_B + width
        more = (s_B < n) & (nxt < vl)
        s_next = jnp.where(more, left_BxN[bi, jnp.minimum(nxt, n - 1)], n)
        return s_next, s_B

    first = jnp.where(vl > 0, 0, n).astype(jnp.int32)
    _, start = jax.lax.scan(step, first, None, length=num)
    start = start.T  # [B, S]
    mark = jnp.zeros((b, n), jnp.int32).at[bi[:, None], start].add(1, mode="drop")
    slot_of = jnp.cumsum(mark, axis=1, dtype=jnp.int32) - 1
    return SlotLayout(start, slot_of, jnp.sum(start < n, axis=1, dtype=jnp.int32), width)


def chunk_map(fn, num_chunks: int, active_chunks: jax.Array):
    """Stacks fn(c) for c < num_chunks; chunks >= active_chunks return zeros without running fn.

    Each chunk is rematerialised in the backward pass, so the residuals are the chunk index only.
    """
    shapes = jax.eval_shape(fn, jnp.int32(0))

    def skip(c):
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def body(c):
        return jax.lax.cond(c < active_chunks, fn, skip, c)

    return jax.lax.map(jax.checkpoint(body), jnp.arange(num_chunks, dtype=jnp.int32))


def unchunk(x):
    """[num_chunks, B, chunk, ...] -> [B, num_chunks * chunk, ...]."""
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape((x.shape[0], -1) + x.shape[3:])


def _gather(x_BxNxGxD, pos_BxCxK):
    bi = jnp.arange(x_BxNxGxD.shape[0]).reshape(-1, 1, 1)
    return x_BxNxGxD[bi, jnp.clip(pos_BxCxK, 0, x_BxNxGxD.shape[1] - 1)]


def dense_rows(q_BxCxQxHxD, k_BxCxKxGxD, v_BxCxKxGxD, ok_BxCxQxK, scale: float):
    """Small dense attentions, one per (batch, chunk row): (out [B, C, Q, H, D], lse [B, C, Q, H])."""
    b, c, nq, h, d = q_BxCxQxHxD.shape
    g = k_BxCxKxGxD.shape[3]
    q = q_BxCxQxHxD.reshape(b, c, nq, g, h // g, d)
    s = jnp.einsum("bcqgrd,bckgd->bcgrqk", q, k_BxCxKxGxD, preferred_element_type=jnp.float32) * scale
    p, lse = masked_softmax(s, ok_BxCxQxK[:, :, None, None])
    out = jnp.einsum("bcgrqk,bckgd->bcqgrd", p, v_BxCxKxGxD.astype(jnp.float32))
    return out.reshape(b, c, nq, h, d), lse.transpose(0, 1, 4, 2, 3).reshape(b, c, nq, h)


def packed_zone_attention(
    q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, lo_BxN, hi_BxN, layout: SlotLayout, scale: float, *, chunk: int = 4
):
    """Attention of every query over its key range [lo, hi], computed slot by slot.

    Requires, for every valid query t of slot i, [lo(t), hi(t)] inside [start_i, start_i + width] (or lo > hi, an
    empty row). Positions in no slot (padding) output 0 and lse -inf. The backward pass is a second slot loop
    (flash-style: probabilities recomputed from lse) that adds each slot's dq/dk/dv into a width-sized window of the
    accumulators, so a step costs O(width), not O(N) as autodiff of the forward loop would.

    Returns:
      (out [B, N, H, D] in q's dtype, lse float32 [B, N, H]).
    """
    args = (q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, lo_BxN, hi_BxN, layout.start, layout.slot_of, layout.used)
    return _packed(*args, layout.width, float(scale), min(chunk, layout.start.shape[1]))


def _slot_inputs(c, j, start, slot_of, lo, hi, w, chunk, n):
    """Positions and mask of slot c * chunk + j: (st [B], q_pos [B, W], k_pos [B, W+1], ok [B, W, W+1])."""
    st = jax.lax.dynamic_index_in_dim(start, c * chunk + j, axis=1, keepdims=False)
    q_pos = st[:, None] + jnp.arange(w, dtype=jnp.int32)[None]
    k_pos = st[:, None] + jnp.arange(w + 1, dtype=jnp.int32)[None]
    take = lambda x: _gather(x[..., None, None], q_pos[:, None])[:, 0, :, 0, 0]
    row = (q_pos < n) & (take(slot_of) == c * chunk + j)
    kp = k_pos[:, None, :]
    ok = row[..., None] & (take(lo)[..., None] <= kp) & (kp <= take(hi)[..., None]) & (kp < n)
    return st, q_pos, k_pos, ok


def _forward(q, k, v, lo, hi, start, slot_of, used, w, scale, chunk):
    """Slot loop writing each chunk's rows in place at its start: a slot's rows past its own zones belong to the next
    slot, which is written later and overwrites them (so no [slots, W, H, D] stack and no gather back)."""
    b, n, h, d = q.shape
    num = start.shape[1]
    num_chunks = math.ceil(num / chunk)
    start = jnp.pad(start, ((0, 0), (0, num_chunks * chunk - num)), constant_values=n)
    active = (jnp.max(used) + chunk - 1) // chunk

    def slot_out(c, j):
        st, q_pos, k_pos, ok = _slot_inputs(c, j, start, slot_of, lo, hi, w, chunk, n)
        take = lambda x, pos: _gather(x, pos[:, None])
        out, lse = dense_rows(take(q, q_pos), take(k, k_pos), take(v, k_pos), ok[:, None], scale)
        return st, out[:, 0].astype(q.dtype), lse[:, 0]

    def step(acc, c):
        def run(acc):
            for j in range(chunk):  # in slot order, so that the owner of a row writes it last
                st, out, lse = slot_out(c, j)
                acc = (_set_window(acc[0], st, out), _set_window(acc[1], st, lse))
            return acc

        return jax.lax.cond(c < active, run, lambda a: a, acc), None

    acc0 = (jnp.zeros((b, n + w + 1, h, d), q.dtype), jnp.full((b, n + w + 1, h), -jnp.inf, jnp.float32))
    (out, lse), _ = jax.lax.scan(step, acc0, jnp.arange(num_chunks, dtype=jnp.int32))
    return out[:, :n], lse[:, :n]


@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9, 10))
def _packed(q, k, v, lo, hi, start, slot_of, used, w, scale, chunk):
    return _forward(q, k, v, lo, hi, start, slot_of, used, w, scale, chunk)


def _packed_fwd(q, k, v, lo, hi, start, slot_of, used, w, scale, chunk):
    out, lse = _forward(q, k, v, lo, hi, start, slot_of, used, w, scale, chunk)
    return (out, lse), (q, k, v, lo, hi, start, slot_of, used, out, lse)


def _set_window(acc_BxMx, st_B, upd_BxLx):
    set_one = lambda a, s, u: jax.lax.dynamic_update_slice_in_dim(a, u, s, axis=0)
    return jax.vmap(set_one)(acc_BxMx, st_B, upd_BxLx)


def _add_window(acc_BxMxGxD, st_B, upd_BxLxGxD):
    def one(a, s, u):
        cur = jax.lax.dynamic_slice_in_dim(a, s, u.shape[0], axis=0)
        return jax.lax.dynamic_update_slice_in_dim(a, cur + u, s, axis=0)

    return jax.vmap(one)(acc_BxMxGxD, st_B, upd_BxLxGxD)


def _packed_bwd(w, scale, chunk, res, cts):
    q, k, v, lo, hi, start, slot_of, used, out, lse = res
    dout, dlse = cts
    b, n, h, d = q.shape
    g = k.shape[2]
    r = h // g
    num = start.shape[1]
    num_chunks = math.ceil(num / chunk)
    start = jnp.pad(start, ((0, 0), (0, num_chunks * chunk - num)), constant_values=n)
    active = (jnp.max(used) + chunk - 1) // chunk
    dout = dout.astype(jnp.float32)
    live = jnp.isfinite(lse)
    # An einsum, not sum(dout * out, -1): XLA:CPU's reduce over D is ~15x slower than the equivalent dot.
    delta = jnp.einsum("bnhd,bnhd->bnh", dout, out.astype(jnp.float32)) - jnp.where(live, dlse, 0.0)  # [B, N, H]
    lse0 = jnp.where(live, lse, 0.0)
    pad = ((0, 0), (0, w + 1), (0, 0), (0, 0))
    acc0 = (
        jnp.pad(jnp.zeros(q.shape, jnp.float32), pad),
        jnp.pad(jnp.zeros(k.shape, jnp.float32), pad),
        jnp.pad(jnp.zeros(v.shape, jnp.float32), pad),
    )

    def slot_grads(acc, c, j):
        st, q_pos, k_pos, ok = _slot_inputs(c, j, start, slot_of, lo, hi, w, chunk, n)
        take = lambda x, pos: _gather(x, pos[:, None])[:, 0]
        split = lambda x: x.reshape(b, w, g, r, *x.shape[3:])
        qs, dos = split(take(q, q_pos)), split(take(dout, q_pos))  # [B, W, G, R, D]
        ls, dl = split(take(lse0, q_pos)), split(take(delta, q_pos))  # [B, W, G, R]
        ks, vs = take(k, k_pos), take(v, k_pos)  # [B, W+1, G, D]
        okb = ok[:, None, None]  # [B, 1, 1, W, W+1]
        s = jnp.einsum("bqgrd,bkgd->bgrqk", qs, ks, preferred_element_type=jnp.float32) * scale
        lt = ls.transpose(0, 2, 3, 1)[..., None]
        p = jnp.where(okb, jnp.exp(jnp.where(okb, s - lt, 0.0)), 0.0)
        dp = jnp.einsum("bqgrd,bkgd->bgrqk", dos, vs.astype(jnp.float32))
        ds = p * (dp - dl.transpose(0, 2, 3, 1)[..., None]) * scale
        dq = jnp.einsum("bgrqk,bkgd->bqgrd", ds, ks.astype(jnp.float32)).reshape(b, w, h, d)
        dk = jnp.einsum("bgrqk,bqgrd->bkgd", ds, qs.astype(jnp.float32))
        dv = jnp.einsum("bgrqk,bqgrd->bkgd", p, dos)
        return (_add_window(acc[0], st, dq), _add_window(acc[1], st, dk), _add_window(acc[2], st, dv))

    def step(acc, c):
        def run(acc):
            for j in range(chunk):  # slots of one step share keys at their edges: add them one after the other
                acc = slot_grads(acc, c, j)
            return acc

        return jax.lax.cond(c < active, run, lambda a: a, acc), None

    (dq, dk, dv), _ = jax.lax.scan(step, acc0, jnp.arange(num_chunks, dtype=jnp.int32))
    return (
        dq[:, :n].astype(q.dtype),
        dk[:, :n].astype(k.dtype),
        dv[:, :n].astype(v.dtype),
        None,
        None,
        None,
        None,
        None,
    )


_packed.defvjp(_packed_fwd, _packed_bwd)
