"""LM at equal budgets: budget matching checked on dense masks of random inputs, one smoke cell, the grid's logic."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.lm import grid as lm_grid
from sparse_attn import registry
from sparse_attn.mechanisms.common import NEWLINE
from sparse_attn.mechanisms.labels import label_keys
from sparse_attn.modules import AnchorAttentionConfig, AttentionContext, DenseAttention, LabelAttentionConfig
from sparse_attn.patterns import abca
from sparse_attn.patterns.labels.base_graph import BaseGraph
from sparse_attn.patterns.labels.pattern import LabelPattern
from sparse_attn.studies import budget as lm_budget

N, TARGET = 64, 12.0
COMPARED = ("local", "longformer", "bigbird", "labels_d8k2", "labels_pos", "labels_lm4", "abca", "abca_hs2",
            "abca_global", "abca_fixed", "abca_fixed_global", "abca_learned")


def text_with_lines(batch: int, n: int, seed: int = 0) -> np.ndarray:
    """Random bytes with a newline after every 5-40 bytes."""
    rng = np.random.default_rng(seed)
    out = rng.integers(32, 127, size=(batch, n))
    for row in out:
        pos = np.cumsum(rng.integers(5, 41, size=n))
        row[pos[pos < n]] = NEWLINE
    return out.astype(np.int32)


def dense_mask_keys(att, tokens) -> float:
    """Keys per query from the dense oracle mask of the layer's pattern on these inputs (random labels for labels)."""
    b = tokens.shape[0]
    if isinstance(att, LabelAttentionConfig):  # independent uniform k-of-d labels per token, as the convention
        rng = np.random.default_rng(1)
        labels = np.stack([[rng.choice(att.num_labels, att.top_k, replace=False) for _ in range(N)] for _ in range(b)])
        total = att.num_labels
        if att.position_cell:  # + the two position labels, written from their definition
            c, m = att.position_cell, -(-att.radius // att.position_cell) + 1
            pos = np.arange(N)
            extra = np.stack([att.num_labels + (pos // c) % m, att.num_labels + m + ((pos + c // 2) // c) % m], -1)
            labels = np.concatenate([labels, np.broadcast_to(extra, (b, N, 2))], -1)
            total += 2 * m
        base = BaseGraph(radius=att.radius, landmark_every=att.landmark_every, causal=True)
        mask = LabelPattern.from_labels(jnp.asarray(labels)[:, None], total, base=base).to_dense()
        return float(jnp.sum(mask)) / (b * N)
    if isinstance(att, AnchorAttentionConfig):
        valid = jnp.full((b,), N, jnp.int32)
        place = att.placement
        raw = {"explicit": lambda: jnp.asarray(tokens) == place.anchor_id,
               "fixed": lambda: abca.fixed_interval_anchors(b, N, place.interval),
               "learned": lambda: jnp.zeros((b, N), bool)}[place.kind]()
        zones = abca.compute_zones(abca.enforce_zone_cap(raw, valid, att.max_zone)[0], valid)
        layer = abca.ZonePattern(zones, causal=True, max_zone=att.max_zone).to_dense()
        if att.handshake == "global":
            handshake = abca.global_handshake(zones, max_anchors=att.max_anchors, causal=True)[0].to_dense()
        else:
            handshake = abca.chain_handshake(zones, causal=True).to_dense()
        return float(jnp.sum(layer) + att.handshake_steps * jnp.sum(handshake)) / (b * N)
    mask = att.pattern(N, AttentionContext(valid_len=jnp.full((1,), N, jnp.int32), causal=True)).to_dense()
    return float(jnp.sum(mask)) / N


def test_matched_budgets_agree_within_ten_percent_on_dense_masks():
    tokens = text_with_lines(8, N)
    measured = {}
    for name in COMPARED:
        att = lm_budget.attention_for_budget(name, n=N, keys_per_query_target=TARGET, tokens_BxN=tokens)
        measured[name] = dense_mask_keys(att, tokens)
    lo, hi = min(measured.values()), max(measured.values())
    assert hi <= 1.1 * lo, measured
    assert all(abs(k - TARGET) <= 0.1 * TARGET for k in measured.values()), measured
    assert isinstance(lm_budget.attention_for_budget("dense", n=N, keys_per_query_target=TARGET),
                      type(DenseAttention()))


def test_unreachable_budget_is_refused_naming_the_mechanism():
    # d = 8, k = 1: at most 1 + 31.5 / 8 keys per query at n = 64 even with the whole causal window.
    with pytest.raises(ValueError, match="labels_d8k1: no radius gives 20"):
        lm_budget.attention_for_budget("labels_d8k1", n=N, keys_per_query_target=20)
    with pytest.raises(ValueError, match="tokens"):
        lm_budget.attention_for_budget("abca", n=N, keys_per_query_target=TARGET)
    with pytest.raises(ValueError, match="unknown --mechanism"):
        lm_budget.attention_for_budget("flash", n=N, keys_per_query_target=TARGET)


def test_smoke_cell_writes_a_row_with_gap_to_dense(tmp_path):
    results = tmp_path / "lm.jsonl"
    fake_dense = {"kind": "lm", "config": "smoke", "n": N, "mechanism": "dense", "budget_keys_per_query": TARGET,
                  "seed": 0, "valid_bits_per_byte": 4.0}
    results.write_text(json.dumps(fake_dense) + "\n")
    cell = lm_grid.Cell(N, "local", TARGET, 0)  # the cheapest compile; ABCA and labels differ only in config
    row = lm_grid.run_cell("smoke", cell, workdir=str(tmp_path / "run"), results=str(results), command="cmd",
                           log=lambda *_: None)
    assert row["steps"] == 4 and np.isfinite(row["valid_bits_per_byte"])
    assert row["gap_to_dense_pct"] == pytest.approx(100 * (row["valid_bits_per_byte"] / 4.0 - 1))
    layer = row["layers"][0]
    assert layer["keys_measured"] and layer["keys_per_query"] == pytest.approx(row["planned_keys_per_query"])
    assert row["stats_curve"][-1]["step"] == 4 and row["attention"] == {"type": "LocalAttention", "radius": 12}
    assert row["memory_mib"]["peak_mib"] > 0 and row["tokens_per_s"] > 0 and row["command"] == "cmd"
    assert row["commit"] and json.loads(results.read_text().splitlines()[-1])["mechanism"] == "local"
    assert f"| smoke | 64 | local | 12, 11.8 | 1 | {row['valid_bits_per_byte']:.4f} |" in lm_grid.report(
        lm_grid.read_rows(str(results)))


def test_grid_runs_dense_first_and_skips_finished_cells(tmp_path):
    results = tmp_path / "lm.jsonl"
    done = lm_grid.Cell(256, "local", 24.0, 0)
    results.write_text(json.dumps({"config": "cpu", "n": 256, "mechanism": "local", "budget_keys_per_query": 24.0,
                                   "seed": 0}) + "\n")
    calls = []
    status = lm_grid.run_grid(lm_grid.GRIDS["cpu_core"], config="cpu", results=str(results),
                              runs_dir=str(tmp_path), time_limit_s=1, run=lambda argv, t: calls.append(argv) or 124,
                              log=lambda *_: None)
    assert status[done] == "done before"
    variants = [a[a.index("--mechanism") + 1] for a in calls]
    assert variants == ["dense", "labels_d8k2", "abca"]
    assert all(s.startswith("timed out") for c, s in status.items() if c != done)
    assert jax.default_backend()  # the grid itself imports no accelerator-only code


def test_gpu_plan_limits_cells_by_time_left_and_records_cut_cells(tmp_path):
    from experiments.gpu import lm as gpu_lm

    results = tmp_path / "gpu.jsonl"
    plan = [lm_grid.Cell(64, v, 12, 0) for v in ("dense", "local", "labels_d8k2", "abca_fixed")]
    results.write_text(json.dumps({"kind": "lm", "config": "gpu_tiny", "n": 64, "mechanism": "dense",
                                   "budget_keys_per_query": 12, "seed": 0}) + "\n")
    cut = lm_grid.cell_workdir(str(tmp_path), "gpu_tiny", plan[1])
    (tmp_path / "gpu_tiny").mkdir()
    (tmp_path / cut).mkdir(parents=True, exist_ok=True)
    (tmp_path / cut / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "split": "train", "bits_per_byte": b}) + "\n" for s, b in ((1, 8.0), (2, 6.0))))
    now = [0.0]
    limits = []

    def fake_run(argv, limit, module):
        limits.append(limit)
        now[0] += 100.0  # each cell uses its 100 s
        return 124 if argv[2] == "local" else 0

    status = gpu_lm.run_plan(plan, tiny=True, steps=4, total_s=220.0, cell_s=150.0, results=str(results),
                             runs_dir=str(tmp_path), run_cmd=fake_run, clock=lambda: now[0], log=lambda *_: None)
    assert [status[c] for c in plan] == ["done before", "timed out", "finished",
                                         "not run (out of time: run again to continue)"]
    assert limits == [150.0, 120.0]
    partial = json.loads(results.read_text().splitlines()[-1])
    assert partial["kind"] == "lm_partial" and partial["steps_reached"] == 2
    assert partial["train_bits_per_byte_last10"] == pytest.approx(7.0) and partial["mechanism"] == "local"
    # a cell needs `min_cell_s` to start: with 120 s left after the first cell, a 130 s minimum starts nothing more
    now[0], limits[:] = 0.0, []
    status = gpu_lm.run_plan(plan, tiny=True, steps=4, total_s=220.0, cell_s=150.0, results=str(tmp_path / "b.jsonl"),
                             runs_dir=str(tmp_path), min_cell_s=130.0, run_cmd=fake_run, clock=lambda: now[0],
                             log=lambda *_: None)
    assert limits == [150.0]
    assert [status[c] for c in plan] == ["finished"] + ["not run (out of time: run again to continue)"] * 3
    assert gpu_lm.full_scale(4096, 150).batch == 8 and gpu_lm.full_scale(16384, 150).batch == 2
    assert [c.n for c in gpu_lm.PLAN][:1] == [4096] and max(c.n for c in gpu_lm.PLAN) == 16384
    tiny = gpu_lm.describe(gpu_lm.TINY_PLAN[1], text_with_lines(1, 4 * N).ravel().astype(np.uint8))
    assert tiny["type"] == "LocalAttention" and abs(tiny["planned_keys_per_query"] - 12) <= 1.2


def test_budget_search_skips_parameters_the_config_refuses():
    """Position labels stop fitting the bitmasks at wide windows (radius 255 needs 66 of them): the search treats
    those radii as over budget instead of failing."""
    att = lm_budget.attention_for_budget("labels_pos", n=256, keys_per_query_target=24)
    assert att.position_cell == 8 and abs(label_keys(att, 256) - 24) <= 0.1 * 24


def test_label_budget_search_takes_the_wide_window_side_of_the_minimum():
    """Label keys fall with the radius while the landmarks (every `radius`) thin out, then grow with the window. At
    n = 1024 even radius 512 is over 24 keys with position labels, so a bisection from above ran down to radius 1
    (239 keys, refused); the search measures every radius and keeps the side at or past the fewest keys."""
    keys = {r: label_keys(registry.preset("labels_d8k2")[1].budget(r, 256, 24), 256) for r in (2, 11, 53)}
    assert keys[2] > 24 > keys[11] and abs(keys[53] - 24) <= 2.4  # two crossings at n = 256
    assert lm_budget.attention_for_budget("labels_d8k2", n=256, keys_per_query_target=24).radius == 53
    att = lm_budget.attention_for_budget("labels_pos", n=1024, keys_per_query_target=24)
    assert att.radius == 23 and abs(label_keys(att, 1024) - 24) <= 0.1 * 24


def test_plot_lm_curves_and_flops(tmp_path):
    from experiments.reports import plot_lm  # noqa: PLC0415

    def row(variant, seed, curve, flops):
        return {"kind": "lm", "config": "c", "n": 64, "mechanism": variant, "seed": seed,
                "valid_curve": [{"step": s, "bits_per_byte": b} for s, b in curve],
                "valid_bits_per_byte": curve[-1][1], "attn_fwd_flops_per_seq": flops}
    rows = [row("dense", 0, [(10, 3.0), (20, 2.0)], 1e6), row("dense", 1, [(10, 3.2), (20, 2.2)], 1e6),
            row("local", 0, [(10, 2.5), (20, 2.1), (30, 2.0)], 2e5), {"kind": "lm", "config": "other", "n": 64}]
    steps, bpb = plot_lm.mean_curve(plot_lm.grouped(rows, "c", 64)["dense"])
    assert steps.tolist() == [10, 20] and bpb == pytest.approx([3.1, 2.1])
    paths = plot_lm.plot(rows, "c", 64, str(tmp_path / "lm"))
    assert all(os.path.getsize(p) > 1000 for p in paths)
    with pytest.raises(ValueError, match="no LM rows"):
        plot_lm.plot(rows, "c", 128, str(tmp_path / "none"))
