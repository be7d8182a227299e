"""Bad arguments fail at construction, naming the argument and the fix."""

import pytest

import keras_pipeline_tuner as kpt


def test_log_dir_that_is_a_file(tmp_path):
    path = tmp_path / "file.txt"
    path.write_text("x")
    with pytest.raises(ValueError, match="log_dir.*is a file"):
        kpt.PipelineTuner(log_dir=path)


def test_log_dir_of_wrong_type():
    with pytest.raises(TypeError, match="log_dir"):
        kpt.PipelineTuner(log_dir=3)


@pytest.mark.parametrize("profile", [(5, 2), (-1, 3), (4, 4)])
def test_profile_range_reversed_or_negative(profile):
    with pytest.raises(ValueError, match="profile.*start_step < stop_step"):
        kpt.PipelineTuner(profile=profile)


@pytest.mark.parametrize("profile", ["sometimes", (1, 2, 3), ("a", "b"), 5])
def test_profile_of_unknown_form(profile):
    with pytest.raises(ValueError, match="profile"):
        kpt.PipelineTuner(profile=profile)


@pytest.mark.parametrize("verbose", [3, -1, True, "yes"])
def test_verbose(verbose):
    with pytest.raises(ValueError, match="verbose"):
        kpt.PipelineTuner(verbose=verbose)


def test_buffer_steps():
    with pytest.raises(ValueError, match="buffer_steps"):
        kpt.PipelineTuner(buffer_steps=0)


def test_valid_arguments():
    tuner = kpt.PipelineTuner(log_dir=None, verbose=0, profile=(2, 6), buffer_steps=100)
    assert tuner.profile == (2, 6)


def test_log_dir_under_a_file(tmp_path):
    path = tmp_path / "file.txt"
    path.write_text("x")
    with pytest.raises(ValueError, match=r"log_dir.*is under .*file\.txt.*which is a file.*e\.g\."):
        kpt.PipelineTuner(log_dir=path / "run1" / "logs")


def test_log_dir_that_is_empty():
    with pytest.raises(ValueError, match="log_dir.*empty.*e.g. log_dir="):
        kpt.PipelineTuner(log_dir="")


def test_log_dir_not_created_yet_is_fine(tmp_path):
    tuner = kpt.PipelineTuner(log_dir=tmp_path / "not" / "yet")
    assert tuner.log_dir == str(tmp_path / "not" / "yet")
    assert not (tmp_path / "not").exists()


