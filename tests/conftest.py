import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

# A test cgroup with a CPU quota, for the tests of the CPU budget.
from tests.helpers.cgroups import memory_cgroup  # noqa: E402, F401
from tests.helpers.cgroups import quota_cgroup  # noqa: E402, F401


@pytest.fixture(autouse=True)
def _no_global_seed_leaks():
    """A test that sets a global seed must not make later tests' random ops repeat."""
    yield
    import tensorflow as tf

    tf.random.set_seed(None)


@pytest.fixture(autouse=True)
def _no_late_profile_outlives_its_test():
    """A profile still converting after a test's fit joins its run before the next test.

    Its outputs are written again on a thread of the tuner's: in the next test,
    that thread would meet that test's patched collaborators and log into its
    captured warnings.
    """
    yield
    from keras_pipeline_tuner.run import late_profile

    assert late_profile.wait_for_all(timeout_s=120), "a profile conversion did not end"


@pytest.fixture
def contention_check_due(monkeypatch):
    """The contention check due wherever it may run, even where it cannot change the class.

    The tests of its hazards, notes and identity train healthy pipelines of
    TensorFlow ops, whose measured CPU bounds the check below a class change:
    it is skipped there by default (`advice.verdict.check_can_change_class`,
    tested on its own).
    """
    from keras_pipeline_tuner.advice import verdict

    monkeypatch.setattr(verdict, "check_can_change_class", lambda judgement, step_ms: True)


@pytest.fixture
def contention_cap_raised(monkeypatch, contention_check_due):
    """The contention check's own cap raised to 5 s, and the check due wherever it may run.

    A fit of seconds gives the check half a second, which a busy machine's
    slower set-up can use up: for the tests of what the check finds, changes
    or costs, which need it to run (its cap is tested on its own).
    """
    from keras_pipeline_tuner.after_training import what_if_replay

    monkeypatch.setattr(what_if_replay, "CONTENTION_LEAST_S", 5.0)
