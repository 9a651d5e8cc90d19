"""The one public entry point: `attention(q, k, v, pattern, *, implementation=None, ...)`, and `prepare(pattern)`,
which builds an executor's per-pattern metadata once (docs/architecture.md, "Prepared patterns")."""

from __future__ import annotations

import inspect
import math

import jax
import jax.numpy as jnp

import sparse_attn.executors  # noqa: F401  (registers the reference, XLA, Pallas and mechanism executors)
from sparse_attn.executors import registry
from sparse_attn.executors.prepared import Prepared
from sparse_attn.executors.registry import register_executor
from sparse_attn.patterns.intervals import Intervals

__all__ = [
    "Prepared",
    "attention",
    "available_implementations",
    "default_implementation",
    "prepare",
    "register_executor",
    "resolve_implementation",
]
_MISSING = object()


def available_implementations(pattern_type: type = Intervals) -> tuple[str, ...]:
    """Implementation names registered for a pattern type (default: `Intervals`)."""
    return registry.implementations(pattern_type)


def default_implementation(platform: str | None = None, pattern_type: type = Intervals, *, pattern=None) -> str:
    """What `implementation=None` runs for a pattern type on a platform (default: this one); with `pattern` (an
    instance of the type), for that pattern (a platform's default may depend on it: a dense `Intervals` runs
    "reference" on CPU, `executors/reference.py`)."""
    return registry.default(pattern_type, platform or jax.default_backend(), pattern)


def resolve_implementation(pattern, implementation: str | None = None) -> str:
    """The executor `attention(..., pattern, implementation=implementation)` runs on this platform: `implementation`
    (checked against the pattern's type), or for None the registry's default for the pattern. For a module whose
    executor options depend on the executor; the registry is the one place that maps None to an executor."""
    return registry.resolve(pattern, implementation)


def prepare(pattern, *, implementation: str | None = None, head_dim: int | None = None, **options) -> Prepared:
    """The pattern with executor `implementation`'s metadata (tile lists, token metadata, slot layouts) built once.

    `attention(q, k, v, prepared)` then runs that executor without rebuilding it, so one `Prepared` can serve every
    layer that shares the pattern in a forward pass (and the executors' custom VJPs keep it as a residual). It is a
    pytree: it passes through `jax.jit`, `jax.tree.map` and sharding like the pattern itself.

    Args:
      pattern: any registered pattern type.
      implementation: as in `attention` (None: this platform's default for the pattern type, resolved now).
      head_dim: the head size D of the q/k/v it will run with; executors that size their tiles by it ("pallas")
        need it, and `attention` checks it against q.
      **options: the executor options (e.g. `config` for "pallas"); `attention` runs with these and refuses others.

    Returns:
      a `Prepared` (metadata None for an executor that registered no `prepare`: it still runs, building per call).
    """
    if isinstance(pattern, Prepared):
        raise ValueError(f"the pattern is already prepared (for implementation {pattern.implementation!r})")
    name = registry.resolve(pattern, implementation)
    if head_dim is not None and (not isinstance(head_dim, int) or head_dim < 1):
        raise ValueError(f"head_dim must be None or an int >= 1, got {head_dim!r}")
    key = tuple(sorted(options.items()))
    try:
        hash(key)
    except TypeError as e:
        raise ValueError(f"the executor options of a prepared pattern must be hashable (static), got {options}") from e
    pattern.validate()
    fn = registry.preparer(type(pattern), name)
    metadata = None if fn is None else fn(pattern, head_dim=head_dim, **options)
    return Prepared(pattern, metadata, name, key, head_dim)


def _unwrap(prepared: Prepared, implementation, options: dict, head_dim: int):
    """(pattern, executor name, options) of a prepared pattern; ValueError on a call it was not prepared for."""
    name = prepared.implementation
    if implementation is not None and implementation != name:
        raise ValueError(
            f"the pattern was prepared for implementation {name!r}, not {implementation!r}: prepare it with "
            f"implementation={implementation!r}, or pass the unprepared pattern"
        )
    fixed = dict(prepared.options)
    for key, value in options.items():
        if fixed.get(key, _MISSING) != value:
            raise ValueError(
                f"option {key}={value!r} differs from what the pattern was prepared with ({dict(prepared.options)}): "
                "pass executor options to prepare(), not attention()"
            )
    if prepared.head_dim is not None and prepared.head_dim != head_dim:
        raise ValueError(f"the pattern was prepared for head_dim={prepared.head_dim}, but q has D={head_dim}")
    if registry.preparer(type(prepared.pattern), name) is not None:
        fixed["prepared"] = prepared.metadata
    return prepared.pattern, name, fixed


def _check_inputs(q, k, v, pattern) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            raise ValueError(f"{name} must be [B, N, heads, D], got shape {x.shape}")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{name} must be floating point, got {x.dtype}")
    b, n, h, d = q.shape
    for axis, size in (("length N", n), ("query heads H", h), ("KV heads G", k.shape[2]), ("head size D", d)):
        if size < 1:
            raise ValueError(f"{axis} must be >= 1, got q shape {q.shape}, k/v shape {k.shape}")
    if k.shape != v.shape:
        raise ValueError(f"k {k.shape} and v {v.shape} must have the same shape")
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k/v {k.shape} do not match q {q.shape} in batch or head size")
    if h % k.shape[2]:
        raise ValueError(f"query heads ({h}) must be a multiple of KV heads ({k.shape[2]})")
    if pattern.num_tokens != n:
        raise ValueError(f"pattern covers {pattern.num_tokens} queries but q has {n}")
    kv_len = getattr(pattern, "num_kv_tokens", None)
    if kv_len is None and k.shape[1] != n:
        raise ValueError(f"k/v have {k.shape[1]} tokens and q {n}: a {type(pattern).__name__} covers equal query and "
                         "key lengths; cross-attention takes a pattern built for (Nq, Nk), e.g. "
                         "patterns.from_mask_fn(mask_fn, Nq, Nk)")  # fmt: skip
    if kv_len is not None and k.shape[1] != kv_len:
        raise ValueError(f"pattern covers {kv_len} keys but k/v have {k.shape[1]}")
    pattern.validate(batch=b, heads=h)


