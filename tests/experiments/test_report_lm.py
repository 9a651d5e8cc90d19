"""The LM and retrieval sections of docs/results.md and their companion files, rendered from hand-made rows into a
page with prose around them; rows name their mechanism under `mechanism` (older rows: `variant`, read alike)."""

import json

import pytest

from experiments.reports import lm as report_lm
from experiments.reports import plot_lm
from experiments.reports import results as report_results


def lm_row(mechanism, seed, bpb, *, keys=24.0, planned=24.0, commit="aaaaaaa1"):
    return {"kind": "lm", "config": "c", "n": 64, "mechanism": mechanism, "budget_keys_per_query": 12.0, "seed": seed,
            "valid_bits_per_byte": bpb, "planned_keys_per_query": planned, "attn_vs_dense": 0.5,
            "attention": {"type": "LocalAttention", "radius": 12}, "layers": [{"keys_per_query": keys}] * 2,
            "memory_mib": {"peak_mib": 10.0}, "attn_fwd_flops_per_seq": 1e6, "commit": commit,
            "valid_curve": [{"step": 10, "bits_per_byte": bpb + 1}, {"step": 20, "bits_per_byte": bpb}]}


def recall_row(mechanism, seed, acc, near, far):
    return {"kind": "retrieval", "task": "recall", "config": "c", "n": 32, "mechanism": mechanism, "seed": seed,
            "budget_keys_per_query": 6.0, "accuracy": acc, "seq_accuracy": acc / 2, "valid_loss": 1.0,
            "accuracy_by_distance": {"1-1": {"accuracy": None, "fraction": 0.0},
                                     "2-15": {"accuracy": near, "fraction": 0.5},
                                     "16-32": {"accuracy": far, "fraction": 0.5}},
            "keys_per_query": [6.0, 6.5], "planned_keys_per_query": 6.0, "attention": {"type": "LocalAttention"},
            "task_config": {"num_values": 16}, "commit": "bbbbbbb2"}


