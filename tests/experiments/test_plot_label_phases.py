"""plot_label_phases' paired statistic over seeds recovers a known step at a phase switch and none elsewhere."""

import json
import os

import numpy as np
import pytest

from experiments.reports import label_phases as plp
from sparse_attn.train.reporting import METRICS_FILE

STEPS, SWITCHES = 240, {1: 72, 2: 120, 3: 192}  # phase index -> first step


def _write_run(workdir, loss, with_phases, valid):
    os.makedirs(workdir)
    with open(os.path.join(workdir, METRICS_FILE), "w") as f:
        for s, x in enumerate(loss):
            rec = {"split": "train", "step": s, "nll": float(x), "layer0/keys_per_query": 10.0}
            if with_phases:
                rec["layer0/labels/phase"] = sum(s >= b for b in SWITCHES.values())
            f.write(json.dumps(rec) + "\n")
        f.write(json.dumps({"split": "valid", "step": STEPS, "bits_per_byte": valid}) + "\n")


def test_paired_over_seeds_recovers_a_step_at_the_switch(tmp_path):
    pairs = []
    for seed, step_size in enumerate((0.30, 0.25, 0.35)):
        rng = np.random.default_rng(seed)
        batches = 0.3 * rng.standard_normal(STEPS)  # shared batch difficulty: the pairing removes it
        trend = np.linspace(3.0, 2.5, STEPS)
        ref = trend + batches + 0.01 * rng.standard_normal(STEPS)
        lab = trend + batches + 0.01 * rng.standard_normal(STEPS) + step_size * (np.arange(STEPS) >= 120)
        _write_run(tmp_path / f"lab{seed}", lab, True, 3.0 + seed)
        _write_run(tmp_path / f"ref{seed}", ref, False, 2.0)
        pairs.append((str(tmp_path / f"lab{seed}"), str(tmp_path / f"ref{seed}")))
    out = plp.paired_over_seeds(pairs)
    assert set(out["paired_steps"]) == {"ramp", "straight_through", "hard"}
    st = out["paired_steps"]["straight_through"]
    assert abs(st["mean"] - 0.30) < 0.03 and 0 < st["se"] < 0.05
    for k in ("ramp", "hard"):
        assert abs(out["paired_steps"][k]["mean"]) < 0.03
    assert out["valid_mean"] == 4.0 and out["reference_valid_mean"] == 2.0
    assert all(row["noise_std"] < 0.05 for row in out["pairs"])


def test_a_malformed_seed_pair_is_one_line_naming_the_flag(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        plp.main(["--seed_pairs", "runs/lab_s0", "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "--seed_pairs" in err and "RUN:REFERENCE" in err
    assert not (tmp_path / "x.json").exists()