# Every constructor argument: a bad value names the argument and says what to pass.
@pytest.mark.parametrize(
    "kwargs, error, fix",
    [
        ({"log_dir": 3}, TypeError, "log_dir='logs/run1'"),
        ({"log_dir": b"logs"}, TypeError, "log_dir='logs/run1'"),
        ({"verbose": 3}, ValueError, "verbose=0"),
        ({"profile": (5, 2)}, ValueError, "e.g. (10, 30)"),
        ({"profile": "on"}, ValueError, "'auto', 'off'"),
        ({"buffer_steps": 0}, ValueError, "buffer_steps=10000"),
        ({"buffer_steps": True}, ValueError, "buffer_steps=10000"),
        ({"buffer_steps": 2.5}, ValueError, "buffer_steps=10000"),
        ({"buffer_steps": "100"}, ValueError, "buffer_steps=10000"),
        ({"profile_steps": 0}, ValueError, "profile_steps=15"),
        ({"profile_steps": -5}, ValueError, "profile_steps=15"),
        ({"profile_steps": True}, ValueError, "profile_steps=15"),
        ({"profile_steps": 7.5}, ValueError, "profile_steps=15"),
        ({"profile": (2, 8), "profile_steps": 5}, ValueError, "Drop `profile_steps`"),
        ({"what_if": 0}, ValueError, "what_if=True"),
        ({"what_if": -3}, ValueError, "what_if=True"),
        ({"what_if": 2.5}, ValueError, "what_if=True"),
        ({"what_if": "yes"}, ValueError, "what_if=True"),
        ({"what_if": None}, ValueError, "what_if=True"),
        ({"tensorboard_workers": "some"}, ValueError, "'chief'"),
        ({"tensorboard_workers": None}, ValueError, "'all'"),
        ({"worker_timeout_s": -1}, ValueError, "worker_timeout_s=30"),
        ({"worker_timeout_s": float("nan")}, ValueError, "worker_timeout_s=30"),
        ({"worker_timeout_s": True}, ValueError, "worker_timeout_s=30"),
        ({"worker_timeout_s": "30"}, ValueError, "worker_timeout_s=30"),
        ({"check_contention": "yes"}, ValueError, "check_contention=False"),
        ({"check_contention": 1}, ValueError, "check_contention=False"),
        ({"check_contention": None}, ValueError, "check_contention=False"),
        ({"measure_fixes": "yes"}, ValueError, "measure_fixes=True"),
        ({"measure_fixes": 0}, ValueError, "measure_fixes=True"),
        ({"measure_fixes": -2.0}, ValueError, "measure_fixes=True"),
        ({"measure_fixes": float("inf")}, ValueError, "measure_fixes=True"),
        ({"measure_fixes": None}, ValueError, "measure_fixes=True"),
        ({"allow_unverified": "yes"}, ValueError, "allow_unverified=True"),
        ({"allow_unverified": 1}, ValueError, "allow_unverified=True"),
        (
            {"allow_unverified": True, "measure_fixes": False},
            ValueError,
            'measure_fixes="auto" or True',
        ),
        ({"cost_budget_s": -1}, ValueError, "0 to run no automatic probe"),
        ({"cost_budget_s": "2s"}, ValueError, "Pass None for the default"),
        ({"cost_budget_s": float("nan")}, ValueError, "Pass None for the default"),
        ({"cost_budget_s": True}, ValueError, "Pass None for the default"),
    ],
    ids=lambda value: repr(value)[:40],
)
def test_every_argument_names_itself_and_the_fix(kwargs, error, fix):
    with pytest.raises(error) as raised:
        kpt.PipelineTuner(**kwargs)
    message = str(raised.value)
    assert any(f"`{name}`" in message for name in kwargs), message
    assert fix in message


@pytest.mark.parametrize("option", ["profil", "logdir", "profile_step", "whatif"])
def test_unknown_options_are_refused_by_name(option):
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{option}'"):
        kpt.PipelineTuner(**{option: 1})


def test_every_argument_of_the_constructor_is_covered():
    import inspect

    parameters = set(inspect.signature(kpt.PipelineTuner.__init__).parameters) - {"self"}
    checked = {
        "log_dir",
        "verbose",
        "profile",
        "buffer_steps",
        "profile_steps",
        "what_if",
        "tensorboard_workers",
        "worker_timeout_s",
        "check_contention",
        "measure_fixes",
        "allow_unverified",
        "cost_budget_s",
    }
    # A new argument needs its bad values in the table above.
    assert parameters == checked


def test_two_tuners_in_one_fit_are_refused_before_training():
    from tests.helpers.training_data import slow_source
    from tests.helpers.training_data import tiny_model

    model = tiny_model()
    first = kpt.PipelineTuner(verbose=0, profile="off")
    second = kpt.PipelineTuner(verbose=0, profile="off")
    weights = model.get_weights()
    with pytest.raises(ValueError, match="2 PipelineTuner callbacks.*Pass a single"):
        model.fit(slow_source(8, 0.0).batch(2), callbacks=[first, second], verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 0  # nothing trained
    assert all((a == b).all() for a, b in zip(weights, model.get_weights()))
    # Either tuner alone still works afterwards.
    model.fit(slow_source(8, 0.0).batch(2), callbacks=[first], verbose=0)
    assert first.report.train.steps == 3
