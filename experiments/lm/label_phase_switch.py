"""Label attention at a phase switch: one checkpoint's parameters evaluated in several phases on the same batches
(docs/labels.md, "Phase transitions: why the switch still jumped").

    python -m experiments.lm.label_phase_switch --workdir runs/lab_smoke_labels_defaults --checkpoint 120 \
        --steps 71 72 100 119 120 192 --batches 120 128 --out experiments/results/labels_phases_probe.json

For each `--steps` value s the model runs the forward of train step s (its phase, τ and ramp weight) with the
checkpoint's parameters on the training batches of steps [`--batches`) and on the validation batches: nll, the
weight on edges the hard pattern drops, and hard keys per query. The same parameters in two phases separate a jump
in the forward (the pattern changes) from one in the optimisation after the switch.

Writes: nothing; prints the loss of each phase variant at the checkpoint.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from experiments.lm import configs as lm_configs
from sparse_attn.data.iterators import RandomWindows, eval_batches
from sparse_attn.models.transformer import TransformerLM
from sparse_attn.modules.labels.config import MOVED, instead_of
from sparse_attn.studies import cli
from sparse_attn.train import checkpoint
from sparse_attn.train import mesh as mesh_lib
from sparse_attn.train import state as state_lib


def restored(config: lm_configs.LMConfig, workdir: str, step: int, num_steps: int):
    """(graphdef, params, rest) of `workdir`'s checkpoint at `step`, the label layers fitted to `num_steps`."""

    def make(rngs):
        model = TransformerLM(config.model, rngs=rngs)
        for _, module in nnx.iter_modules(model):
            if callable(getattr(module, "fit_schedule", None)):
                module.fit_schedule(num_steps)
        return model

    tc = config.train
    manager = checkpoint.make_manager(workdir, tc)
    try:
        steps = sorted(manager.all_steps())
        if step not in steps:
            raise FileNotFoundError(f"no checkpoint step {step} in {workdir!r} (--checkpoint); it holds "
                                    f"{', '.join(map(str, steps)) if steps else 'none'}")
        tx = state_lib.make_optimizer(tc)
        shapes, shardings = state_lib.abstract_state(make, tx, tc, mesh_lib.make_mesh(tc))
        state, _ = checkpoint.restore(manager, state_lib.with_shardings(shapes, shardings), step)
    finally:
        manager.close()
    return state_lib.graphdef_of(make), state.params, state.rest


def parse_overrides(items: list[str]) -> dict:
    """`--label KEY=VALUE ...` as a dict of Python literals (KEY a field of the label config, or `group.field` of
    one of its groups: `router.freeze_when_hard=False`); a malformed item is a ValueError naming it."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            if not (sep and key):
                raise ValueError
            overrides[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise ValueError(f"--label {item!r}: expected KEY=VALUE with a Python literal value, e.g. "
                             "ramp_thinning=False") from None
    return overrides


def replaced(config, overrides: dict):
    """`dataclasses.replace(config, ...)` with `overrides`, whose `group.field` keys change a field of the group
    (a nested config) and keep its other fields; an unknown field is a ValueError naming it."""
    top, nested = {}, {}
    for key, value in overrides.items():
        head, _, rest = key.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            top[key] = value
    fields = {f.name for f in dataclasses.fields(config)}
    labels = getattr(config, "mechanism", None) == "labels"  # the label config (not a group of it)
    for name in sorted(set(top) | set(nested)):
        if name not in fields:
            if labels and name in MOVED:  # an earlier version's flat field
                raise ValueError(f"{type(config).__name__} has no field {name}: use --label "
                                 f"{'.'.join(MOVED[name])}=...")
            hint = instead_of(name) if labels else None
            raise ValueError(f"{type(config).__name__} has no field {name}" +
                             (f": use {hint}" if hint else f"; its fields: {', '.join(sorted(fields))}"))
    for head, changes in nested.items():
        group = getattr(config, head)
        if not dataclasses.is_dataclass(group):
            raise ValueError(f"{type(config).__name__}.{head} is not a group of fields (--label {head}.…)")
        top[head] = replaced(group, changes)
    return dataclasses.replace(config, **top)


def with_label_overrides(config: lm_configs.LMConfig, overrides: dict) -> lm_configs.LMConfig:
    """`config` with every label layer's config `replaced` by `overrides`."""
    change = lambda att: replaced(att, overrides) if getattr(att, "mechanism", None) == "labels" else att  # noqa: E731
    att = config.model.attention
    att = tuple(map(change, att)) if isinstance(att, tuple) else change(att)
    return dataclasses.replace(config, model=dataclasses.replace(config.model, attention=att))


