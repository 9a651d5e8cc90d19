"""Label attention's hard-phase capacity on a trained checkpoint (docs/labels.md, "Defaults": `reach`).

    python -m experiments.lm.label_capacity --workdir /tmp/lab_cap_before --batches 16 --time 5

Restores the run, runs its layers at `INFERENCE_STEP` (the hard phase) on `--batches` training windows (fresh draws,
seed 1) and on the validation batches, and reports per label layer the planned reach, the reach each batch needed,
the band tier it ran, and the fraction of batches on tier 0 — first with the layer as trained, then after
`calibrate_reach` on the training windows (held-out: the validation batches). `--time R`: the label core's hard
forward and forward+backward (median of R) on one batch's q, k, v and labels at the planned reach (the tier it
runs), at the calibrated reach (tier 0) and, for the balanced cost, on uniformly random labels at the planned reach.

Writes: nothing; prints the capacity table and timings.
"""

from __future__ import annotations

import json
import statistics
import time

import jax
import jax.numpy as jnp
from flax import nnx

from experiments.lm import configs as lm_configs
from sparse_attn.data import RandomWindows, eval_batches
from sparse_attn.executors.labels.bucketed import bucketed_attention
from sparse_attn.modules.base import AttentionContext
from sparse_attn.modules.labels import INFERENCE_STEP, LabelAttention, calibrate_reach
from sparse_attn.patterns.labels import bits as bits_lib
from sparse_attn.patterns.labels.base_graph import BaseGraph
from sparse_attn.studies import cli
from sparse_attn.studies.restore import restore


def label_inputs(model, tokens_BxN):
    """Per label layer i: (module, q, k, v, labels) of its hard-phase forward on `tokens` (the trunk run by hand)."""
    b, n = tokens_BxN.shape
    vl = jnp.full((b,), n, jnp.int32)
    ctx = AttentionContext(valid_len=vl, tokens=tokens_BxN, step=jnp.int32(INFERENCE_STEP), causal=True)
    x = model.embed(tokens_BxN)
    out = {}
    for i, block in enumerate(model.blocks):
        if isinstance(block.attn, LabelAttention):
            h = block.norm1(x)
            q, k, v = block.attn.proj.qkv(h)
            labels = bits_lib.top_k_labels(block.attn.router(h), block.attn.config.top_k)
            out[i] = (block.attn, q, k, v, labels)
        x, _ = block(x, ctx)
    return out


def tier_stats(model, batches) -> dict:
    """Per label layer: planned reach, needed reach and tier of every batch (the model's own hard forward)."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def stats(state, tokens):
        return nnx.merge(graphdef, state)(tokens, step=INFERENCE_STEP).stats

    rows: dict[str, dict] = {}
    for tokens in batches:
        s = jax.device_get(stats(state, tokens))
        for key in s:
            if key.endswith("/labels/reach_tier"):
                layer = key.split("/")[0]
                r = rows.setdefault(layer, dict(planned=int(s[f"{layer}/labels/reach_planned"]), needed=[], tier=[]))
                r["needed"].append(int(s[f"{layer}/labels/reach_needed"]))
                r["tier"].append(int(s[key]))
    for r in rows.values():
        r["tier0_fraction"] = sum(t == 0 for t in r["tier"]) / len(r["tier"])
    return rows


def core_fns(labels, reach: int, *, num_labels: int, base: BaseGraph, block: int | None = None):
    """(forward, forward+backward) of the bucketed executor on `labels` at planned `reach`, jitted."""
    kw = dict(num_labels=num_labels, base=base, reach=reach)
    if block is not None:
        kw["block"] = block
    fwd = jax.jit(lambda q, k, v: bucketed_attention(q, k, v, labels, **kw))
    grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(bucketed_attention(q, k, v, labels, **kw)[0]), argnums=(0, 1, 2)))
    return fwd, grad


def module_core_fns(module, labels, reach: int):
    """`core_fns` with a label layer's own radius, landmarks, label count and block (causal, as in the LM)."""
    cfg = module.config
    base = BaseGraph(radius=cfg.radius, landmark_every=cfg.landmarks, causal=True)
    return core_fns(labels, reach, num_labels=cfg.num_labels, base=base, block=cfg.capacity.block)


