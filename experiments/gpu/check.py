"""One short GPU run (docs/kernels.md): bf16 timings in priority order, then fp32/bf16 correctness, every row
appended to a JSON-lines file the moment it is measured.

Command (one H200, nothing installed: Python 3.12, jax 0.11.2, flax, optax, orbax, chex; about 5 minutes):
    SPARSE_ATTN_COMMIT=<hash> PYTHONPATH=. timeout 420 python3 -m experiments.gpu.check [--out DIR]
        -> appends to DIR/gpu_check.jsonl (default experiments/results/), rewrites DIR/gpu_check.md
    (on a lent machine: --out $OUT, then append $OUT/gpu_check.jsonl to experiments/results/gpu_check.jsonl and
    copy the .md; the commit is passed in because the copy there may have no git)
    python -m experiments.gpu.check --dry-run --out /tmp/x   # CPU, interpret mode, tiny sizes: every code path

Order (whatever does not fit the budget is recorded as a `skipped` row, never silently dropped):
  1. n = 16384, d = 64, then d = 128; B = 1, H = 16 (no GQA), bf16, fwd then fwd+bwd per method:
     cudnn_dense, ours_dense, ours_window256, ours_labels, ours_abca256, ours_causal, ours_labels_bucketed(64),
     cudnn_causal (the kernels on a pattern: `pallas_attention`; `ours_labels_bucketed`: the same labels as a
     `LabelPattern` through "bucketed_pallas", the kernels in bucket-entry space; `..._bucketed64` with 64x64
     tiles), then the registered mechanisms' benchmark cores (`sparse_attn.registry.Mechanism.bench`) as a user
     calls them with `implementation=None` (`<core>_core_default`; the table names what None resolved to):
     `abca_core_*` (`abca_core`, anchors every 256), `labels_core_*` (the label router + hard-phase `label_core`:
     window 1024, 3 of 32 labels), `noncrossing_core_*` (the non-crossing module's `core`: router, diagrams, key
     rows, attention; bidirectional), `moba_core_default` and `nsa_core_default` (the block-selection baselines'
     cores at ~1/18 and ~1/23 of causal dense's pairs: `sparse_attn.mechanisms.moba.bench_config`, `nsa`'s).
  2. The ABCA, label and non-crossing cores' other explicit implementations at d = 64 (`abca_core_pallas`, ...,
     "xla" last).
  3. Scaling, d = 64, n = 65536 and 131072: cudnn_dense, the window/ABCA/label kernels and those three cores (None).
  4. The cores' other implementations at d = 128.
  5. Correctness (a reserved slice of the budget): our kernels fwd+bwd at n = 512 (B=2, H=4, G=2, D=64; one
     fp32 D=128 case) on seven pattern kinds, fp32 and bf16, against a float64 numpy oracle on the host (one
     device compile per case). fp32 must be within 2e-4, bf16 within 3e-2 (absolute, out/dq/dk/dv).

Row (one JSON object per line): method, n, d, mode ("fwd" | "fwd+bwd"), ms, tflops, pairs, first_call_s, dtype,
commit, device, jax, date (the run's start, shared by its rows); `skipped` (why) or `error` instead of ms where
that happened; correctness rows are method "check_<pattern>" with max_abs_err, tol, ok. `pairs`: allowed
(query, key) pairs per (sequence, head) (ABCA core: its stage 1+3 pattern; labels core: the router's hard keys;
non-crossing core: valid key-row slots; MoBA, NSA: their selections). TFLOP/s: 4·d flops per pair and head forward, 3.5x that for fwd+bwd.
`first_call_s`: compile (capped by --compile-limit-s; a compile still running then is abandoned and recorded as
an error) + the first call.

Writes: DIR/gpu_check.jsonl (appended row by row) and DIR/gpu_check.md (--out DIR).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import time
import traceback

import jax
import jax.numpy as jnp

from experiments.gpu import measure
from experiments.gpu.measure import (
    _ABANDONED,
    check_cases,
    check_row,
    time_row,
)
from experiments.gpu.methods import (
    RESULTS,
    SWEPT,
    TARGETS,
    Plan,
    core_impls,
    method_list,
    plan,
)
from sparse_attn.studies import cli
from sparse_attn.studies.runs import git_commit


class Recorder:
    """Appends each row to the JSONL (flushed and fsynced: a killed run keeps what it had) and rewrites the
    markdown table from this run's rows."""

    def __init__(self, out_dir: str, common: dict, p: Plan, name: str = "gpu_check", render=None):
        """`render(rows, common, plan) -> markdown` (default: this module's table) writes `<name>.md`."""
        os.makedirs(out_dir, exist_ok=True)
        self.jsonl = os.path.join(out_dir, f"{name}.jsonl")
        self.md = os.path.join(out_dir, f"{name}.md")
        self.common, self.plan, self.rows, self.render = common, p, [], render or markdown

    def emit(self, row: dict, log) -> dict:
        row = dict(row, **self.common)
        self.rows.append(row)
        with open(self.jsonl, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        with open(self.md, "w") as f:
            f.write(self.render(self.rows, self.common, self.plan))
        log(_describe(row))
        return row


def _describe(r: dict) -> str:
    head = f"{r['method']:24s} n={r['n']:6d} d={r['d']:3d} {r['mode']:7s} {r.get('dtype', ''):8s}"
    if "skipped" in r:
        return f"{head} skipped: {r['skipped']}"
    if "error" in r:
        return f"{head} ERROR {r['error'][:160]}"
    if "ok" in r:
        return f"{head} {'ok' if r['ok'] else 'FAIL'} {r['max_abs_err']}"
    return f"{head} {r['ms']:9.3f} ms {r['tflops'] or 0:7.1f} TF/s first {r['first_call_s']} s"


def passes(p: Plan) -> list[tuple[int, int, str]]:
    """(n, d, part) in priority order: the table's rows at d = 64 then 128, the cores' other implementations at
    d = 64, scaling at d = 64, the other implementations at d = 128."""
    d0, rest = p.head_dims[0], p.head_dims[1:]
    out = [(p.n, d, "main") for d in p.head_dims] + [(p.n, d0, "impls")]
    return out + [(n, d0, "scaling") for n in p.scale_lengths] + [(p.n, d, "impls") for d in rest]


def timings(p: Plan, rec: Recorder, t_start: float, log, only) -> None:
    stop = p.budget_s - p.check_reserve_s
    for n, d, part in passes(p):
        ks = jax.random.split(jax.random.key(d), 3)
        qkv = None
        for name, build in method_list(p, n, d, part):
            if only and not any(name.startswith(o) for o in only):
                continue
            method = None
            for mode in ("fwd", "fwd+bwd"):
                row = dict(method=name, n=n, d=d, mode=mode, dtype="bfloat16")
                left = stop - (time.perf_counter() - t_start)
                if left <= 0:
                    rec.emit(dict(row, skipped="time budget"), log)
                    continue
                try:
                    if qkv is None:
                        qkv = [jax.random.normal(x, (1, n, p.heads, d), jnp.float32).astype(jnp.bfloat16) for x in ks]
                    method = method or build()
                    res = time_row(method, mode, qkv, p, min(p.compile_limit_s, left))
                    pairs = method.pairs if method.pairs is not None else res.pop("pairs", None)
                    if pairs is None:  # fwd+bwd of a core whose fwd row did not run: its pairs are unknown
                        pairs = next((r["pairs"] for r in reversed(rec.rows) if r["method"] == name and
                                      r["n"] == n and r["d"] == d and r.get("pairs") is not None), None)  # fmt: skip
                    flops = 4.0 * d * pairs * p.heads * (1.0 if mode == "fwd" else 3.5) if pairs else None
                    tflops = flops / (res["ms"] * 1e-3) / 1e12 if flops else None
                    rec.emit(dict(row, ms=res["ms"], tflops=tflops, pairs=pairs, first_call_s=res["first_call_s"]),
                             log)  # fmt: skip
                except Exception as e:  # noqa: BLE001  (a failure is a result)
                    rec.emit(dict(row, error=f"{type(e).__name__}: {str(e)[:400]}"), log)


def correctness(p: Plan, rec: Recorder, t_start: float, log, only) -> None:
    for name, d, dtype in check_cases(p):
        if only and not any(f"check_{name}".startswith(o) for o in only):
            continue
        row = dict(method=f"check_{name}", n=p.check_n, d=d, mode="fwd+bwd", dtype=jnp.dtype(dtype).name)
        left = p.budget_s - (time.perf_counter() - t_start)
        if left <= 0:
            rec.emit(dict(row, skipped="time budget"), log)
            continue
        try:
            rec.emit(dict(row, **check_row(p, name, d, dtype, min(p.compile_limit_s, left))), log)
        except Exception as e:  # noqa: BLE001
            rec.emit(dict(row, ok=False, error=f"{type(e).__name__}: {str(e)[:400]}"), log)


# -- markdown ---------------------------------------------------------------------------------------------------


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def markdown(rows: list[dict], common: dict, p: Plan) -> str:
    lines = [f"# GPU check: {common['device']}, jax {common['jax']}, commit {common['commit']}, {common['date']}", "",
             "Command: `SPARSE_ATTN_COMMIT=<hash> PYTHONPATH=. timeout 420 python3 -m experiments.gpu.check` "
             f"(B=1, H={p.heads}, bf16; rows also in gpu_check.jsonl). Speed-up: cuDNN dense ms / ms at the same "
             "n, d, mode; pair ratio: cuDNN dense pairs / pairs; rate: TFLOP/s / cuDNN dense TFLOP/s.", ""]  # fmt: skip
    timed = [r for r in rows if not r["method"].startswith("check_")]
    base = {(r["n"], r["d"], r["mode"]): r for r in timed if r["method"] == "cudnn_dense" and "ms" in r}
    defaults = {m: core_impls(m)[0] for m in SWEPT}
    for n, d, mode in dict.fromkeys((r["n"], r["d"], r["mode"]) for r in timed):
        b = base.get((n, d, mode))
        lines += [f"## n = {n}, d = {d}, {mode}", "",
                  "| method | ms | TFLOP/s | rate / cuDNN | speed-up vs cuDNN dense | target | pair ratio | "
                  "first call s |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in (r for r in timed if (r["n"], r["d"], r["mode"]) == (n, d, mode)):
            name = r["method"]
            mech = name.split("_core_")[0] if "_core_" in name else None
            label = f"{name} (= {defaults[mech]})" if mech in defaults and name.endswith("_default") else name
            if "ms" not in r:
                lines.append(f"| {label} | {r.get('skipped') or r.get('error', '')[:80]} | | | | | | |")
                continue
            speed = b["ms"] / r["ms"] if b else None
            rate = r["tflops"] / b["tflops"] if b and r["tflops"] and b["tflops"] else None
            ratio = b["pairs"] / r["pairs"] if b and r.get("pairs") else None
            target = TARGETS.get(f"{mech}_core" if mech else name)
            lines.append(f"| {label} | {r['ms']:.3f} | {_fmt(r['tflops'], '.1f')} | {_fmt(rate, '.2f')} | "
                         f"{_fmt(speed, '.2f')}x | {'' if target is None else f'>= {target}x'} | "
                         f"{_fmt(ratio, '.1f')} | {r['first_call_s']} |")  # fmt: skip
        lines.append("")
    scale = [r for r in timed if "ms" in r and r["n"] != p.n and r["d"] == p.head_dims[0]]
    if scale:
        lines += [f"## Scaling: time(n) / time({p.n}), d = {p.head_dims[0]}", "", "| method | mode | n | ratio |",
                  "|---|---|---|---|"]  # fmt: skip
        ref = {(r["method"], r["mode"]): r["ms"] for r in timed if "ms" in r and r["n"] == p.n}
        for r in scale:
            base_ms = ref.get((r["method"], r["mode"]))
            lines.append(f"| {r['method']} | {r['mode']} | {r['n']} | "
                         f"{_fmt(r['ms'] / base_ms if base_ms else None, '.2f')} |")  # fmt: skip
        lines.append("")
    checks = [r for r in rows if r["method"].startswith("check_")]
    if checks:
        lines += [f"## Correctness: our kernels fwd+bwd vs a float64 oracle (n = {p.check_n}, B=2, H=4, G=2)", "",
                  "| pattern | d | dtype | ok | max abs err (out, dq, dk, dv) | tol | first call s |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in checks:
            why = r.get("skipped") or r.get("error", "")[:80]
            errs = ", ".join(f"{e:.1e}" for e in r["max_abs_err"].values()) if "max_abs_err" in r else why
            lines.append(f"| {r['method'][6:]} | {r['d']} | {r['dtype']} | {r.get('ok', '-')} | {errs} | "
                         f"{r.get('tol', '-')} | {r.get('first_call_s', '-')} |")  # fmt: skip
    return "\n".join(lines) + "\n"


@cli.entry_point
def main(argv=None) -> list[dict]:
    t_start = time.perf_counter()
    ap = cli.ArgumentParser(__doc__)
    measure.add_run_args(ap, out=RESULTS)
    ap.add_argument("--check-reserve-s", type=float, help="seconds of the budget kept for correctness (default 70)")
    ap.add_argument("--only", nargs="+", help="run only rows whose method starts with one of these")
    ap.add_argument("--skip-checks", action="store_true", help="timings only")
    args = ap.parse_args(argv)
    p = plan(args.dry_run, args.budget_s)
    if args.check_reserve_s is not None:
        p = dataclasses.replace(p, check_reserve_s=args.check_reserve_s)
    if args.compile_limit_s is not None:
        p = dataclasses.replace(p, compile_limit_s=args.compile_limit_s)
    log = lambda s: print(f"[{time.perf_counter() - t_start:6.1f}s] {s}", flush=True)  # noqa: E731
    measure.require_gpu(args.dry_run)
    if args.dry_run and os.path.abspath(args.out) == os.path.abspath(RESULTS):
        raise SystemExit("--dry-run rows are not results: pass --out to a scratch directory")
    dev = jax.devices()[0]
    common = dict(commit=git_commit(), device=dev.device_kind, jax=jax.__version__,
                  date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))  # fmt: skip
    rec = Recorder(args.out, common, p)
    log(f"device {dev.device_kind} ({jax.default_backend()}), commit {common['commit']}, budget {p.budget_s:.0f} s")
    try:
        timings(p, rec, t_start, log, args.only)
        if not args.skip_checks:
            correctness(p, rec, t_start, log, args.only)
    except Exception:  # noqa: BLE001  (rows so far are on disk; say what broke)
        log(traceback.format_exc()[-2000:])
    log(f"{len(rec.rows)} rows -> {rec.jsonl}, {rec.md}")
    return rec.rows


if __name__ == "__main__":
    main()
    if any(t.is_alive() for t in _ABANDONED):  # rows are on disk: don't wait for an abandoned compile
        os._exit(0)
