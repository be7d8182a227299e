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
