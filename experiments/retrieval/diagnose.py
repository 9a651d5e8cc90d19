"""Which hop fails? Per layer and head of a trained retrieval run, the pairs its task needs (each answer's query
position -> the token it must find): how often the layer's pattern admits them (recall) and how much attention
they get (mass, against the mass of a query that knows nothing: uniform over the row's keys). Reading it:
recall 0 = the pattern never admits the pair; recall 1 with mass near uniform = the softmax has not
learned it (sparse_attn/diagnostics/).

Command:
  python -m experiments.retrieval.diagnose --workdir runs/retrieval/cpu/passkey_n256_moba_k24_s0 [--examples 64]
      [--offsets 0 -1] [--step 250 500 750 1000]

Prints one JSON object (per layer: mechanism, recall, mass, uniform mass, each also per head; ABCA layers also each
hop of their path: direct, to_anchor, gather, handshake, handshake_peak, with uniform values; label layers their
router's label entropy, bucket balance, the base graph's share its labels keep, whether H holds the pairs at all,
and the router's gradient norms from the training loss and from its own losses; and the whole model's rollout from
the evidence to the answer's query against uniform attention's). Layers without a registered probe (NSA,
non-crossing routing) are listed with `"probe": null`, and the rollout is then null.

Summary of many runs and steps (mean ± std over seeds, per variant and attention config, step and layer):
  python -m experiments.retrieval.diagnose --workdir runs/retrieval/cpu/passkey_n256_labels_k24_s* \
      --step 250 500 750 1000 --out experiments/results/diagnose_passkey_n256.jsonl
  python -m experiments.retrieval.diagnose --table experiments/results/diagnose_passkey_n256.jsonl

Writes: --out (JSON lines), else stdout only.
"""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np

from sparse_attn.diagnostics import (
    attention_rollout,
    layer_inputs,
    pair_attention_mass,
    pattern_recall,
    retrieval_probe,
)
from sparse_attn.diagnostics.labels import label_layer_probe, router_gradient_norms
from sparse_attn.diagnostics.probe import probe_for
from sparse_attn.modules.labels import LabelAttention
from sparse_attn.studies import cli
from sparse_attn.studies.restore import CheckpointError, from_json, restore
from sparse_attn.train import run_config


def diagnose(workdir: str, examples: int = 64, step: int | None = None, offsets=(0,)) -> dict:
    """The probe's means over `examples` validation examples, for keys at evidence + each offset (an induction
    path reads the token after the evidence's predecessor: offset 0 is the evidence itself, -1 its predecessor)."""
    run = restore(workdir, step)
    if run.kind != "retrieval":
        raise CheckpointError(f"{workdir!r} is a {run.kind} run; diagnose reads retrieval runs (passkey, recall)")
    task = from_json(run.stored["task"], path="task")
    source = task.source("validation")
    batch = [source[i] for i in range(examples)]
    tokens = jnp.asarray(np.stack([ex["inputs"] for ex in batch]), jnp.int32)
    q_pos = np.stack([ex["answer_pos"] for ex in batch]).astype(np.int32)
    evidence = q_pos - np.stack([ex["distance"] for ex in batch]).astype(np.int32)
    layers = [{"mechanism": type(block.attn.config).__name__} for block in run.model.blocks]
    for off in offsets:
        k_pos = np.clip(evidence + off, 0, tokens.shape[1] - 1)
        rows = retrieval_probe(run.model, tokens, jnp.asarray(q_pos), jnp.asarray(k_pos), step=run.step)
        for out, row in zip(layers, rows, strict=True):
            out["probe"] = None if row is None else "ok"
            for name, val in (row or {}).items():
                val = np.asarray(val)
                key = name if off == 0 else f"{name}@{off:+d}"
                out[key] = round(float(val.mean()), 4)
                out[f"{key}_per_head"] = [round(float(x), 4) for x in val.mean(axis=(0, 2))]
    k_pos = np.clip(evidence + offsets[0], 0, tokens.shape[1] - 1)
    _label_rows(run, batch, tokens, q_pos, k_pos, layers)
    roll = attention_rollout(run.model, tokens, jnp.asarray(q_pos), jnp.asarray(k_pos), step=run.step)
    rollout = None if roll is None else {name: round(float(np.mean(val)), 5) for name, val in roll.items()}
    return {"workdir": workdir, "mechanism": run.stored.get("mechanism"), "seed": run.stored["train"].get("seed"),
            "attention": run.stored["model"].get("attention"), "step": run.step, "task": run.stored["task_name"],
            "examples": examples, "pairs_per_example": int(q_pos.shape[1]), "offsets": list(offsets),
            "layers": layers, "rollout": rollout}