def check_score_fn(score_fn) -> None:
    """ValueError unless `score_fn(score, b, h, q_idx, kv_idx)` maps a float32 score and int32 indices to one float
    score (checked on scalars before anything is traced)."""
    if not callable(score_fn):
        raise ValueError(f"score_fn must be callable as score_fn(score, b, h, q_idx, kv_idx), got {score_fn!r}")
    f32, i32 = jax.ShapeDtypeStruct((), jnp.float32), jax.ShapeDtypeStruct((), jnp.int32)
    try:
        out = jax.eval_shape(score_fn, f32, i32, i32, i32, i32)
    except Exception as e:  # noqa: BLE001  (any failure to trace is the caller's function)
        raise ValueError(f"score_fn(score, b, h, q_idx, kv_idx) could not be traced on scalars: "
                         f"{type(e).__name__}: {str(e).splitlines()[0]}") from e  # fmt: skip
    if not hasattr(out, "shape") or out.shape != () or not jnp.issubdtype(out.dtype, jnp.floating):
        raise ValueError(f"score_fn must return one float score per (score, b, h, q_idx, kv_idx): on scalars it "
                         f"returned {jax.tree.map(lambda x: f'{x.dtype}{x.shape}', out)}")  # fmt: skip


def _empty_batch(q, fn, args, options):
    """B = 0: empty outputs without running an executor (kernels cannot launch an empty grid)."""
    inspect.signature(fn).bind(*args, **options)  # a bad option fails as it would with B > 0
    b, n, h, _ = q.shape
    return jnp.zeros(q.shape, q.dtype), jnp.zeros((b, n, h), jnp.float32)


def attention(
    q_BxNxHxD: jax.Array,
    k_BxNxGxD: jax.Array,
    v_BxNxGxD: jax.Array,
    pattern,
    *,
    implementation: str | None = None,
    scale: float | None = None,
    return_lse: bool = False,
    return_aux: bool = False,
    score_fn=None,
    **options,
):
    """Sparse attention of q over the (k, v) pairs a pattern allows.

    Args:
      q_BxNxHxD: queries [batch, length, query heads, head size].
      k_BxNxGxD, v_BxNxGxD: keys and values with G KV heads (H % G == 0: grouped-query attention); their length
        is N, or the pattern's `num_kv_tokens` for a pattern built for (Nq, Nk) (`patterns.from_mask_fn`:
        cross-attention, a prefill chunk against a longer cache).
      pattern: any registered pattern type over the N tokens (Intervals, BlockLayout, NeighbourList, and each
        mechanism's own: `patterns.abca.ZonePattern`, `patterns.labels.LabelPattern`), leading axes [B|1, H|1];
        or a `Prepared` one (`prepare`), which runs the executor it was prepared for with its options.
      implementation: a name registered for the pattern's type ("reference" for every type, "xla", "pallas",
        or a mechanism executor such as "packed" or "bucketed"), or None (the platform's default for that type and
        pattern, `resolve_implementation`).
        Any other value (including "") or an explicit choice that cannot run raises ValueError naming what can.
      scale: logit scale, default 1/sqrt(D).
      return_lse: also return the float32 log-sum-exp [B, N, H] (-inf on rows with no allowed key).
      return_aux: also return the executor's diagnostics dict (last), e.g. "bucketed"'s per-query `keys` and band
        `overflow`; `{}` for an executor that reports none (`register_executor(..., aux=True)`).
      score_fn: None, or `score_fn(score, b, h, q_idx, kv_idx) -> score` applied to the scaled float32 logits
        before the softmax (FlexAttention's `score_mod`; `sparse_attn.score_fns` has softcap, ALiBi and a
        T5-style relative bias): written elementwise with jnp ops, it receives int32 index arrays that broadcast
        against the logits. Gradients flow into the arrays it closes over. Masking stays the pattern's: a masked
        key stays masked, an empty row gives 0. With a score function `implementation=None` picks an executor that
        applies one ("xla", "reference"; `executors.registry.takes_scores`).
      **options: executor options (e.g. `block` for "xla", `config` for "pallas").

    Returns:
      out [B, N, H, D] in q's dtype (0 on rows with no allowed key), then lse and aux if asked. An empty batch
      (B = 0) gives empty outputs (and an empty aux); N, H, G and D must be >= 1.
    """
    if isinstance(pattern, Prepared):
        pattern, implementation, options = _unwrap(pattern, implementation, options, q_BxNxHxD.shape[-1])
    if score_fn is not None:
        check_score_fn(score_fn)
        options = dict(options, score_fn=score_fn)
    name = registry.resolve(pattern, implementation, scores=score_fn is not None)
    fn = registry.lookup(type(pattern), name)
    _check_inputs(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern)
    scale = 1.0 / math.sqrt(q_BxNxHxD.shape[-1]) if scale is None else scale
    args = (q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern)
    aux = {}
    if q_BxNxHxD.shape[0] == 0:
        out, lse = _empty_batch(q_BxNxHxD, fn, args, dict(options, scale=scale))
    elif registry.returns_aux(type(pattern), name):
        out, lse, aux = fn(*args, scale=scale, **options)
    else:
        out, lse = fn(*args, scale=scale, **options)
    if not (return_lse or return_aux):
        return out
    return (out, *([lse] if return_lse else []), *([aux] if return_aux else []))