@cli.entry_point
def main(argv=None):
    parser = cli.ArgumentParser(__doc__)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--config", choices=sorted(lm_configs.CONFIGS), default="smoke_labels",
                        help="the run's config (ignored with --label, which rebuilds smoke_labels)")
    parser.add_argument("--label", nargs="*", default=[], metavar="KEY=VALUE",
                        help="smoke_labels overrides of the label config, e.g. ramp_thinning=False "
                             "router.freeze_when_hard=False")
    parser.add_argument("--checkpoint", type=int, required=True)
    parser.add_argument("--steps", type=int, nargs="+", required=True)
    parser.add_argument("--batches", type=int, nargs=2, required=True, help="training batches [start, stop)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    overrides = parse_overrides(args.label)
    config = with_label_overrides(lm_configs.smoke_labels(), overrides) if overrides else \
        lm_configs.CONFIGS[args.config]()
    if not os.path.isdir(args.workdir):
        raise FileNotFoundError(f"no run directory {args.workdir!r} (--workdir: a label LM run, e.g. of "
                                "`python -m experiments.lm --config smoke_labels`)")
    if not os.path.isdir(os.path.join(args.workdir, "checkpoints")):  # checked here: the manager would create it
        raise FileNotFoundError(f"{args.workdir!r} holds no checkpoints/ directory (was it trained?)")

    tc = config.train
    graphdef, params, rest = restored(config, args.workdir, args.checkpoint, tc.num_steps)

    @jax.jit
    def forward(params, rest, batch, step):
        model = nnx.merge(graphdef, params, rest)
        model.eval()
        out = model(batch["inputs"], step=step)
        nll = optax.softmax_cross_entropy_with_integer_labels(out.logits.astype(jnp.float32), batch["targets"])
        return jnp.mean(nll, axis=-1), out.stats  # per-sequence nll

    corpus = config.data.load()
    windows = RandomWindows(corpus.train_U8, global_batch=tc.global_batch, seq_len=tc.seq_len, seed=tc.seed)
    windows.set_state({"seed": tc.seed, "step": args.batches[0]})
    train = [next(windows) for _ in range(*args.batches)]
    valid = list(eval_batches(corpus.valid_U8, global_batch=tc.global_batch, seq_len=tc.seq_len,
                              num_batches=tc.eval_batches))
    results = {}
    for s in args.steps:
        row = {}
        for split, batches in (("train", train), ("valid", valid)):
            nll, stats = [], []
            for batch in batches:
                n, st = forward(params, rest, batch, jnp.int32(s))
                nll.append(np.asarray(n))
                stats.append({k: float(v) for k, v in st.items()})
            nll = np.concatenate(nll)
            row[split] = dict(nll=float(nll.mean()), nll_per_seq=nll.tolist())
            for name in sorted(stats[0]):
                if name.endswith(("dropped_mass", "mean_degree", "phase", "hard_weight", "tau")):
                    row[split][name] = float(np.mean([st[name] for st in stats]))
        results[s] = row
        tr = row["train"]
        print(f"step {s}: train nll {tr['nll']:.4f}, valid nll {row['valid']['nll']:.4f}",
              {k: round(v, 4) for k, v in tr.items() if k.startswith("layer")}, flush=True)
    # Paired differences (same sequences): the forward's change between consecutive probed steps.
    pairs = {}
    for a, b in itertools.pairwise(args.steps):
        d = np.asarray(results[b]["train"]["nll_per_seq"]) - np.asarray(results[a]["train"]["nll_per_seq"])
        pairs[f"{a}->{b}"] = dict(mean=float(d.mean()), sem=float(d.std(ddof=1) / np.sqrt(d.size)))
        print(f"train nll {a} -> {b}: {d.mean():+.4f} ± {d.std(ddof=1) / np.sqrt(d.size):.4f} (paired, sem)")
    with open(args.out, "w") as f:
        json.dump(dict(args=vars(args), steps=results, paired=pairs), f, indent=1)


if __name__ == "__main__":
    main()