def test_tables_pair_gaps_by_seed_keep_the_latest_row_and_the_prose(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    # the labels row is an older one: its mechanism under `variant`
    old = {k: v for k, v in lm_row("labels_d8k2", 0, 2.5, keys=40.0, planned=24.0).items() if k != "mechanism"}
    lm = [lm_row("dense", 0, 2.0), lm_row("dense", 1, 3.0), lm_row("local", 1, 9.9),  # seed 1 is rerun below
          lm_row("local", 0, 2.2), lm_row("local", 1, 3.0), {**old, "variant": "labels_d8k2"}]
    (results / "lm.jsonl").write_text("\n".join(json.dumps(r) for r in lm) + "\nnot json\n")
    recall = [recall_row("dense", 0, 0.9, 1.0, 0.8), recall_row("local", 0, 0.5, 0.9, 0.1),
              recall_row("local", 1, 0.7, 0.9, 0.5),
              dict(recall_row("local", 0, 0.4, 0.8, 0.0), n=128)]  # one seed of every mechanism: a probe
    (results / "retrieval.jsonl").write_text("\n".join(json.dumps(r) for r in recall) + "\n")
    page = tmp_path / "results.md"
    page.write_text(f"# Results\n\nprose before\n\n{report_lm.LM_MARKERS[0]}\nold table\n{report_lm.LM_MARKERS[1]}\n\n"
                    "prose between\n")
    details = tmp_path / "details"

    assert report_lm.render(str(results), str(page), plots_dir=str(tmp_path / "img"),
                            details_dir=str(details)) == ["lm", "retrieval"]
    text = page.read_text()
    assert "old table" not in text and "prose before" in text and "prose between" in text
    assert (text.index(report_lm.LM_MARKERS[1]) < text.index("prose between")
            < text.index(report_lm.RETRIEVAL_MARKERS[0]))
    lm_part = text.split(report_lm.LM_MARKERS[0])[1].split(report_lm.LM_MARKERS[1])[0]
    lines = {line.split(" | ")[0].lstrip("| "): line for line in lm_part.splitlines() if line.startswith("| ")}
    # local: seeds 0 and 1 (the rerun's 3.0 wins), gaps +10% and 0% against the same seed's dense
    assert "| 0, 1 | 24.0 / 24.0 | 2.200 / 3.000 | 2.600 ± 0.566 | +5.0 ± 7.1% |" in lines["local"]
    assert "(planned 24.0)" in lines["labels_d8k2"] and "| 0 | " in lines["labels_d8k2"]
    assert "+25.0%" in lines["labels_d8k2"]
    assert lines["dense"].count("| – |") == 1  # no gap for the reference itself
    assert "aaaaaaa" not in text  # commits: in the companion file
    # retrieval: the empty 1-1 bucket is left out; per-bucket means over seeds
    assert "by distance 2-15 / 16-32 |" in text
    assert "| 50.0 / 70.0% | 60.0 ± 14.1% | 90.0 / 30.0% | 30.0 ± 7.1% |" in text
    for png in ("lm_c_n64_curves.png", "lm_c_n64_bpb_vs_flops.png", "retrieval_recall_c_n32_k6.png"):
        assert (tmp_path / "img" / png).read_bytes()[:4] == b"\x89PNG" and f"](img/{png})" in text
    # the companion files, linked from the page: commits per mechanism; the single-seed group's table
    lm_details = (details / report_lm.DETAILS_FILES["lm"]).read_text()
    retrieval_details = (details / report_lm.DETAILS_FILES["retrieval"]).read_text()
    assert "](details/lm_details.md)" in text and "](details/retrieval_details.md)" in text
    assert "| local | 0, 1 | aaaaaaa |" in lm_details and "| local | 0, 1 | bbbbbbb |" in retrieval_details
    assert "recall `c`, n = 128" not in text and "recall `c`, n = 128, 6 keys per query (one seed" in retrieval_details
    assert "| 40.0% | 40.0% | 80.0 / 0.0% |" in retrieval_details
    assert "](../img/retrieval_recall_c_n128_k6.png)" in retrieval_details

    report_lm.render(str(results), str(page), plots_dir=str(tmp_path / "img"), details_dir=str(details))  # idempotent
    assert page.read_text() == text


def test_missing_result_files_leave_the_page_alone(tmp_path):
    page = tmp_path / "results.md"
    page.write_text("# Results\n\nhand-written\n")
    assert report_lm.render(str(tmp_path), str(page), plots_dir=str(tmp_path / "img")) == []
    assert page.read_text() == "# Results\n\nhand-written\n"


@pytest.mark.parametrize("values, text", [([], "–"), ([2.0], "2.000"), ([1.0, 3.0], "2.000 ± 1.414")])
def test_mean_std(values, text):
    assert report_lm._mean_std(values, ".3f") == text


def test_mechanism_statistics_over_training_table_and_plot(tmp_path):
    """Label degree / disconnected fraction and ABCA's anchors, zones and insertions: the table shows the last
    logged step per layer (mean over seeds), the plot the curves; mechanisms with keys only are left out."""
    def curve(stats, scale):
        return [{"step": s, **{f"layer{i}/{k}": v * scale * (i + 1) for i in (0, 1) for k, v in stats.items()}}
                for s, scale in ((10, 1.0), (20, scale))]

    labels = {"keys_per_query": 20.0, "labels/mean_degree": 19.0, "labels/frac_disconnected": 0.01}
    abca = {"keys_per_query": 10.0, "abca/anchors": 4.0, "abca/mean_zone": 8.0, "abca/inserted_anchors": 1.0}
    rows = [dict(lm_row("labels", 0, 2.5), stats_curve=curve(labels, 2.0)),
            dict(lm_row("labels", 1, 2.6), stats_curve=curve(labels, 4.0)),
            dict(lm_row("abca", 0, 2.4), stats_curve=curve(abca, 1.0)),
            dict(lm_row("local", 0, 2.4), stats_curve=curve({"keys_per_query": 12.0}, 1.0)),
            lm_row("dense", 0, 2.3)]
    table = report_lm.stats_table(rows)
    lines = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()[2:]}
    assert set(lines) == {"labels", "abca"}
    # labels' last step: seeds scaled by 2 and 4 -> mean 3x the base, layer 1 twice layer 0
    assert "| 0, 1 | 60.0 / 120.0 | 57.0 / 114.0 | 0.0300 / 0.0600 | – | – | – |" in lines["labels"]
    assert lines["abca"].endswith("| 10.0 / 20.0 | – | – | 4.0 / 8.0 | 8.0 / 16.0 | 1.0 / 2.0 |")
    steps, values = plot_lm.stat_curve(rows[:2], "labels/mean_degree")
    assert list(steps) == [10, 20] and list(values) == pytest.approx([28.5, 85.5])  # mean of layers (1x, 2x) and seeds
    path = plot_lm.plot_stats(rows, "c", 64, str(tmp_path / "lm"))
    assert path.endswith("lm_stats.png") and (tmp_path / "lm_stats.png").read_bytes()[:4] == b"\x89PNG"
    assert plot_lm.plot_stats([lm_row("dense", 0, 2.3), lm_row("local", 0, 2.4)], "c", 64, str(tmp_path / "x")) is None


@pytest.mark.parametrize("script, argv, named", [
    ("lm", ["--results_dir", "{tmp}/nowhere"], "--results_dir"),
    ("results", ["--results_dir", "{tmp}/nowhere"], "--results_dir"),
    ("results", ["--results_dir", "{tmp}", "--note_file", "{tmp}/no_note.md"], "--note_file"),
    ("plot_lm", ["--results", "{tmp}/no_rows.jsonl"], "--results"),
])
def test_a_missing_input_is_one_line_and_leaves_the_page_alone(tmp_path, capsys, script, argv, named):
    main = {"lm": report_lm.main, "results": report_results.main, "plot_lm": plot_lm.main}[script]
    page = tmp_path / "results.md"
    page.write_text("# Results\n\nhand-written\n")
    argv = [a.format(tmp=tmp_path) for a in argv] + ["--out", str(page if script != "plot_lm" else tmp_path / "p")]
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and named in err and "Traceback" not in err
    assert page.read_text() == "# Results\n\nhand-written\n" and not (tmp_path / "img").exists()
