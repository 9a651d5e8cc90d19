"""label_phase_valid: each change's rise is the worst loss of the new phase over the last one before it, on a planted
validation curve; the boundaries are the default schedule's; the report runs end to end on LM rows."""

import json

import pytest

from experiments.reports import label_phase_valid as lpv


def test_boundaries_are_the_default_schedule():
    assert lpv.boundaries(300) == {"ramp": 90, "straight_through": 150, "hard": 240}


def test_rises_are_the_new_phase_worst_over_the_last_loss_before():
    bounds = {"ramp": 30, "straight_through": 50, "hard": 80}
    curve = {10: 3.0, 20: 2.0, 30: 2.1, 40: 2.04, 50: 1.9, 60: 1.8, 70: 1.7, 80: 1.7, 90: 1.5, 100: 1.4}
    rises = lpv.phase_rises(curve, bounds, end=100)
    assert rises["ramp"] == pytest.approx(0.05)  # max(2.1, 2.04) / 2.0
    assert rises["straight_through"] == pytest.approx(1.9 / 2.04 - 1)  # a fall is negative
    assert rises["hard"] == pytest.approx(0.0)  # 1.7 / 1.7: the change's own evaluation counts
    assert set(lpv.phase_rises({10: 1.0, 20: 1.0}, bounds, end=20)) == set()  # no evaluation past a change


def _row(variant, seed, curve):
    return {"kind": "lm", "variant": variant, "seed": seed, "steps": 300, "layers": [{"keys_per_query": 24.0}],
            "valid_curve": [{"step": s, "bits_per_byte": v} for s, v in curve.items()]}


def test_the_report_reads_rows_and_judges_the_final_against_the_soft_best(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    falling = {s: 4.0 - s / 100 for s in range(10, 301, 10)}
    stuck = {**falling, 300: 3.5}  # ends above its best before step 90 (3.2)
    rows.write_text("\n".join(json.dumps(r) for r in (_row("labels", 1, falling), _row("labels", 0, stuck))) + "\n")
    out = tmp_path / "out.json"
    lpv.main(["--rows", str(rows), "--out", str(out)])
    seeds = json.loads(out.read_text())["labels"]["seeds"]
    assert [r["seed"] for r in seeds] == [0, 1]
    assert seeds[0]["soft_best"] == pytest.approx(3.2) and not seeds[0]["final_at_or_below_soft_best"]
    assert seeds[1]["final_at_or_below_soft_best"] and seeds[1]["rises"]["ramp"] < 0
    table = capsys.readouterr().out
    assert "| labels | 0 |" in table and "| no |" in table and "| yes |" in table
