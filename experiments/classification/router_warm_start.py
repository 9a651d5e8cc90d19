"""Does the supervised router warm start help a non-crossing classifier train? (docs/noncrossing.md, "Warm start")

Command (the docs' table: 3 seeds x 3 arms, ~3 min an arm on a loaded 2-core CPU; `--out` appends JSON lines):
  python -m experiments.classification.router_warm_start --arms cold warm dense --seeds 0 1 2 --steps 3000 \
      --warm-steps 200 --eval-batches 16 --eval-every 500 --part table \
      --out experiments/results/noncrossing_warm_start.jsonl
  python -m experiments.classification.router_warm_start --depths   # the bracket-depth table of docs/noncrossing.md

Arms, one Dyck-(k, m) classifier (balanced vs. corrupted, `sparse_attn.data.tasks.dyck`; 2 layers, 2 heads) that
differ only in attention: "cold" and "warm" have non-crossing layers (T = m) and start from the same parameters;
the "warm" arm first fits layer 0's router (every head) for `--warm-steps` steps with the teacher-forced BCE of
`sparse_attn.modules.noncrossing.warm_start` (at routing layer t, each pair of adjacent unmatched strands is
labelled by whether it closes a bracket of height t); "dense" and "local" are the baselines. Every arm of a seed
sees the same task batches. Reported per arm: a validation curve (accuracy, loss, mean training loss) and, for
non-crossing arms, the share of validation words whose layer-0 router (head 0) builds exactly the bracket
matching as its top caps.

Writes: one JSON line per arm in experiments/results/noncrossing_warm_start.jsonl (--out).
"""

from __future__ import annotations

import dataclasses
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
from sparse_attn.modules import DenseAttention, LocalAttention
from sparse_attn.modules.noncrossing import NoncrossingAttention
from sparse_attn.modules.noncrossing.warm_start import bracket_matching
from sparse_attn.patterns.noncrossing import diagram_np
from sparse_attn.studies import cli
from sparse_attn.studies.mechanisms import Context, attention_config
from sparse_attn.studies.warm_start import adam_step, dyck_batches, fit_router, layer0_features


def task_loss(model, b):
    out = model(b["inputs"], valid_len=b["valid_len"])
    ce = optax.softmax_cross_entropy_with_integer_labels(out.logits.astype(jnp.float32), b["label"]).mean()
    return ce + out.aux_loss, out.logits


def train(model, data, steps: int, loss_fn, lr: float, log_every: int, name: str, on_eval=None,
          eval_every: int = 0) -> list[dict]:
    """Adam at a constant `lr`; every `eval_every` steps (and at the end) appends `on_eval(model)` to the curve,
    with the mean training loss since the previous entry."""
    opt, step = adam_step(model, loss_fn, lr)
    curve, losses = [], []
    for i in range(steps):
        b = next(data)
        losses.append(step(model, opt, {k: v for k, v in b.items() if k != "opens"}))
        if i % log_every == 0 or i == steps - 1:
            print(f"{name} step {i:4d} loss {float(losses[-1]):.4f}", flush=True)
        if on_eval is not None and ((eval_every and (i + 1) % eval_every == 0) or i == steps - 1):
            curve.append({"step": i + 1, "train_loss": float(np.mean(jax.device_get(losses))), **on_eval(model)})
            losses = []
            print(f"{name} eval {curve[-1]}", flush=True)
    return curve


@nnx.jit
def _eval_fwd(model, b):
    loss, logits = task_loss(model, b)
    return loss, logits


@nnx.jit
def _layer0_route(model, b):
    x = layer0_features(model, b["inputs"], b["valid_len"])
    return model.blocks[0].attn.route(x, b["valid_len"])["p"]  # every head's partner arrays [B, H, 2N]


def evaluate(model, val: list[dict]) -> dict:
    """Accuracy and loss on the validation batches `val`; for a non-crossing layer 0 (None for dense / local):
    the share of words whose head-0 router builds exactly the bracket matching as its top caps, and per head the
    share of bracket pairs that are caps (exact matching is all-or-nothing over ~24 pairs a word)."""
    correct = nll = count = matched = 0
    routed = isinstance(model.blocks[0].attn, NoncrossingAttention)
    found_H = total = 0
    for b in val:
        size = b["label"].shape[0]
        arrays = {k: v for k, v in b.items() if k != "opens"}
        loss, logits = _eval_fwd(model, arrays)
        correct += int(jnp.sum(jnp.argmax(logits, -1) == b["label"]))
        nll += float(loss) * size
        count += size
        if routed:
            routes = np.asarray(_layer0_route(model, arrays))
            for p_Hx2N, o, vl in zip(routes, b["opens"], np.asarray(b["valid_len"]), strict=True):
                pairs = bracket_matching(o[:vl])
                caps_H = [{c for c in diagram_np.caps(p) if c[1] < vl} for p in p_Hx2N]
                matched += sorted(caps_H[0]) == pairs
                found_H = found_H + np.array([sum(c in caps for c in pairs) for caps in caps_H])
                total += len(pairs)
    out = {"accuracy": correct / count, "valid_loss": nll / count,
           "router_matches_brackets": matched / count if routed else None}
    if routed:
        out["router_pair_recall"] = [round(float(f) / total, 4) for f in found_H]
    return out


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


