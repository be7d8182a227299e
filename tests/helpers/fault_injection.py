"""Helpers of the fault-injection tests: a reference training run and its checks."""

import logging
import re
import subprocess
import sys
import textwrap

import keras
import numpy as np

from tests.helpers.paths import REPO_ROOT
from tests.helpers.training_data import cached_source
from tests.helpers.training_data import tiny_model

ROOT = str(REPO_ROOT)
EPOCHS = 2
STEPS_PER_EPOCH = 12
_TURNED_OFF = re.compile(r"keras-pipeline-tuner: (.+?) turned off: ")


class InjectedFault(RuntimeError):
    """The fault a test makes one of the tuner's collaborators raise."""


def raise_injected(*args, **kwargs):
    raise InjectedFault("injected for the test")


def train(callbacks=(), seed=3, epochs=EPOCHS):
    """Trains a tiny model on a fixed pipeline, with validation.

    Returns:
        `(history.history, final weights)`: equal for equal seeds, whatever
        callbacks only observe the run.
    """
    keras.utils.set_random_seed(seed)
    model = tiny_model()
    history = model.fit(
        cached_source(4 * STEPS_PER_EPOCH).batch(4),
        validation_data=cached_source(8).batch(4),
        epochs=epochs,
        callbacks=list(callbacks),
        verbose=0,
    )
    return history.history, model.get_weights()


def assert_training_intact(run, plain_run):
    history, weights = run
    plain_history, plain_weights = plain_run
    assert history == plain_history
    assert len(weights) == len(plain_weights)
    for plain, tuned in zip(plain_weights, weights):
        np.testing.assert_array_equal(plain, tuned)


def tuner_warnings(caplog):
    """The messages the tuner logged at WARNING or above."""
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "keras_pipeline_tuner" and record.levelno >= logging.WARNING
    ]


def turned_off(warnings):
    """The features named by "... turned off" warnings, in order, repeats kept."""
    return [match.group(1) for match in map(_TURNED_OFF.match, warnings) if match]


def run_script(script, *args):
    """Runs `script` in a new Python process that can import this checkout.

    Args:
        script: Python source; `args` are its `sys.argv[1:]`, as strings.

    Returns:
        The `subprocess.CompletedProcess`, with text output.
    """
    preamble = (
        "import os, sys\n"
        "os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')\n"
        f"sys.path.insert(0, {ROOT!r})\n"
    )
    return subprocess.run(
        [sys.executable, "-c", preamble + textwrap.dedent(script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )
