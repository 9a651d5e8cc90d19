"""experiments.retrieval.diagnose's summary table: seeds of one (variant, attention config) are averaged, and one
variant probed at two budgets stays two groups, named by the config field that differs."""

from experiments.retrieval.diagnose import table


def _row(variant, seed, interval, mass, attention=True):
    att = {"_type": "AnchorAttentionConfig", "interval": interval, "max_zone": interval} if attention else None
    return {"variant": variant, "seed": seed, "step": 500, "attention": att, "rollout": None,
            "layers": [{"mechanism": "AnchorAttentionConfig", "mass": mass}]}


def test_budgets_stay_apart_and_seeds_average():
    rows = [_row("abca_fixed", 0, 9, 0.1), _row("abca_fixed", 1, 9, 0.3), _row("abca_fixed", 0, 14, 0.5),
            _row("local", 0, 8, 0.2)]
    lines = table(rows).splitlines()[2:]
    assert lines == [
        "| abca_fixed (interval 14, max_zone 14) | 500 | 0 | 1 | mass 0.5 ± 0 |",
        "| abca_fixed (interval 9, max_zone 9) | 500 | 0 | 2 | mass 0.2 ± 0.1 |",
        "| local | 500 | 0 | 1 | mass 0.2 ± 0 |",
    ]


def test_rows_without_a_recorded_config_are_named_so():
    lines = table([_row("abca_fixed", 0, 9, 0.1), _row("abca_fixed", 0, 9, 0.2, attention=False)]).splitlines()[2:]
    assert [line.split(" | ")[0] for line in lines] == ["| abca_fixed (interval 9, max_zone 9)",
                                                        "| abca_fixed (interval unrecorded, max_zone unrecorded)"]
