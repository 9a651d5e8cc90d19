"""Everything GPU-specific in one device call: kernel timings and correctness, passkey at 1k-16k, the full-scale LM
and classification cells, the tile sweep, one after another under one wall-clock budget, packed for the trip back.

On a lent machine (one `run` call with timeout_s 600; nothing to install there):
    SPARSE_ATTN_COMMIT=<hash> PYTHONPATH=. PYTHONUNBUFFERED=1 \\
        python3 -m experiments.gpu.session --budget 540 --out "$OUT"
Back here, with the folder the device tool returned the files to:
    python -m experiments.gpu.session --unpack <files_at>/gpu_session.tar.gz
    python -m experiments.reports.results     # re-render docs/results.md (classification, LM, retrieval)
Without a GPU:
    python -m experiments.gpu.session --plan          # the stages, their seconds and commands; runs nothing
    python -m experiments.gpu.session --rehearse --budget 600 --out /tmp/rehearsal   # every stage's CPU mode

Why one script: a lent session has ~15 minutes of device time in all, a machine start costs a minute or more of
it, and the device returns at most 8 files from $OUT. So the stages share one budget and their outputs travel
as one archive (`gpu_session.tar.gz`) beside a summary (`gpu_session.md`) and the whole log (`gpu_session.log`).

Budget: each stage is allotted its share of `--budget` plus what the stages before it left unused, and gets
that as its own budget flag less a margin for start-up and its last row (so the stages end themselves); a hard
limit of allotment + `GRACE_S` then kills the stage's whole process group (the retrieval, LM and classification
stages run their cells as subprocesses, which must not outlive it). The archive is rewritten after every stage, so
a call cut by the device's own limit still returns what the finished stages measured.

Continuation: the retrieval, LM and classification stages start from the GPU rows already committed in
experiments/results/ (the `gpu` rows of `retrieval.jsonl`, `lm_gpu.jsonl`, the `seed` rows of `<task>.jsonl`) and
skip those cells, so each lent session runs the next cells of their plans. `--unpack` appends only lines not
already present.

Writes: $OUT/gpu_session.tar.gz (every stage's outputs), gpu_session.md (a summary) and gpu_session.log;
--unpack appends new rows to experiments/results/.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable

from sparse_attn.studies import cli
from sparse_attn.studies.runs import git_commit

RESULTS_DIR = os.path.join("experiments", "results")
TASKS = ("listops", "dyck", "pathfinder")
GRACE_S = 20.0  # past a stage's allotment before its process group is killed
PACK_S = 15.0  # kept at the end of the budget for the last archive


@dataclasses.dataclass(frozen=True)
class Stage:
    """One GPU script run as `python -m module argv(stage_dir, seconds)`.

    seconds: its share of a 540 s budget (scaled to the budget given). margin_s: subtracted from the allotment
    for the script's own budget flag (start-up, a last row or cell that overruns). merge: files of the stage dir
    whose new lines are appended to the repo file of the same name under experiments/results/ by `--unpack`
    (`seeded`: the repo file's matching lines are copied in first, so finished cells are skipped).
    """

    name: str
    module: str
    seconds: float
    margin_s: float
    argv: Callable[[str, float], list[str]]
    merge: tuple[str, ...] = ()
    seeded: bool = False
    env: tuple[tuple[str, str], ...] = ()
    rehearse: tuple[str, ...] = ()  # appended under --rehearse: the script's CPU mode at tiny sizes


# The LM and classification parents start cells in subprocesses: no process may take the GPU's memory up front.
_NO_PREALLOC = (("XLA_PYTHON_CLIENT_PREALLOCATE", "false"),)

STAGES = (
    Stage("check", "experiments.gpu.check", 120, 35,
          lambda d, s: ["--budget-s", f"{s:.0f}", "--check-reserve-s", "45", "--out", d],
          merge=("gpu_check.jsonl",), rehearse=("--dry-run",)),
    # Passkey at 1k-16k (the CPU ran 256 and 512): the 2 x 128 model, 2000 steps a cell (retrieval.GRIDS["gpu"]).
    Stage("retrieval", "experiments.retrieval", 150, 20,
          lambda d, s: ["--grid", "gpu", "--config", "gpu", "--total_s", f"{s:.0f}", "--time_limit", f"{s:.0f}",
                        "--min_cell_s", "45", "--results", os.path.join(d, "retrieval.jsonl"),
                        "--runs_dir", os.path.join(tempfile.gettempdir(), "gpu_session_retrieval")],
          merge=("retrieval.jsonl",), seeded=True, env=_NO_PREALLOC,
          rehearse=("--grid", "smoke", "--config", "smoke")),
    # One cell may use the stage's whole time, and none starts with less than 90 s (compile, 150 steps, the
    # evaluation and a checkpoint of an 85M model); cut cells cannot resume in a later session (runs in /tmp).
    Stage("lm", "experiments.gpu.lm", 130, 30,
          lambda d, s: ["--total_s", f"{s:.0f}", "--cell_s", f"{s:.0f}", "--min_cell_s", "90",
                        "--results", os.path.join(d, "lm_gpu.jsonl"),
                        "--runs_dir", os.path.join(tempfile.gettempdir(), "gpu_session_lm")],
          merge=("lm_gpu.jsonl",), seeded=True, env=_NO_PREALLOC, rehearse=("--tiny",)),
    Stage("classify", "experiments.gpu.classify", 125, 25,
          lambda d, s: ["--budget", f"{s:.0f}", "--num_steps", "300", "--out", d,
                        "--runs_dir", os.path.join(tempfile.gettempdir(), "gpu_session_classify")],
          merge=tuple(f"{t}.jsonl" for t in TASKS), seeded=True, env=_NO_PREALLOC,
          rehearse=("--config", "smoke", "--num_steps", "2", "--seeds", "0")),
    # Mask functions on the kernels (stored partial-tile masks) against the hand-built patterns and dense.
    Stage("mask_fn", "experiments.benchmarks.mask_fn", 45, 10,
          lambda d, s: ["--build-n", "16384", "131072", "--n", "16384", "--impl", "pallas", "--out-dir", d,
                        "--tag", "gpu_mask_fn"],
          rehearse=("--build-n", "256", "--n", "512")),
    # No share of its own: the tile sweep runs on what the stages before it left unused.
    Stage("tune", "experiments.gpu.tune", 0, 25,
          lambda d, s: ["--budget-s", f"{s:.0f}", "--out", d], merge=("gpu_tune.jsonl",), rehearse=("--dry-run",)),
)

# The configs of the rows the GPU stages write (classify: full; LM: gpu_full; retrieval: gpu).
GPU_CONFIGS = ("full", "gpu_full", "gpu")

# What the stages import; a missing one is named in the log and the summary before anything runs.
NEEDED = ("jax", "flax", "optax", "orbax.checkpoint", "numpy", "tqdm", "matplotlib")


def allot(stages, budget_s: float) -> dict[str, float]:
    """Each stage's share of `budget_s - PACK_S`, proportional to its `seconds` (equal shares when every stage
    run has none, e.g. `--stages tune`)."""
    weights = [s.seconds for s in stages] if any(s.seconds for s in stages) else [1.0] * len(stages)
    usable = max(budget_s - PACK_S, 0.0)
    return {s.name: usable * w / sum(weights) for s, w in zip(stages, weights, strict=True)}


def committed_rows(stage: Stage, stage_dir: str, results_dir: str) -> int:
    """Copy the committed full-scale rows of the stage's result files into its dir; returns how many."""
    count = 0
    for name in stage.merge if stage.seeded else ():
        src = os.path.join(results_dir, name)
        if not os.path.exists(src):
            continue
        with open(src) as f:
            lines = [line for line in f if _is_gpu_row(line)]
        with open(os.path.join(stage_dir, name), "a") as f:
            f.writelines(lines)
        count += len(lines)
    return count


