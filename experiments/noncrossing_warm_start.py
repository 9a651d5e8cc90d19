"""Does the supervised router warm start help a non-crossing classifier train? (docs/noncrossing.md, "Warm start")

Command (CPU, a few minutes):
  python -m experiments.noncrossing_warm_start --steps 300 --warm-steps 150
  python -m experiments.noncrossing_warm_start --depths   # the bracket-depth table of docs/noncrossing.md

Two arms from the same initial parameters and the same batches: a Dyck-(k, m) classifier (balanced vs. corrupted,
`sparse_attn.data.tasks.dyck`) whose layers are all non-crossing, trained `--steps` steps on the task; the "warm"
arm first fits layer 0's pair scorers (every head) for `--warm-steps` steps with the teacher-forced BCE of the
layered construction: at routing layer t, each pair of adjacent unmatched strands is labelled by whether it closes
a bracket of height t (`teacher_targets`). Reported per arm: validation accuracy and loss, and the share of
validation words whose layer-0 router (head 0) builds exactly the bracket matching as its top caps.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from sparse_attn.data.tasks.common import batch as task_batch
from sparse_attn.data.tasks.dyck import Dyck
from sparse_attn.data.tasks.listops import CLOSE, ListOps
from sparse_attn.models import TransformerClassifier, TransformerConfig
from sparse_attn.modules.noncrossing import NoncrossingAttentionConfig
from sparse_attn.modules.noncrossing.scorer import pair_scores
from sparse_attn.patterns.noncrossing import diagram_np, layered


def matching(opens: np.ndarray) -> list[tuple[int, int]]:
    stack, caps = [], []
    for i, is_open in enumerate(opens):
        if is_open:
            stack.append(i)
        else:
            caps.append((stack.pop(), i))
    return sorted(caps)


def teacher_targets(opens: np.ndarray, valid_len: int, n: int, num_layers: int):
    """Per routing layer t: each point's next unmatched strand `nxt`, the target (the pair closes a bracket of
    height t) and the mask (the pair exists inside the valid prefix), teacher-forced on the layered construction."""
    caps = matching(opens[:valid_len])
    height = layered.cap_heights(caps, n)
    word = layered.layered_word(caps, n)
    p = diagram_np.identity(n)
    nxt_T, y_T, m_T = np.full((num_layers, n), n - 1), np.zeros((num_layers, n), np.float32), np.zeros((num_layers, n), bool)
    for t in range(num_layers):
        defects = [a for a in range(n) if p[a] >= n]
        for a, b in zip(defects, defects[1:]):
            if b >= valid_len:
                break
            nxt_T[t, a], m_T[t, a], y_T[t, a] = b, True, float(height.get((a, b)) == t + 1)
        for i in word[t] if t < len(word) else []:
            diagram_np.rmul_gen(p, i)
    return nxt_T, y_T, m_T


def batches(task: Dyck, split: str, size: int, num: int, num_layers: int, offset: int = 0):
    src = task.source(split)
    for i in range(num):
        b = task_batch(src, range(offset + i * size, offset + (i + 1) * size))
        opens = (b["inputs"] >= 1) & (b["inputs"] <= task.k)
        nxt, y, m = map(np.stack, zip(*(teacher_targets(o, int(v), task.seq_len, num_layers)
                                          for o, v in zip(opens, b["valid_len"]))))
        yield {**{k: jnp.asarray(v) for k, v in b.items()}, "nxt": jnp.asarray(nxt), "y": jnp.asarray(y),
               "m": jnp.asarray(m), "opens": opens}


def layer0_features(model, tokens, valid_len):
    """What layer 0's router reads: the normalised embeddings, padding selected to 0 (as the module does)."""
    block = model.blocks[0]
    x = block.norm1(model.embed(tokens))
    live = jnp.arange(tokens.shape[1])[None, :, None] < valid_len[:, None, None]
    return jnp.where(live, x, 0.0)


def warm_start_loss(model, b):
    """Teacher-forced BCE of layer 0's pair scores, every head and routing layer."""
    sc = model.blocks[0].attn.scorer
    u, v = sc.features(layer0_features(model, b["inputs"], b["valid_len"]))  # [B, H, N, T, r]
    w, c, beta = sc.w[...], sc.c[...], sc.beta[...]  # [H, T, r], [H, T]

    def one_layer(u1, v1, nxt1, w1, c1, b1):  # u1, v1 [N, r]; nxt1 [N]
        return pair_scores(u1, v1, nxt1, w1, c1, b1)

    per_t = jax.vmap(one_layer, in_axes=(1, 1, 0, 0, 0, 0))  # over T: -> [T, N]
    per_h = jax.vmap(per_t, in_axes=(0, 0, None, 0, 0, 0))  # over H
    s = jax.vmap(per_h, in_axes=(0, 0, 0, None, None, None))(u, v, b["nxt"], w, c, beta)  # [B, H, T, N]
    bce = optax.sigmoid_binary_cross_entropy(s, b["y"][:, None])
    m = jnp.broadcast_to(b["m"][:, None], bce.shape)
    return jnp.sum(jnp.where(m, bce, 0.0)) / jnp.maximum(jnp.sum(m), 1)