def _label_rows(run, batch, tokens, q_pos, k_pos, layers) -> None:
    """Label layers: the router's label usage, the base graph's share its labels keep, whether H holds the pairs,
    and the router's gradient norms from the training loss and from its own losses."""
    if not any(isinstance(block.attn, LabelAttention) for block in run.model.blocks):
        return
    inputs, ctx = layer_inputs(run.model, tokens, step=run.step)
    targets = jnp.asarray(np.stack([ex["targets"] for ex in batch]), jnp.int32)
    mask = jnp.asarray(np.stack([ex["loss_mask"] for ex in batch]), jnp.float32)
    grads = router_gradient_norms(run.model, tokens, targets, mask, step=run.step)
    for block, x, out, grad in zip(run.model.blocks, inputs, layers, grads, strict=True):
        if not isinstance(block.attn, LabelAttention):
            continue
        probe = label_layer_probe(block.attn, x, ctx, jnp.asarray(q_pos), jnp.asarray(k_pos))
        for name in ("entropy", "bucket_cv", "max_share", "kept_of_base", "base_recall"):
            out[f"labels/{name}"] = round(float(np.mean(np.asarray(probe[name]))), 4)
        out["labels/router_grad_task"] = float(grad["task"])
        out["labels/router_grad_aux"] = float(grad["aux"])
        out.update(_landmark_hops(block.attn, x, ctx, q_pos, k_pos))


