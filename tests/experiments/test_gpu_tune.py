"""experiments/gpu/tune.py on CPU (--dry-run: interpret mode, tiny sizes): rows as measured, the markdown's pick,
a spent budget, and the GPU candidates (default first, every one within shared memory)."""

import json

from experiments.gpu import tune as gpu_tune
from sparse_attn.kernels import BlockSizes, smem


def test_gpu_candidates_start_at_the_default_and_fit_shared_memory():
    for d in (64, 128):
        c = gpu_tune.candidates(d)
        assert c[0] == BlockSizes.default("triton", d) and len(c) == len(set(c)) >= 5
        assert all(smem.fits(b, d, 2) for b in c)


def test_dry_run_rows_and_markdown(tmp_path):
    rows = gpu_tune.main(["--dry-run", "--out", str(tmp_path)])
    assert rows == [json.loads(line) for line in (tmp_path / "gpu_tune.jsonl").read_text().splitlines()]
    assert [(r["method"], r["mode"]) for r in rows] == [(m, mode) for mode in ("fwd", "fwd+bwd")
                                                        for m in ("cudnn_dense", "tune_dense", "tune_dense")]
    assert all(r["ms"] > 0 and r["pairs"] == 128 * 128 and r["commit"] for r in rows)
    assert [r["blocks"]["block_q"] for r in rows if r["method"] == "tune_dense"] == [32, 16, 32, 16]
    md = (tmp_path / "gpu_tune.md").read_text()
    assert md.count("Fastest: fwd ") == 2 and md.count("| tune_dense |") == 4
    spent = gpu_tune.main(["--dry-run", "--out", str(tmp_path / "spent"), "--budget-s", "0"])
    assert len(spent) == 6 and all(r["skipped"] == "time budget" for r in spent)
