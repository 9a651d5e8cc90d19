"""experiments/gpu/check.py on CPU (--dry-run: interpret mode, tiny sizes): the JSONL row schema, skipped rows
when the budget runs out, abandoned compiles recorded as errors, and one correctness row against the fp64 oracle."""

from __future__ import annotations

import json

import jax.numpy as jnp
import pytest

from experiments.gpu import check as gpu_check
from experiments.gpu import measure, methods

COMMON = {"commit", "device", "jax", "date"}
TIMED = {"method", "n", "d", "mode", "dtype", "ms", "tflops", "pairs", "first_call_s"} | COMMON
SKIPPED = {"method", "n", "d", "mode", "dtype", "skipped"} | COMMON
ERROR = {"method", "n", "d", "mode", "dtype", "error"} | COMMON


def _rows(path):
    with open(path / "gpu_check.jsonl") as f:
        return [json.loads(line) for line in f]


def test_timed_rows_are_appended_with_the_issue_schema(tmp_path):
    rows = gpu_check.main(["--dry-run", "--out", str(tmp_path), "--only", "cudnn_dense", "--skip-checks"])
    on_disk = _rows(tmp_path)
    assert on_disk == rows and len(rows) == 4  # fwd, fwd+bwd at the main n and at the one scaling n
    assert [(r["n"], r["mode"]) for r in rows] == [(128, "fwd"), (128, "fwd+bwd"), (256, "fwd"), (256, "fwd+bwd")]
    for r in rows:
        assert set(r) == TIMED, r
        assert r["ms"] > 0 and r["tflops"] > 0 and r["first_call_s"] > 0
        assert r["pairs"] == r["n"] ** 2 and r["mode"] in ("fwd", "fwd+bwd")
    assert (tmp_path / "gpu_check.md").read_text().count("| cudnn_dense |") == 6  # 4 timing rows + 2 scaling ratios
    gpu_check.main(["--dry-run", "--out", str(tmp_path), "--only", "cudnn_dense", "--skip-checks",
                    "--compile-limit-s", "0"])  # fmt: skip
    again = _rows(tmp_path)
    assert again[:4] == rows and len(again) == 8  # appended, never rewritten
    assert all(set(r) == ERROR and "compile exceeded" in r["error"] for r in again[4:])


def test_a_spent_budget_records_every_row_as_skipped(tmp_path):
    rows = gpu_check.main(["--dry-run", "--out", str(tmp_path), "--budget-s", "0"])
    assert rows == _rows(tmp_path)
    assert all(set(r) == SKIPPED and r["skipped"] == "time budget" for r in rows)
    names = {r["method"] for r in rows}
    kinds = ("cudnn_dense", "cudnn_causal", "ours_dense", "ours_window256", "ours_labels", "ours_abca256",
             "ours_causal", "abca_core_default", "labels_core_default", "noncrossing_core_default",
             "moba_core_default", "nsa_core_default", "abca_core_pallas", "labels_core_pallas", "check_causal", "check_bigbird", "check_longformer")  # fmt: skip
    assert set(kinds) <= names
    p = methods.plan(True, 0)
    assert len(rows) == len(measure.check_cases(p)) + sum(
        2 * len(methods.method_list(p, n, d, part)) for n, d, part in gpu_check.passes(p)
    )


def test_correctness_row_matches_the_float64_oracle():
    p = methods.plan(True, None)
    row = measure.check_row(p, "causal", 32, jnp.float32, 120)
    assert row["ok"], row
    assert max(row["max_abs_err"].values()) < 1e-5  # interpret mode on CPU: fp32 dots are exact fp32


def test_dry_run_rows_never_land_in_the_results():
    with pytest.raises(SystemExit, match="scratch"):
        gpu_check.main(["--dry-run"])