ARMS = ("cold", "warm", "dense", "local")


def arm_config(arm: str, task: Dyck, depth: int, width: int, radius: int) -> TransformerConfig:
    """The same classifier for every arm; only the attention differs (cold and warm: non-crossing, T = depth)."""
    att = {"dense": DenseAttention(), "local": LocalAttention(radius=radius)}.get(
        arm, attention_config("noncrossing_defect", Context.classifier(task.seq_len), num_route_layers=depth))
    return TransformerConfig(vocab_size=task.vocab_size, model_dim=width, num_heads=2, num_layers=2,
                             mlp_dim=2 * width, attention=att, num_classes=2)


def run_arm(arm: str, seed: int, args) -> dict:
    """One arm at one seed. Seed s: initial parameters from `nnx.Rngs(s)` (equal across arms of one kind) and
    the training words of `Dyck(seed=s)` — task batches from example 0, the warm start's words after them (never
    seen by the task run); validation on the fixed `Dyck(seed=0)` validation split."""
    t0 = time.time()
    total = (args.steps + args.warm_steps) * args.batch
    train_task = Dyck(seq_len=args.n, m=args.depth, min_distance=min(16, args.n // 4), seed=seed,
                      num_train=max(total, 1))
    val_task = dataclasses.replace(train_task, seed=0)
    val = list(dyck_batches(val_task, "validation", args.batch, args.eval_batches, args.depth, teacher=False))
    model = TransformerClassifier(arm_config(arm, train_task, args.depth, args.width, args.radius),
                                  rngs=nnx.Rngs(seed))
    row = {"arm": arm, "seed": seed}
    if arm == "warm":
        warm = dyck_batches(train_task, "train", args.batch, args.warm_steps, args.depth,
                            offset=args.steps * args.batch)
        fit_router(model, warm, args.warm_steps, lr=args.warm_lr, log=lambda msg: print(msg, flush=True))
        row["warm_start_only"] = evaluate(model, val)
        print("warm start only", row["warm_start_only"], flush=True)
    data = dyck_batches(train_task, "train", args.batch, args.steps, args.depth, teacher=False)
    row["curve"] = train(model, data, args.steps, task_loss, args.lr, args.log_every, f"{arm} s{seed}",
                         on_eval=lambda m: evaluate(m, val), eval_every=args.eval_every)
    row.update(row["curve"][-1], wall_s=round(time.time() - t0, 1))
    return row


@cli.entry_point
def main(argv=None):
    ap = cli.ArgumentParser(__doc__)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--depth", type=int, default=10, help="Dyck height m and the routers' num_route_layers")
    ap.add_argument("--width", type=int, default=32, help="model width (2 heads, MLP 2x)")
    ap.add_argument("--radius", type=int, default=8, help="the local arm's window, each side")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--warm-steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warm-lr", type=float, default=1e-2)
    ap.add_argument("--eval-batches", type=int, default=16)
    ap.add_argument("--eval-every", type=int, default=500, help="validation curve every this many steps (0: end)")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--arms", nargs="+", default=["cold", "warm", "dense"], choices=ARMS)
    ap.add_argument("--out", help="append one JSON line per (arm, seed) to this file")
    ap.add_argument("--part", default="", help="a label stored in every row (which table of the docs it feeds)")
    ap.add_argument("--depths", action="store_true", help="print the tasks' bracket depths and exit")
    args = ap.parse_args(argv)
    if args.depths:
        return depth_table()
    rows = []
    for seed in args.seeds:
        for arm in args.arms:
            row = {"part": args.part, **run_arm(arm, seed, args), "args": vars(args)}
            print(arm, seed, {k: v for k, v in row.items() if k not in ("curve", "args")}, flush=True)
            rows.append(row)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    return rows


if __name__ == "__main__":
    main()
