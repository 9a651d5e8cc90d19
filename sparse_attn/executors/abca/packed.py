"""Packed executor for ABCA: zones in fixed-width slots, run as a batch of small dense attentions.

Why packing (measured, see docs/abca.md): a block list sized for the worst-case span (`block + 2 max_zone` keys per
query block) computes ~3x the pairs a zone needs. Here each slot starts at an anchor and holds whole consecutive
zones, at most `width` queries, and reads the `width + 1` contiguous keys from its start (the last zone's right
anchor included): the research document's O(k m^2), with several short zones sharing a slot.

Static shapes, data-dependent work: the slot count is the worst case (two consecutive slots always cover more than
`width` tokens, so at most 2 ceil(N / (width + 1)) slots), but slots run in a `lax.scan` whose steps past the last
used slot are skipped by `lax.cond`, and each step writes (forward) or adds (backward) into a window of full-length
accumulators, so time follows the used slots and memory is O(N + width^2), not the worst case.

Layout: inside the loops q, k, v live head-major and padded, `[B, H, N + width + 1, D]`, so that a slot's window is
a `dynamic_slice` (no gather, no clamping: unused slots start at N) and the per-slot dots need no transposes.

Non-finite inputs: a slot's tile holds keys its rows may not read, and `0 * NaN` in P.V (and in dS.K, dS^T.Q) would
carry them there. So the slot loops only ever see finite values (non-finite entries selected to 0 in the head-major
copies the loops read anyway: no extra buffer), and a row that reads a non-finite q, k or v is set to NaN
afterwards, found by prefix counts over its contiguous key range. Every pair that touches a non-finite entry then
lies in such a row, whose cotangent the select drops, so the entry's gradient is exactly 0 with no further select.
See docs/abca.md ("Non-finite values").
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from sparse_attn.executors.softmax import finite, masked_softmax_parts, nonfinite_rows, range_any


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


def _heads_first(x_BxNxHxD, w: int):
    """[B, N, H, D] -> [B, H, N + w + 1, D], zero rows appended."""
    return jnp.pad(jnp.swapaxes(x_BxNxHxD, 1, 2), ((0, 0), (0, 0), (0, w + 1), (0, 0)))


def _tokens_first(x_BxHxPxD, n: int):
    return jnp.swapaxes(x_BxHxPxD[:, :, :n], 1, 2)


def _window(x_BxHxPx, st_B, length: int):
    """x[b, :, st_b : st_b + length] for every b."""
    return jax.vmap(lambda x, s: jax.lax.dynamic_slice_in_dim(x, s, length, axis=1))(x_BxHxPx, st_B)


def _set_window(acc_BxHxPx, st_B, upd_BxHxLx):
    return jax.vmap(lambda a, s, u: jax.lax.dynamic_update_slice_in_dim(a, u, s, axis=1))(acc_BxHxPx, st_B, upd_BxHxLx)


def _add_window(acc_BxHxPx, st_B, upd_BxHxLx):
    return _set_window(acc_BxHxPx, st_B, _window(acc_BxHxPx, st_B, upd_BxHxLx.shape[2]) + upd_BxHxLx)


def packed_zone_attention(
    q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, lo_BxN, hi_BxN, layout: SlotLayout, scale: float, *, chunk: int = 4
):
    """Attention of every query over its key range [lo, hi], computed slot by slot.

    Requires, for every valid query t of slot i, [lo(t), hi(t)] inside [start_i, start_i + width] (or lo > hi, an
    empty row). Positions in no slot (padding) output 0 and lse -inf. Non-finite values reach only the rows that
    read them: such a row (its q, or a k or v in [lo, hi]) outputs NaN and lse NaN; every other row, and the
    gradients of a loss that skips those rows, are exactly what finite values there would give (zero gradient at
    the non-finite entries). The backward pass is a second slot loop (flash-style: probabilities recomputed from
    lse) that adds each slot's dq/dk/dv into a width-sized window of the accumulators, so a step costs O(width),
    not O(N) as autodiff of the forward loop would.

    Args:
      chunk: slots per scan step (unrolled; fewer steps, larger live tiles).

    Returns:
      (out [B, N, H, D] in q's dtype, lse float32 [B, N, H]).
    """
    if k_BxNxGxD.shape != v_BxNxGxD.shape or q_BxNxHxD.shape[2] % k_BxNxGxD.shape[2]:
        raise ValueError(f"k, v {k_BxNxGxD.shape}, {v_BxNxGxD.shape} do not fit q {q_BxNxHxD.shape} (GQA)")
    args = (q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, lo_BxN, hi_BxN, layout.start, layout.slot_of, layout.used)
    out, lse = _packed(*args, layout.width, float(scale), min(chunk, layout.start.shape[1]))
    reads = range_any(nonfinite_rows(k_BxNxGxD) | nonfinite_rows(v_BxNxGxD), lo_BxN, hi_BxN)  # [B, N, G]
    bad = nonfinite_rows(q_BxNxHxD) | jnp.repeat(reads, q_BxNxHxD.shape[2] // k_BxNxGxD.shape[2], axis=2)
    bad = bad & ~jnp.isneginf(lse)  # rows with no key (or in no slot) output 0 whatever their q
    return jnp.where(bad[..., None], jnp.nan, out), jnp.where(bad, jnp.nan, lse)


def _slot_loop(start, used, chunk: int, n: int, body, acc0):
    """Runs acc = body(acc, slot) for every used slot in order, `chunk` slots per scan step."""
    num = start.shape[1]
    num_chunks = math.ceil(num / chunk)
    active = (jnp.max(used) + chunk - 1) // chunk

    def step(acc, c):
        def run(acc):
            for j in range(chunk):
                acc = body(acc, c * chunk + j)
            return acc

        return jax.lax.cond(c < active, run, lambda a: a, acc), None

    acc, _ = jax.lax.scan(step, acc0, jnp.arange(num_chunks, dtype=jnp.int32))
    return acc


def _slot_mask(meta, slot, w: int, n: int):
    """(st [B], ok [B, W, W+1]) of one slot; meta = (start [B, S'], slot_of, lo, hi as [B, 1, N + w + 1])."""
    start, slot_of, lo, hi = meta
    st = jax.lax.dynamic_index_in_dim(start, slot, axis=1, keepdims=False)
    row = _window(slot_of, st, w)[:, 0] == slot  # [B, W]
    kp = st[:, None, None] + jnp.arange(w + 1, dtype=jnp.int32)[None, None]  # [B, 1, W+1]
    lo_, hi_ = _window(lo, st, w)[:, 0, :, None], _window(hi, st, w)[:, 0, :, None]
    return st, row[..., None] & (lo_ <= kp) & (kp <= hi_) & (kp < n)


def _metadata(start, slot_of, lo, hi, w: int, chunk: int, n: int):
    """Pads the slot starts to whole chunks (with N: empty slots) and the per-token rows to the padded length."""
    num = start.shape[1]
    start = jnp.pad(start, ((0, 0), (0, -num % chunk)), constant_values=n)

    def row(x, fill):
        return jnp.pad(x[:, None], ((0, 0), (0, 0), (0, w + 1)), constant_values=fill)

    return start, row(slot_of, -1), row(lo, 0), row(hi, -1)


def _split_heads(x_BxHxWxD, groups: int):
    b, h = x_BxHxWxD.shape[:2]
    return x_BxHxWxD.reshape(b, groups, h // groups, *x_BxHxWxD.shape[2:])


def _forward(q, k, v, lo, hi, start, slot_of, used, w, scale, chunk):
    """Slot loop writing each slot's rows in place at its start: a slot's rows past its own zones belong to the next
    slot, which is written later and overwrites them. Returns head-major padded (out, lse) and inputs."""
    b, n, h, d = q.shape
    g = k.shape[2]
    meta = _metadata(start, slot_of, lo, hi, w, chunk, n)
    qh, kh, vh = (_heads_first(finite(x), w) for x in (q, k, v))  # the loops never see a non-finite value

    def body(acc, slot):
        st, ok = _slot_mask(meta, slot, w, n)
        qs = _split_heads(_window(qh, st, w), g)  # [B, G, R, W, D]
        ks, vs = _window(kh, st, w + 1), _window(vh, st, w + 1)  # [B, G, W+1, D]
        sc = jnp.einsum("bgrqd,bgkd->bgrqk", qs, ks, preferred_element_type=jnp.float32) * scale
        e, denom, lse = masked_softmax_parts(sc, ok[:, None, None])
        o = jnp.einsum("bgrqk,bgkd->bgrqd", e, vs.astype(jnp.float32)) / denom
        return _set_window(acc[0], st, o.reshape(b, h, w, d).astype(q.dtype)), _set_window(
            acc[1], st, lse.reshape(b, h, w)
        )

    acc0 = (jnp.zeros((b, h, n + w + 1, d), q.dtype), jnp.full((b, h, n + w + 1), -jnp.inf, jnp.float32))
    out_h, lse_h = _slot_loop(meta[0], used, chunk, n, body, acc0)
    return (out_h, lse_h), (qh, kh, vh)


@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9, 10))
def _packed(q, k, v, lo, hi, start, slot_of, used, w, scale, chunk):
    (out_h, lse_h), _ = _forward(q, k, v, lo, hi, start, slot_of, used, w, scale, chunk)
    return _tokens_first(out_h, q.shape[1]), jnp.swapaxes(lse_h[:, :, : q.shape[1]], 1, 2)


def _packed_fwd(q, k, v, lo, hi, start, slot_of, used, w, scale, chunk):
    (out_h, lse_h), (qh, kh, vh) = _forward(q, k, v, lo, hi, start, slot_of, used, w, scale, chunk)
    n = q.shape[1]
    out, lse = _tokens_first(out_h, n), jnp.swapaxes(lse_h[:, :, :n], 1, 2)
    return (out, lse), (qh, kh, vh, lo, hi, start, slot_of, used, out_h, lse_h)


def _packed_bwd(w, scale, chunk, res, cts):
    qh, kh, vh, lo, hi, start, slot_of, used, out_h, lse_h = res
    dout, dlse = cts
    b, h, p, d = qh.shape
    g = kh.shape[1]
    n = p - w - 1
    meta = _metadata(start, slot_of, lo, hi, w, chunk, n)
    do_h = _heads_first(dout.astype(jnp.float32), w)
    live = jnp.isfinite(lse_h)
    dlse_h = jnp.pad(jnp.swapaxes(dlse, 1, 2), ((0, 0), (0, 0), (0, w + 1)))
    # An einsum, not sum(dout * out, -1): XLA:CPU's reduce over D is ~15x slower than the equivalent dot.
    delta = jnp.einsum("bhpd,bhpd->bhp", do_h, out_h.astype(jnp.float32)) - jnp.where(live, dlse_h, 0.0)
    lse0 = jnp.where(live, lse_h, 0.0)

    def body(acc, slot):
        st, ok = _slot_mask(meta, slot, w, n)
        okb = ok[:, None, None]  # [B, 1, 1, W, W+1]
        qs = _split_heads(_window(qh, st, w), g)  # [B, G, R, W, D]
        dos = _split_heads(_window(do_h, st, w), g)
        ls = _split_heads(_window(lse0, st, w), g)[..., None]  # [B, G, R, W, 1]
        dl = _split_heads(_window(delta, st, w), g)[..., None]
        ks, vs = _window(kh, st, w + 1), _window(vh, st, w + 1)  # [B, G, W+1, D]
        sc = jnp.einsum("bgrqd,bgkd->bgrqk", qs, ks, preferred_element_type=jnp.float32) * scale
        pr = jnp.where(okb, jnp.exp(jnp.where(okb, sc - ls, 0.0)), 0.0)
        dp = jnp.einsum("bgrqd,bgkd->bgrqk", dos, vs.astype(jnp.float32))
        ds = pr * (dp - dl) * scale
        dq = jnp.einsum("bgrqk,bgkd->bgrqd", ds, ks.astype(jnp.float32)).reshape(b, h, w, d)
        dk = jnp.einsum("bgrqk,bgrqd->bgkd", ds, qs.astype(jnp.float32))
        dv = jnp.einsum("bgrqk,bgrqd->bgkd", pr, dos)
        return _add_window(acc[0], st, dq), _add_window(acc[1], st, dk), _add_window(acc[2], st, dv)

    def zeros(x):
        return jnp.zeros(x.shape, jnp.float32)

    def cast(x, like):
        return _tokens_first(x, n).astype(like.dtype)

    dq, dk, dv = _slot_loop(meta[0], used, chunk, n, body, (zeros(qh), zeros(kh), zeros(vh)))
    return cast(dq, qh), cast(dk, kh), cast(dv, vh), None, None, None, None, None


_packed.defvjp(_packed_fwd, _packed_bwd)