def task_loss(model, b):
    out = model(b["inputs"], valid_len=b["valid_len"])
    ce = optax.softmax_cross_entropy_with_integer_labels(out.logits.astype(jnp.float32), b["label"]).mean()
    return ce + out.aux_loss, out.logits


def train(model, data, steps: int, loss_fn, lr: float, log_every: int, name: str):
    opt = nnx.Optimizer(model, optax.adam(lr), wrt=nnx.Param)

    @nnx.jit
    def step(model, opt, b):
        (loss, _), g = nnx.value_and_grad(loss_fn, has_aux=True)(model, b)
        opt.update(model, g)
        return loss

    for i in range(steps):
        loss = step(model, opt, next(data))
        if i % log_every == 0 or i == steps - 1:
            print(f"{name} step {i:4d} loss {float(loss):.4f}", flush=True)


def evaluate(model, task: Dyck, num_batches: int, size: int, num_layers: int) -> dict:
    correct = nll = count = matched = 0

    @nnx.jit
    def fwd(model, b):
        loss, logits = task_loss(model, b)
        x = layer0_features(model, b["inputs"], b["valid_len"])
        routed = model.blocks[0].attn.route(x, b["valid_len"])
        return loss, logits, routed["p"][:, 0]

    for b in batches(task, "validation", size, num_batches, num_layers):
        loss, logits, p = fwd(model, {k: v for k, v in b.items() if k != "opens"})
        correct += int(jnp.sum(jnp.argmax(logits, -1) == b["label"]))
        nll += float(loss) * size
        count += size
        for pi, o, vl in zip(np.asarray(p), b["opens"], np.asarray(b["valid_len"])):
            matched += [c for c in diagram_np.caps(pi) if c[1] < vl] == matching(o[:vl])
    return {"accuracy": correct / count, "valid_loss": nll / count, "router_matches_brackets": matched / count}


def depth_table(num: int = 300) -> None:
    """Bracket nesting depth of the valid tokens of generated ListOps and Dyck validation examples."""
    tasks = (ListOps(seq_len=128), ListOps(seq_len=512), ListOps(seq_len=2048),
             Dyck(seq_len=128), Dyck(seq_len=512), Dyck(seq_len=2048))
    for task in tasks:
        b = task_batch(task.source("validation"), range(num))
        if isinstance(task, ListOps):  # operators ("[MIN" ...) open, CLOSE closes; digits are neither
            step = np.where((b["inputs"] > 10) & (b["inputs"] < CLOSE), 1, 0) - (b["inputs"] == CLOSE)
        else:  # 1 + t opens type t, 1 + k + t closes it
            step = np.where(b["inputs"] <= task.k, 1, -1)
        live = np.arange(task.seq_len)[None] < b["valid_len"][:, None]
        d = np.max(np.cumsum(np.where(live, step, 0), axis=1), axis=1)
        p = np.percentile(d, [50, 90, 99]).astype(int).tolist()
        print(f"{type(task).__name__} seq_len={task.seq_len}: depth p50/p90/p99 {p}, max {d.max()}, "
              f"share <= 4: {np.mean(d <= 4):.1%}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--depth", type=int, default=10, help="Dyck height m and the routers' num_route_layers")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warm-steps", type=int, default=150)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warm-lr", type=float, default=1e-2)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arms", nargs="+", default=["cold", "warm"], choices=["cold", "warm"])
    ap.add_argument("--depths", action="store_true", help="print the tasks' bracket depths and exit")
    args = ap.parse_args(argv)
    if args.depths:
        return depth_table()
    task = Dyck(seq_len=args.n, m=args.depth, min_distance=min(16, args.n // 4))
    att = NoncrossingAttentionConfig(num_route_layers=args.depth)
    cfg = TransformerConfig(vocab_size=task.vocab_size, model_dim=32, num_heads=2, num_layers=2, mlp_dim=64,
                            attention=att, num_classes=2)
    results = {}
    for arm in args.arms:
        t0 = time.time()
        model = TransformerClassifier(cfg, rngs=nnx.Rngs(args.seed))
        if arm == "warm":
            # Words the task run never sees (the far end of the training split); their labels are not read.
            warm = batches(task, "train", args.batch, args.warm_steps, args.depth, offset=task.num_train // 2)
            train(model, warm, args.warm_steps, lambda m, b: (warm_start_loss(m, b), None), args.warm_lr, 50,
                  "warm-start")
            results["warm_start_only"] = evaluate(model, task, args.eval_batches, args.batch, args.depth)
        data = batches(task, "train", args.batch, args.steps, args.depth)
        train(model, data, args.steps, task_loss, args.lr, 50, arm)
        results[arm] = {**evaluate(model, task, args.eval_batches, args.batch, args.depth),
                        "wall_s": round(time.time() - t0, 1)}
        print(arm, results[arm], flush=True)
    print(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