def time_settings(built: dict, q, k, v, repeats: int) -> dict:
    """Per setting `name: (fwd, grad)`: the tier it ran and the median wall and process-CPU ms of its forward and
    forward+backward, the settings interleaved round by round (a slow spell of the shared machine hits all alike)."""
    out = {}
    for name, (fwd, grad) in built.items():
        info = jax.device_get(fwd(q, k, v)[2])
        jax.block_until_ready(grad(q, k, v))  # compile
        out[name] = dict(tier=int(info["tier"]), tier_reach=int(info["reach"]), needed=int(info["needed"]),
                         samples={key: [] for key in ("fwd", "fwd_bwd")})
    for _ in range(repeats):
        for name, (fwd, grad) in built.items():
            for key, fn in (("fwd", fwd), ("fwd_bwd", grad)):
                t, c = time.perf_counter(), time.process_time()
                jax.block_until_ready(fn(q, k, v))
                out[name]["samples"][key].append(((time.perf_counter() - t) * 1e3, (time.process_time() - c) * 1e3))
    for r in out.values():
        for key, samples in r.pop("samples").items():
            r[f"{key}_ms"] = round(statistics.median(w for w, _ in samples), 2)
            r[f"{key}_cpu_ms"] = round(statistics.median(c for _, c in samples), 2)
    return out


@cli.entry_point
def main(argv=None) -> dict:
    p = cli.ArgumentParser(__doc__)
    p.add_argument("--workdir", required=True)
    p.add_argument("--batches", type=int, default=16, help="training windows (batches) to calibrate on")
    p.add_argument("--time", type=int, default=0, help="timed repeats of the core per setting (0: no timing)")
    p.add_argument("--out", default=None, help="JSON file for the results")
    args = p.parse_args(argv)
    if args.batches < 1:
        p.error(f"--batches must be >= 1, got {args.batches}")

    run = restore(args.workdir)
    if run.kind != "lm" or not any(isinstance(b.attn, LabelAttention) for b in run.model.blocks):
        raise ValueError(f"{args.workdir!r} is not a byte-LM run with label attention layers (train one with "
                         "`python -m experiments.lm --config smoke_labels`)")
    model, tc = run.model, run.train
    corpus = lm_configs.smoke().data.load()
    shard = dict(global_batch=tc.global_batch, seq_len=tc.seq_len, process_index=0, process_count=1)
    it = RandomWindows(corpus.train_U8, seed=1, **shard)
    train = [jnp.asarray(next(it)["inputs"]) for _ in range(args.batches)]
    valid = [jnp.asarray(b["inputs"]) for b in eval_batches(corpus.valid_U8, num_batches=tc.eval_batches, **shard)]
    result = {"before": {"train": tier_stats(model, train), "valid": tier_stats(model, valid)}}
    inputs = label_inputs(model, train[0])
    planned = {i: m.planned_reach(tc.seq_len) for i, (m, *_) in inputs.items()}
    result["calibrated"] = {f"layer{i}": r for i, r in calibrate_reach(model, train).items()}
    result["after"] = {"train": tier_stats(model, train), "valid": tier_stats(model, valid)}
    if args.time:
        timing = {}
        for i, (module, q, k, v, labels) in inputs.items():
            d, kk = module.config.num_labels, module.config.top_k
            keys = jax.random.split(jax.random.PRNGKey(i), labels.shape[0] * labels.shape[2])
            balanced = jax.vmap(lambda key, d=d, kk=kk: jax.random.permutation(key, d)[:kk])(keys)
            balanced = balanced.reshape(labels.shape)
            timing[f"layer{i}"] = time_settings(dict(
                trained_planned=module_core_fns(module, labels, planned[i]),  # as trained: the tier the batch needs
                trained_calibrated=module_core_fns(module, labels, module.planned_reach(tc.seq_len)),  # tier 0
                balanced_planned=module_core_fns(module, balanced.astype(jnp.int32), planned[i]),  # uniform labels
            ), q, k, v, args.time)
        result["timing_ms"] = timing
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
