import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

# A test cgroup with a CPU quota, for the tests of the CPU budget.
from tests.helpers.cgroups import quota_cgroup  # noqa: E402, F401


@pytest.fixture(autouse=True)
def _no_global_seed_leaks():
    """A test that sets a global seed must not make later tests' random ops repeat."""
    yield
    import tensorflow as tf

    tf.random.set_seed(None)