def _landmark_hops(module, x, ctx, q_pos, k_pos) -> dict:
    """The two-hop route through H where the pair itself is not in it: the first landmark at or after the evidence
    (`landmark_every` = the window's radius by default, so that landmark's window holds the evidence) reads it, and
    the query reads that landmark. Recall and mass of each hop on the layer's hard pattern, with uniform masses."""
    every, n = module.config.landmarks, x.shape[1]
    if not every:
        return {}
    lm = np.minimum(-(-k_pos // every) * every, n - 1)
    q, k, pattern, impl = probe_for(module)(module, x, ctx)
    out = {}
    for hop, (qp, kp) in (("landmark_reads", (lm, k_pos)), ("reads_landmark", (q_pos, lm))):
        qp, kp = jnp.asarray(qp, jnp.int32), jnp.asarray(kp, jnp.int32)
        vals = {"recall": pattern_recall(pattern, qp, kp), "mass": pair_attention_mass(q, k, pattern, qp, kp,
                implementation=impl), "uniform": pair_attention_mass(jnp.zeros_like(q), k, pattern, qp, kp,
                implementation=impl)}  # fmt: skip
        out.update({f"labels/{hop}_{name}": round(float(np.mean(np.asarray(v))), 4) for name, v in vals.items()})
    return out


@cli.entry_point
def main(argv=None) -> dict:
    parser = cli.ArgumentParser(__doc__)
    parser.add_argument("--workdir", nargs="+", help="retrieval runs' workdirs (experiments.retrieval)")
    parser.add_argument("--step", type=int, nargs="+", help="checkpoint steps (default: the latest; every run keeps "
                        "each checkpoint it wrote): one object per step")
    parser.add_argument("--examples", type=int, default=64, help="validation examples to probe")
    parser.add_argument("--offsets", type=int, nargs="+", default=[0, -1],
                        help="keys at the evidence + these offsets (0: the token to find; -1: its predecessor)")
    parser.add_argument("--out", metavar="JSONL", help="also append one line per run and step to this file")
    parser.add_argument("--table", metavar="JSONL", help="print the markdown summary of these lines; probes nothing")
    args = parser.parse_args(argv)
    if args.table:
        with open(args.table) as f:
            text = table([json.loads(line) for line in f if line.strip()])
        print(text)
        return {"table": text}
    if not args.workdir:
        parser.error("--workdir is required (or --table)")
    outs = []
    for workdir in args.workdir:
        for step in args.step or [None]:
            outs.append(diagnose(workdir, args.examples, step, tuple(args.offsets)))
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(outs[-1]) + "\n")
            else:
                print(json.dumps(outs[-1], indent=1))
    return outs[0] if len(outs) == 1 else {"runs": outs}


# What the summary shows per layer, where the layer reports it (means over examples, pairs and heads).
COLUMNS = ("recall", "mass", "uniform_mass", "direct", "to_anchor", "to_anchor_uniform", "gather", "gather_uniform",
           "handshake", "handshake_uniform", "handshake_peak", "handshake_peak_uniform", "labels/base_recall",
           "labels/kept_of_base", "labels/entropy",
           "labels/bucket_cv", "labels/router_grad_task", "labels/router_grad_aux", "labels/landmark_reads_recall",
           "labels/landmark_reads_mass", "labels/landmark_reads_uniform", "labels/reads_landmark_recall",
           "labels/reads_landmark_mass", "labels/reads_landmark_uniform")


def _mechanism(row: dict):
    """The probed run's preset: `mechanism`, or `variant` in rows written before the rename."""
    return row["mechanism"] if row.get("mechanism") is not None else row.get("variant")


def _group_names(rows: list[dict]) -> dict:
    """{(variant, attention JSON): its name in the table}: the variant, and where one variant ran with several
    attention configs (budgets: e.g. an interval of 9 and one of 14), the config fields that tell them apart (a
    group's by its dotted path: `capacity.block`)."""
    configs: dict = {}
    for r in rows:
        attention = r.get("attention") or {}
        configs.setdefault(_mechanism(r), {})[json.dumps(r.get("attention"), sort_keys=True)] = \
            run_config.flatten(attention)
    names = {}
    for variant, by_key in configs.items():
        fields = sorted({f for cfg in by_key.values() for f in cfg if f.rpartition(".")[2] != "_type"})
        differ = [f for f in fields if len({json.dumps(cfg.get(f)) for cfg in by_key.values()}) > 1]
        for key, cfg in by_key.items():
            detail = ", ".join(f"{f} {cfg[f]}" if f in cfg else f"{f} unrecorded" for f in differ)
            names[(variant, key)] = f"{variant} ({detail})" if detail else str(variant)
    return names


def table(rows: list[dict]) -> str:
    """Markdown: one line per (variant and its attention config, step, layer), each column `mean ± std` over the
    seeds, and the rollout."""
    names = _group_names(rows)
    groups: dict = {}
    for r in rows:
        name = names[(_mechanism(r), json.dumps(r.get("attention"), sort_keys=True))]
        groups.setdefault((name, r["step"]), []).append(r)
    lines = []
    for (variant, step), rs in sorted(groups.items(), key=lambda kv: kv[0]):
        for i in range(len(rs[0]["layers"])):
            layer = [r["layers"][i] for r in rs]
            cells = []
            for col in COLUMNS:
                vals = [x[col] for x in layer if x.get(col) is not None]
                if vals:
                    cells.append(f"{col} {np.mean(vals):.3g} ± {np.std(vals):.2g}")
            rolls = [r["rollout"] for r in rs if r.get("rollout")]
            if rolls and i == len(rs[0]["layers"]) - 1:
                cells.append(f"rollout {np.mean([x['rollout'] for x in rolls]):.3g} (uniform "
                             f"{np.mean([x['rollout_uniform'] for x in rolls]):.3g})")
            lines.append(f"| {variant} | {step} | {i} | {len(rs)} | " + "; ".join(cells) + " |")
    head = ["| variant | step | layer | seeds | means over examples, pairs and heads (± std over seeds) |",
            "|---|---|---|---|---|"]
    return "\n".join([*head, *lines])


if __name__ == "__main__":
    main()