def _is_gpu_row(line: str) -> bool:
    """Rows of the full-scale configs (the CPU grid's rows share the task files)."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return False
    return isinstance(row, dict) and row.get("config") in GPU_CONFIGS


def run_stage(argv: list[str], limit_s: float, log_file, env: dict) -> tuple[int, float]:
    """Run `python -m ...argv` in its own process group; past `limit_s` the group gets SIGTERM, then SIGKILL
    5 s later. Returns (exit status or 124 on a timeout, seconds)."""
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", *argv], stdout=log_file, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    try:
        rc = proc.wait(timeout=max(limit_s, 0.1))
    except subprocess.TimeoutExpired:
        rc = 124
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
    _kill_group(proc.pid)  # cells the stage left behind (it exited, its children may not have)
    return rc, time.monotonic() - t0


def _kill_group(pgid: int, wait_s: float = 10.0) -> None:
    """SIGKILL the group and wait until it is gone, so the next stage finds the GPU's memory free."""
    deadline = time.monotonic() + wait_s
    try:
        os.killpg(pgid, signal.SIGKILL)
        while time.monotonic() < deadline:
            time.sleep(0.1)
            os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        pass


def pack(work_dir: str, out: str, records: list[dict], meta: dict) -> None:
    """Write `<out>/gpu_session.md` and `<out>/gpu_session.tar.gz` (the stage dirs) atomically."""
    with open(os.path.join(work_dir, "session.json"), "w") as f:
        json.dump({**meta, "stages": records}, f, indent=1)
    tmp = os.path.join(out, "gpu_session.tar.gz.tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(work_dir, arcname="gpu_session")
    os.replace(tmp, os.path.join(out, "gpu_session.tar.gz"))
    with open(os.path.join(out, "gpu_session.md"), "w") as f:
        f.write(summary(records, meta))


def summary(records: list[dict], meta: dict) -> str:
    lines = [f"# GPU session {meta['date']} (commit {meta['commit']}, {meta['device']}, jax {meta['jax']})", "",
             f"`{meta['command']}`: budget {meta['budget_s']:.0f} s, took {meta.get('took_s', 0):.0f} s; "
             f"missing modules: {', '.join(meta.get('missing_modules') or ['none'])}.", "",
             "| stage | allotted s | took s | exit | command |", "|---|---|---|---|---|"]
    for r in records:
        exit_ = r.get("status", r["rc"])
        lines.append(f"| {r['stage']} | {r['allotted_s']:.0f} | {r['took_s']:.0f} | {exit_} | `{r['command']}` |")
    return "\n".join(lines) + "\n"


def missing_modules(names=NEEDED) -> list[str]:
    out = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a missing parent package
            found = False
        if not found:
            out.append(name)
    return out


def _device() -> tuple[str, str]:
    """(GPU name, jax version) without starting a JAX backend here: a backend in this process would take the
    GPU's memory up front for the whole session."""
    try:
        name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], check=False,
                              capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        name = "no nvidia-smi"
    try:
        version = importlib.metadata.version("jax")
    except importlib.metadata.PackageNotFoundError:
        version = "not installed"
    return name, version


