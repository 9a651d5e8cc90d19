"""A mechanism defined entirely here, touching no library or experiment file (docs/architecture.md, "Adding a
mechanism"): its own pattern type and executor (`register_executor`), and one record (`register_mechanism`) naming
its config and module, a preset, an incremental decoder and a benchmark core. Through that record the LM runner
trains it by name, `LMDecoder` decodes it exactly, and the attention benchmark times it.

The toy: causal strided attention, query i attends keys j <= i with (i - j) % stride == 0.
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import sparse_attn
from experiments.benchmarks import attention as bench_attention
from experiments.lm import configs as lm_configs
from experiments.lm import train as lm_train
from sparse_attn import registry
from sparse_attn.data import TextSource
from sparse_attn.decode import DecodeContext, LMDecoder
from sparse_attn.decode.attend import attend, project, write_slot
from sparse_attn.models import TransformerConfig, TransformerLM
from sparse_attn.modules import AttentionContext, AttentionOutput, DenseAttention, Projections
from sparse_attn.studies.bench import with_pattern
from sparse_attn.train import TrainConfig
from tests.lm_steps import two_train_steps


# -- pattern: pure, a pytree, with the oracle -----------------------------------------------------------------
@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Strided:
    """valid_len: int32[B|1]; n, stride: static."""

    valid_len: jax.Array
    n: int = dataclasses.field(metadata=dict(static=True))
    stride: int = dataclasses.field(metadata=dict(static=True))

    @property
    def num_tokens(self) -> int:
        return self.n

    def validate(self, batch=None, heads=None) -> Strided:
        if self.stride < 1 or self.valid_len.shape[0] not in (1, batch or self.valid_len.shape[0]):
            raise ValueError(f"bad Strided pattern: stride {self.stride}, valid_len {self.valid_len.shape}")
        return self

    def allowed(self, q_pos, k_pos):
        """bool[B', 1, X, Q, K] for q_pos int32[.., X, Q], k_pos int32[.., X, K] (the `pattern_stats` contract)."""
        qi, kj = q_pos[..., :, None], k_pos[..., None, :]
        vl = self.valid_len.reshape(-1, 1, 1, 1, 1)
        return (kj <= qi) & ((qi - kj) % self.stride == 0) & (qi < vl) & (kj < vl)

    def to_dense(self):
        pos = jnp.arange(self.n, dtype=jnp.int32).reshape(1, 1, 1, self.n)
        return self.allowed(pos, pos)[:, :, 0]


# -- executor: (q, k, v, pattern, *, scale) -> (out, lse), gathering the n / stride keys of each row ----------------
def strided_attention(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern: Strided, *, scale: float):
    b, n, h, _ = q_BxNxHxD.shape
    rep = h // k_BxNxGxD.shape[2]
    pos = jnp.arange(n, dtype=jnp.int32)
    idx_NxK = pos[:, None] - pattern.stride * jnp.arange(-(-n // pattern.stride), dtype=jnp.int32)[None]
    vl = jnp.broadcast_to(pattern.valid_len, (b,))[:, None, None]
    ok_BxNxK = (idx_NxK >= 0)[None] & (pos[None, :, None] < vl) & (idx_NxK[None] < vl)
    k = jnp.repeat(k_BxNxGxD, rep, axis=2)[:, jnp.maximum(idx_NxK, 0)]  # [B, N, K, H, D]
    v = jnp.repeat(v_BxNxGxD, rep, axis=2)[:, jnp.maximum(idx_NxK, 0)]
    s = jnp.einsum("bnhd,bnkhd->bnhk", q_BxNxHxD, k, preferred_element_type=jnp.float32) * scale
    s = jnp.where(ok_BxNxK[:, :, None], s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    e = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0))
    tot = jnp.sum(e, axis=-1)
    out = jnp.einsum("bnhk,bnkhd->bnhd", e / jnp.where(tot > 0, tot, 1.0)[..., None], v.astype(jnp.float32))
    lse = jnp.where(tot > 0, jnp.log(jnp.where(tot > 0, tot, 1.0)) + m[..., 0], -jnp.inf)
    return out.astype(q_BxNxHxD.dtype), lse


sparse_attn.register_executor(Strided, "strided", strided_attention, default_on="cpu")


# -- module: a frozen config with make(), an NNX module returning AttentionOutput -------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class StridedAttentionConfig:
    stride: int = 3
    implementation: str | None = None

    def make(self, model_dim: int, num_heads: int, *, rngs: nnx.Rngs) -> StridedAttention:
        return registry.for_config(self).module(self, model_dim, num_heads, rngs=rngs)


class StridedAttention(nnx.Module):
    def __init__(self, config: StridedAttentionConfig, model_dim: int, num_heads: int, *, rngs: nnx.Rngs):
        self.config = config
        self.proj = Projections(model_dim, num_heads, rngs=rngs)

    def __call__(self, x_BxNxD, ctx: AttentionContext) -> AttentionOutput:
        q, k, v = self.proj.qkv(x_BxNxD)
        pattern = Strided(jnp.asarray(ctx.valid_len, jnp.int32), x_BxNxD.shape[1], self.config.stride)
        o = sparse_attn.attention(q, k, v, pattern, implementation=self.config.implementation)
        return AttentionOutput(y=self.proj.out(o), stats={"strided/stride": jnp.float32(self.config.stride)})


# -- decoder: the full KV cache; a step reads the cached keys on its stride ------------------------------------------
def init_cache(module: StridedAttention, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    kv = (batch, max_len, module.proj.num_kv_heads, module.proj.head_dim)
    return {"k": jnp.zeros(kv, dtype), "v": jnp.zeros(kv, dtype)}


def step(module: StridedAttention, x_Bx1xD, cache: dict, ctx: DecodeContext):
    q, k, v = project(module.proj, x_Bx1xD, ctx.pos)
    cache = {"k": write_slot(cache["k"], ctx.pos, k), "v": write_slot(cache["v"], ctx.pos, v)}
    j = jnp.arange(cache["k"].shape[1])
    ok = (j <= ctx.pos) & ((ctx.pos - j) % module.config.stride == 0)
    o = attend(q, cache["k"], cache["v"], ok[None, None])
    return module.proj.wo(o.reshape(o.shape[0], 1, -1)), cache


# -- the record: everything else reads the toy from here --------------------------------------------------------------
TOY = registry.Mechanism(
    name="toy_strided",
    configs=(StridedAttentionConfig,),
    module=StridedAttention,
    presets={"toy_strided": registry.Preset(config=lambda ctx: StridedAttentionConfig(stride=max(ctx.window // 2, 1)),
                                            encoder=False)},
    decoder=registry.Decoder(init_cache, step),
    bench={"toy_strided": with_pattern(lambda spec: Strided(jnp.asarray([spec.n], jnp.int32), spec.n, 8))},
)


@pytest.fixture
def toy_registered():
    """The toy's record for as long as the test runs (xdist workers share no registry)."""
    registry.register_mechanism(TOY)
    yield "toy_strided"
    registry.unregister_mechanism("toy_strided")


# -- tests ------------------------------------------------------------------------------------------------------
def test_toy_executor_matches_its_reference_through_attention():
    b, n, h, g, d = 2, 19, 4, 2, 8
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    q = jax.random.normal(ks[0], (b, n, h, d))
    k, v = (jax.random.normal(x, (b, n, g, d)) for x in ks[1:3])
    ct = jax.random.normal(ks[3], q.shape)
    pattern = Strided(jnp.asarray([n, 13], jnp.int32), n, 4)

    def run(impl):
        def loss(q, k, v):
            out, lse = sparse_attn.attention(q, k, v, pattern, implementation=impl, return_lse=True)
            return jnp.sum(out * ct) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0)), out

        return jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(q, k, v)

    ((_, o1), g1), ((_, o2), g2) = run(None), run("reference")
    assert sparse_attn.default_implementation("cpu", Strided) == "strided"
    np.testing.assert_allclose(o1, o2, atol=1e-5, rtol=1e-5)
    for a, c in zip(g1, g2, strict=True):
        np.testing.assert_allclose(a, c, atol=1e-5, rtol=1e-5)


def test_toy_module_trains_in_the_language_model(toy_registered):
    cfg = TransformerConfig(
        vocab_size=32, model_dim=32, num_heads=4, num_layers=2, mlp_dim=64,
        attention=(StridedAttentionConfig(stride=2), DenseAttention()),
    )  # fmt: skip
    model = TransformerLM(cfg, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 16), 0, 32)
    loss0, loss1, stats = two_train_steps(model, tokens, valid_len=[15, 11])
    assert np.isfinite(loss0) and loss1 < loss0
    assert float(stats["layer0/strided/stride"]) == 2.0


def test_the_benchmark_harness_times_the_toy_core(toy_registered):
    args = argparse.Namespace(n=[64], mechanisms=["toy_strided"], impls=["strided"], batch=1, heads=2, head_dim=8,
                              radius=8, dtype="float32", repeats=1)  # fmt: skip
    rows = bench_attention.run(args)
    assert [(r.mechanism, r.impl) for r in rows] == [("dense", "jax.nn"), ("toy_strided", "strided")]
    assert rows[1].flops == 4.0 * 2 * sum(i // 8 + 1 for i in range(64)) * 8  # pattern_stats on the toy pattern


def test_the_decoder_of_the_record_decodes_the_toy_exactly(toy_registered):
    cfg = TransformerConfig(vocab_size=32, model_dim=32, num_heads=4, num_layers=2, mlp_dim=64,
                            attention=(StridedAttentionConfig(stride=3), DenseAttention()))
    model = TransformerLM(cfg, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.PRNGKey(2), (2, 12), 0, 32)
    full = model(tokens).logits
    logits, _ = LMDecoder(model, batch=2, max_len=12).prefill(tokens)
    np.testing.assert_allclose(logits, full, atol=2e-5, rtol=2e-5)


def test_the_lm_runner_trains_the_toy_by_name(toy_registered, tmp_path, monkeypatch):
    text = tmp_path / "text"
    text.mkdir()
    for i in range(20):
        (text / f"f{i}.txt").write_text(f"def function_{i}(x):\n    return x * {i}\n" * 20)
    micro = lm_configs.LMConfig(
        model=TransformerConfig(model_dim=32, num_heads=2, num_layers=2, mlp_dim=64, attention=(DenseAttention(),) * 2),
        data=TextSource(path=str(text)),
        train=TrainConfig(global_batch=8, seq_len=16, num_steps=2, warmup_steps=1, checkpoint_every=2, eval_every=2,
                          eval_batches=1, progress=False),
    )
    monkeypatch.setitem(lm_configs.CONFIGS, "micro", lambda: micro)
    assert toy_registered in registry.preset_names(causal=True)
    summary = lm_train.main(["--config", "micro", "--workdir", str(tmp_path / "run"), "--mechanism",
                             f"{toy_registered},dense"])
    assert summary["step"] == 2 and np.isfinite(summary["eval"]["bits_per_byte"])
    assert summary["train"]["layer0/strided/stride"] == 2.0  # window 16 // 4 = 4 each side -> stride 2
