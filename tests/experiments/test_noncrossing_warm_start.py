"""experiments/classification/router_warm_start.py at smoke size: every arm runs, rows are complete, the warm arm's router
is fitted before the task steps."""

import json

from experiments.classification import router_warm_start as nws


def test_smoke_rows(tmp_path):
    out = tmp_path / "rows.jsonl"
    rows = nws.main(["--n", "16", "--depth", "3", "--steps", "4", "--warm-steps", "30", "--batch", "4",
                     "--eval-batches", "1", "--eval-every", "2", "--arms", "cold", "warm", "dense", "local",
                     "--radius", "2", "--out", str(out)])
    assert [r["arm"] for r in rows] == ["cold", "warm", "dense", "local"]
    assert [json.loads(line)["arm"] for line in out.read_text().splitlines()] == ["cold", "warm", "dense", "local"]
    for r in rows:
        assert [c["step"] for c in r["curve"]] == [2, 4] and 0 <= r["accuracy"] <= 1 and r["valid_loss"] > 0
        assert (r["router_matches_brackets"] is None) == (r["arm"] in ("dense", "local"))
        if r["arm"] in ("cold", "warm"):  # one recall per head
            assert len(r["router_pair_recall"]) == 2 and all(0 <= x <= 1 for x in r["router_pair_recall"])
    # 30 steps at the warm start's 1e-2 fit depth-3 brackets of 16 tokens (the BCE is ~1e-4 after 50 at n = 64).
    assert rows[1]["warm_start_only"]["router_matches_brackets"] > 0.5
    assert min(rows[1]["warm_start_only"]["router_pair_recall"]) > 0.8