def run_session(stages, *, budget_s: float, out: str, results_dir: str = RESULTS_DIR, commit: str,
                command: str = "", rehearse: bool = False, device=_device, log=print) -> list[dict]:
    """Run `stages` in order within `budget_s`; returns one record per stage (also in the archive).
    `rehearse`: every stage in its CPU mode (its rows are not results: `unpack` refuses the archive)."""
    os.makedirs(out, exist_ok=True)
    work_dir = tempfile.mkdtemp(prefix="gpu_session_")
    t_start = time.monotonic()
    kind, jax_version = device()
    meta = dict(commit=commit, device=kind, jax=jax_version, budget_s=budget_s, command=command, rehearsal=rehearse,
                missing_modules=missing_modules(), date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    if meta["missing_modules"]:
        log(f"missing modules (the stages that import them will fail): {meta['missing_modules']}")
    env = dict(os.environ, SPARSE_ATTN_COMMIT=commit, PYTHONUNBUFFERED="1")
    if not rehearse:  # a stage whose CUDA fails to load must fail, not train on the host's CPU as "full" rows
        env["JAX_PLATFORMS"] = "cuda"
    shares, carry, records = allot(stages, budget_s), 0.0, []
    with open(os.path.join(out, "gpu_session.log"), "a") as log_file:
        for stage in stages:
            stage_dir = os.path.join(work_dir, stage.name)
            os.makedirs(stage_dir, exist_ok=True)
            left = budget_s - PACK_S - (time.monotonic() - t_start)
            allotted = min(shares[stage.name] + carry, left)
            own = allotted - stage.margin_s
            argv = [stage.module, *stage.argv(stage_dir, own), *(stage.rehearse if rehearse else ())]
            record = dict(stage=stage.name, allotted_s=round(allotted, 1), command="python -m " + " ".join(argv),
                          seeded_rows=committed_rows(stage, stage_dir, results_dir), rc=None, took_s=0.0)
            if own < 10:
                record["status"] = "skipped (no time left)"
            else:
                log_file.write(f"\n===== {stage.name}: {record['command']} (limit {allotted + GRACE_S:.0f} s)\n")
                log_file.flush()
                rc, took = run_stage(argv, allotted + GRACE_S, log_file, dict(env, **dict(stage.env)))
                record.update(rc=rc, took_s=round(took, 1), status={0: "ok", 124: "killed at its limit"}.get(
                    rc, f"exit {rc}"))
            carry = max(allotted - record["took_s"], 0.0)
            records.append(record)
            log(f"{stage.name:9s} {record['status']:24s} {record['took_s']:6.0f} of {allotted:4.0f} s")
            pack(work_dir, out, records, dict(meta, took_s=time.monotonic() - t_start))
    shutil.rmtree(work_dir, ignore_errors=True)
    return records


def unpack(archive: str, results_dir: str = RESULTS_DIR, stages=STAGES, log=print) -> dict[str, int]:
    """Append the archive's new result lines to experiments/results/ and copy its reports there; returns the
    number of lines appended per repo file."""
    appended = {}
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        root = os.path.join(tmp, "gpu_session")
        with open(os.path.join(root, "session.json")) as f:
            if json.load(f).get("rehearsal"):
                raise ValueError(f"{archive} is a --rehearse archive (CPU, tiny sizes): its rows are not results")
        for stage in stages:
            for name in stage.merge:
                src = os.path.join(root, stage.name, name)
                if os.path.exists(src):
                    appended[name] = appended.get(name, 0) + _append_new(src, os.path.join(results_dir, name))
        reports = {os.path.join("check", "gpu_check.md"): "gpu_check.md",
                   os.path.join("tune", "gpu_tune.md"): "gpu_tune.md",
                   os.path.join("classify", "results.md"): "gpu_classify.md", "session.json": "gpu_session.json",
                   os.path.join("mask_fn", "gpu_mask_fn.md"): "gpu_mask_fn.md",
                   os.path.join("mask_fn", "gpu_mask_fn.json"): "gpu_mask_fn.json"}
        for src, dst in reports.items():
            if os.path.exists(os.path.join(root, src)):
                shutil.copyfile(os.path.join(root, src), os.path.join(results_dir, dst))
    for name, count in appended.items():
        log(f"{count:4d} new lines -> {os.path.join(results_dir, name)}")
    return appended


def _append_new(src: str, dst: str) -> int:
    have = set()
    if os.path.exists(dst):
        with open(dst) as f:
            have = {line.rstrip("\n") for line in f}
    with open(src) as f:
        new = [line.rstrip("\n") for line in f if line.strip() and line.rstrip("\n") not in have]
    if new:
        with open(dst, "a") as f:
            f.write("".join(line + "\n" for line in new))
    return len(new)


@cli.entry_point
def main(argv=None):
    parser = cli.ArgumentParser(__doc__)
    parser.add_argument("--budget", type=float, default=540, help="seconds for every stage and the archive")
    parser.add_argument("--out", default=os.environ.get("OUT"), help="where the archive, summary and log go")
    parser.add_argument("--stages", default=",".join(s.name for s in STAGES),
                        help="comma-separated, in the order to run (default: all)")
    parser.add_argument("--commit", default=os.environ.get("SPARSE_ATTN_COMMIT"),
                        help="recorded in every row (default $SPARSE_ATTN_COMMIT, else git)")
    parser.add_argument("--plan", action="store_true", help="print the stages and their commands; run nothing")
    parser.add_argument("--rehearse", action="store_true",
                        help="run every stage in its CPU mode at tiny sizes (checks the glue; rows are not results)")
    parser.add_argument("--unpack", metavar="TAR_GZ", help="merge a returned archive into experiments/results/")
    args = parser.parse_args(argv)
    if args.unpack:
        try:
            return unpack(args.unpack)
        except ValueError as e:
            parser.error(str(e))
    by_name = {s.name: s for s in STAGES}
    unknown = [n for n in args.stages.split(",") if n not in by_name]
    if unknown:
        parser.error(f"--stages: unknown {unknown}; choose from {sorted(by_name)}")
    stages = [by_name[n] for n in args.stages.split(",")]
    if args.plan:
        for stage, seconds in allot(stages, args.budget).items():
            st = by_name[stage]
            own = seconds - st.margin_s
            print(f"{stage:9s} {seconds:5.0f} s (+ unused before it)  python -m {st.module} "
                  + " ".join(st.argv("<dir>", own)) + ("  [runs only on time left unused]" if own < 10 else ""))
        return None
    if not args.out:
        parser.error("--out is required (or $OUT)")
    command = "python -m experiments.gpu.session " + " ".join(argv if argv is not None else sys.argv[1:])
    return run_session(stages, budget_s=args.budget, out=args.out, commit=args.commit or git_commit(),
                       command=command, rehearse=args.rehearse)


if __name__ == "__main__":
    main()
