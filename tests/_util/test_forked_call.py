"""`forked_call`: a function run in a forked copy of the process leaves this one as it was."""

import os
import tempfile
import time

import pytest

from keras_pipeline_tuner._util.forked_call import ForkedCallError
from keras_pipeline_tuner._util.forked_call import forked_call


def test_what_the_copy_changes_stays_in_the_copy():
    state = {"calls": 0}

    def call():
        state["calls"] += 1
        return state["calls"], os.getpid()

    calls, pid = forked_call(call, timeout_s=30)
    assert calls == 1 and pid != os.getpid()
    assert state == {"calls": 0}


def test_an_error_in_the_copy_is_raised_here():
    def fail():
        raise ValueError("one epoch takes too long")

    with pytest.raises(ValueError, match="one epoch takes too long"):
        forked_call(fail, timeout_s=30)


def test_an_error_that_does_not_pickle_is_said_in_words():
    class Local(Exception):
        pass

    def fail():
        raise Local("no pickle for a class defined in a function")

    with pytest.raises(ForkedCallError, match="Local: no pickle"):
        forked_call(fail, timeout_s=30)


def test_a_copy_that_hangs_is_killed_at_the_timeout():
    began = time.monotonic()
    with pytest.raises(ForkedCallError, match="did not answer within 1 s"):
        forked_call(lambda: time.sleep(600), timeout_s=1)
    # Killed, not waited for: well within the sleep, however busy the machine.
    assert time.monotonic() - began < 60


def test_a_copy_that_dies_is_said_to():
    with pytest.raises(ForkedCallError, match="killed by signal 9"):
        forked_call(lambda: os.kill(os.getpid(), 9), timeout_s=30)


def test_an_open_file_is_neither_read_nor_moved_by_the_copy():
    with tempfile.TemporaryFile() as file:
        file.write(b"first line")
        file.seek(0)
        # A reader of an inherited file would move the offset both share.
        with pytest.raises(OSError):
            forked_call(lambda: os.read(file.fileno(), 5), timeout_s=30)
        assert file.tell() == 0
        assert os.read(file.fileno(), 5) == b"first"
