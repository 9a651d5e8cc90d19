"""Resume checks the stored config: a mismatch is refused naming the fields, unless allowed explicitly."""

import pytest
import train_harness as tiny

from sparse_attn.train import ConfigMismatchError, read_metrics, run_config


def test_resume_refuses_a_changed_config_and_accepts_named_changes(tmp_path):
    workdir = str(tmp_path)
    config = tiny.config(num_steps=2, checkpoint_every=2, eval_every=2)
    tiny.run(workdir, config, experiment={"data": "corpus-a"})

    # The data, an optimizer field and the schedule length are each named; nothing runs.
    with pytest.raises(ConfigMismatchError) as info:
        tiny.run(workdir, tiny.config(num_steps=4, learning_rate=0.5), experiment={"data": "corpus-b"})
    message = str(info.value)
    for field in ("data: checkpoint 'corpus-a' != now 'corpus-b'", "train.learning_rate", "train.num_steps"):
        assert field in message, message
    assert "train.eval_every" not in message
    assert sorted(read_metrics(workdir)) == [1, 2]

    # Logging and checkpoint cadence may differ; a longer schedule only when named.
    with pytest.raises(ConfigMismatchError, match="train.num_steps: checkpoint 2 != now 4"):
        tiny.run(workdir, tiny.config(num_steps=4, eval_every=1), experiment={"data": "corpus-a"})
    messages = []
    summary = tiny.run(workdir, tiny.config(num_steps=4, eval_every=1), experiment={"data": "corpus-a"},
                       allowed_changes=["train.num_steps"], log=messages.append)
    assert summary["step"] == 4
    assert "resume: train.num_steps changed from 2 to 4 (allowed)" in messages, messages
    assert any(m.startswith("learning rate at step 2: ") for m in messages), messages

    # The extended run's config is what the new checkpoints store.
    stored = run_config.flatten(_stored_config(workdir, 4))
    assert stored["train.num_steps"] == 4 and stored["data"] == "corpus-a"


def _stored_config(workdir, step):
    from sparse_attn.train import checkpoint  # noqa: PLC0415

    with checkpoint.make_manager(workdir, tiny.config()) as manager:
        return checkpoint.read_config(manager, step)


def test_differences_name_nested_fields_and_types():
    a = run_config.record(tiny.config(), {"model": {"attention": [{"_type": "Local", "radius": 4}]}})
    b = run_config.record(tiny.config(seed=1), {"model": {"attention": [{"_type": "Dense"}]}})
    assert run_config.differences(a, b) == {
        "model.attention.0._type": ("Local", "Dense"),
        "model.attention.0.radius": (4, "<absent>"),
        "train.seed": (0, 1),
    }
    with pytest.raises(ConfigMismatchError, match="model.attention.0._type"):
        run_config.check_resume(a, b, allowed=["train.seed"])
    assert run_config.check_resume(a, b, allowed=["model", "train.seed"])  # a prefix allows the subtree


def test_a_step_without_its_config_is_checked_against_the_run_or_refused(tmp_path):
    """The newest step's config folder gone: the resume check reads the previous step's config (and still
    refuses a changed config); with no step holding one, the resume is refused instead of running unchecked."""
    import shutil  # noqa: PLC0415

    workdir = str(tmp_path)
    tiny.run(workdir, tiny.config(num_steps=4, checkpoint_every=2, keep_checkpoints=3), experiment={"data": "a"})
    ckpt = tmp_path / "checkpoints"
    shutil.rmtree(ckpt / "4" / "config")
    with pytest.raises(ConfigMismatchError, match="data: checkpoint 'a' != now 'b'"):
        tiny.run(workdir, tiny.config(num_steps=4, checkpoint_every=2), experiment={"data": "b"})
    messages = []
    tiny.run(workdir, tiny.config(num_steps=4, checkpoint_every=2), experiment={"data": "a"}, log=messages.append)
    assert "checkpoint step 4 stores no config; checked against step 2's" in messages, messages
    for step in ("2", "4"):
        shutil.rmtree(ckpt / step / "config", ignore_errors=True)
    with pytest.raises(ConfigMismatchError, match="no other step does"):
        tiny.run(workdir, tiny.config(num_steps=4, checkpoint_every=2), experiment={"data": "a"})
