"""The tuner's own cost after training: within its budget, stated, and said first when long."""

import time
import traceback

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.after_training import what_if_replay
from keras_pipeline_tuner.outputs import terminal
from keras_pipeline_tuner.timing import tuner_cost
from tests.helpers.training_data import FEATURES
from tests.helpers.training_data import Sleep
from tests.helpers.training_data import busy_map
from tests.helpers.training_data import cached_source
from tests.helpers.training_data import replayable_source
from tests.helpers.training_data import tiny_model

BATCH = 4


def _fit(dataset, model, epochs=2, **tuner_kwargs):
    tuner = kpt.PipelineTuner(profile="off", **{"verbose": 0, **tuner_kwargs})
    model.fit(dataset, epochs=epochs, callbacks=[tuner], verbose=0)
    return tuner.report


SHORTEST_FORM = "The contention check did not run: even its shortest form"


def _noted(report, start, containing=""):
    """Whether a note of the report starts with `start` and holds `containing`."""
    found = any(note.startswith(start) and containing in note for note in report.notes)
    assert found, report.notes
    return found


def test_the_contention_check_is_skipped_when_the_wait_decides():
    # 60 ms of sleeping input a batch against a step of about a millisecond:
    # no fetch floor and no contention can change "highly input-bound".
    dataset = replayable_source(24 * BATCH, 0.015).batch(BATCH)
    began = time.monotonic()
    # No fixes timed: "auto" times them once the fit is long enough for its
    # budget, which a busy machine's slower fit reached, and the check then
    # runs for their floor (the next test).
    report = _fit(dataset, tiny_model(), measure_fixes=False)
    assert report.verdict == "highly input-bound", report.judgement.line
    assert report.what_if is None
    assert any(
        note.startswith("The contention check did not run: the wait alone decides")
        for note in report.notes
    ), report.notes
    cost = report.tuner_cost
    assert cost is not None and "contention check" not in cost.parts
    assert cost.within_budget and cost.after_training_s < time.monotonic() - began
    # The default budget: the larger of 2 s and 2 % of the fit.
    assert cost.budget_s == pytest.approx(max(2.0, 0.02 * cost.fit_s))


def test_where_the_wait_decides_the_check_runs_for_the_timed_fixes_floor():
    # 16 ms of sleeping input a batch against a step of about a millisecond:
    # the wait decides, but the fixes are timed (measure_fixes=8), and their
    # figures are capped at the replayed step, within a share of their cap
    # (2 s: a busy machine's first replayed steps took 1.7 s).
    dataset = replayable_source(48 * BATCH, 0.004).batch(BATCH)
    report = _fit(dataset, tiny_model(), measure_fixes=8)
    assert report.verdict == "highly input-bound", report.judgement.line
    assert report.what_if is not None, report.notes
    assert report.what_if.method == what_if_replay.CONTENTION_METHOD
    cost = report.tuner_cost
    assert tuner_cost.FIX_FLOOR in cost.parts and "contention check" not in cost.parts
    assert cost.fix_timing_cap_s == 8
    assert cost.capped_s >= cost.parts[tuner_cost.FIX_FLOOR] > 0
    assert not any("the wait alone decides" in note for note in report.notes), report.notes
    off = _fit(dataset, tiny_model(), measure_fixes=False)
    assert off.what_if is None
    assert any(note.startswith("The contention check did not run: the wait alone decides")
               for note in off.notes), off.notes


def test_a_pipeline_that_runs_python_is_not_run_again_for_the_fixes_floor():
    # 40 ms of sleeping Python a batch, which counts its calls, against 10 ms of
    # compute: the check would run the pipeline again (its count would move
    # on), so there is no floor replay, the report says why, and the work
    # after training costs close to nothing.
    calls = []

    def counted(x, y):
        def load(value):
            calls.append(1)
            time.sleep(0.01)
            return value

        x = tf.py_function(load, [x], tf.float32)
        x.set_shape((FEATURES,))
        return x, y

    dataset = cached_source(24 * BATCH).map(counted).batch(BATCH)
    report = _fit(dataset, tiny_model(0.01), measure_fixes=8)
    assert len(calls) == 2 * 24 * BATCH
    assert report.what_if is None
    assert any("the pipeline is not run again" in note for note in report.notes), report.notes
    assert tuner_cost.FIX_FLOOR not in report.tuner_cost.parts
    assert report.tuner_cost.after_training_s < report.tuner_cost.budget_s


def test_auto_keeps_time_for_the_fixes_before_their_floor():
    # A fit of about 12 s (60 ms of sleeping input a batch): "auto" gives the
    # fixes 5 % of it, some 0.6 s, and keeps 0.5 s of that for them, so the
    # floor's 0.1 s cannot hold even the shortest replay of 60 ms steps.
    dataset = replayable_source(100 * BATCH, 0.015).batch(BATCH)
    report = _fit(dataset, tiny_model())
    assert report.what_if is None
    assert _noted(report, SHORTEST_FORM, 'less the 0.5 s measure_fixes="auto" keeps for the fixes')
    assert tuner_cost.FIX_FLOOR not in report.tuner_cost.parts


def test_fixes_whose_floor_replay_used_their_cap_are_not_timed_and_say_so(contention_cap_raised):
    # measure_fixes=0.01: the replay for the fixes' floor alone reads four
    # batches of 8 ms of sleeping input from a fresh iterator, over that cap.
    dataset = replayable_source(48 * BATCH, 0.002).batch(BATCH)
    report = _fit(dataset, tiny_model(), measure_fixes=0.01)
    assert report.what_if is not None, report.notes
    cost = report.tuner_cost
    assert cost.parts[tuner_cost.FIX_FLOOR] > 0.01
    assert tuner_cost.FIX_TIMING not in cost.parts or cost.parts[tuner_cost.FIX_TIMING] < 0.01
    assert any(
        note.startswith("The advised fixes were not timed: the replay for their floor")
        for note in report.notes
    ), report.notes
    assert all(
        item.expected_gain is None or item.expected_gain.likely_speedup is None
        for item in report.recommendations
    )


def _holding_strings(each_bytes):
    """A healthy job's pipeline that also holds 96 strings of `each_bytes` (encoded images)."""
    strings = tf.data.Dataset.from_tensor_slices([b"x" * each_bytes] * (24 * BATCH))
    dataset = tf.data.Dataset.zip((cached_source(24 * BATCH), strings))
    return dataset.map(lambda xy, _: xy).batch(BATCH)


def test_a_check_whose_set_up_would_read_large_arrays_is_skipped_and_says_so(contention_check_due):
    # 8 MB of strings, under the size read as a stand-in: reading the graph
    # copies them, which would outlast the check's cap of 0.5 s (and a short
    # fit gives it no more).
    report = _fit(_holding_strings(80_000), tiny_model(0.02))
    assert report.what_if is None
    assert any(
        note.startswith("The contention check did not run: even its shortest form")
        and "reads the pipeline, which holds 8 MB of in-memory arrays" in note
        for note in report.notes
    ), report.notes
    assert "contention check" not in report.tuner_cost.parts


def test_a_check_over_a_large_source_reads_it_in_place(monkeypatch, contention_check_due):
    # 40 MB of strings in one source: read as a stand-in, never copied, so
    # the check runs. Its cap is raised to 3 s, so that a busy machine's
    # slower set-up cannot end it, and 3 s would copy only 36 MB.
    monkeypatch.setattr(what_if_replay, "CONTENTION_LEAST_S", 3.0)
    report = _fit(_holding_strings(420_000), tiny_model(0.02), cost_budget_s=30)
    assert report.what_if is not None and report.what_if.rounds, report.notes


def test_a_check_that_does_not_fit_the_budget_is_skipped_and_says_so(contention_check_due):
    # A healthy job (in-memory batches, 20 ms of sleeping compute) gets the
    # check, unless the budget has no room for it.
    report = _fit(cached_source(24 * BATCH).batch(BATCH), tiny_model(0.02), cost_budget_s=0)
    assert report.what_if is None
    assert _noted(report, SHORTEST_FORM, "cost_budget_s")
    assert report.tuner_cost.budget_s == 0.0


def test_the_report_states_what_the_check_cost(contention_cap_raised):
    # A budget a busy machine's slower set-up cannot exhaust: the check runs.
    report = _fit(cached_source(24 * BATCH).batch(BATCH), tiny_model(0.005), cost_budget_s=30)
    assert report.what_if is not None, report.notes
    cost = report.tuner_cost
    assert cost.budget_s == 30.0
    assert cost.parts["contention check"] > 0
    assert cost.after_training_s >= sum(cost.parts.values()) - 1e-6
    again = kpt.Report.from_json(report.to_json())
    assert again.tuner_cost == cost


def test_the_check_keeps_to_its_own_cap_whatever_the_budget():
    # 20 ms steps and a budget of 30 s, whose share would give the check 100
    # steps a side (some 4 s): its own cap, half a second for a fit of
    # seconds (more for a fit a busy machine stretched: 0.84 s once beside
    # three busy loops), sizes it, or skips it and says so.
    report = _fit(cached_source(24 * BATCH).batch(BATCH), tiny_model(0.02), cost_budget_s=30)
    cost = report.tuner_cost
    cap_s = what_if_replay.contention_cap_s(cost.fit_s)
    assert 10 * cap_s < cost.budget_s, cost.fit_s
    if report.what_if is None:
        assert any("did not run" in note and "contention" in note for note in report.notes)
    assert cost.parts.get("contention check", 0.0) < 3 * cap_s


def test_the_cost_is_in_the_terminal_summary(capsys):
    report = _fit(cached_source(8 * BATCH).batch(BATCH), tiny_model(0.005), epochs=1)
    terminal.print_summary(report)
    shown = capsys.readouterr().out
    assert "The tuner's own work after training took" in shown
    assert f"its budget of {report.tuner_cost.budget_s:.1f} s" in shown


def test_a_check_longer_than_a_second_is_announced_first(capsys, contention_cap_raised):
    # 30 ms steps and a 6 s budget: a check of a few seconds, said before it
    # runs.
    report = _fit(
        cached_source(16 * BATCH).batch(BATCH), tiny_model(0.03), verbose=1, cost_budget_s=6
    )
    shown = capsys.readouterr().out
    assert report.what_if is not None, report.notes
    announced = shown.index("keras-pipeline-tuner: checking contention")
    assert "up to" in shown[announced:].splitlines()[0]
    # Said before the summary that follows the check.
    assert announced < shown.index("The tuner's own work after training took")


CLASS_STANDS = "The contention check did not run: tf.data's live model timed every stage"


def test_a_check_that_cannot_change_the_class_is_skipped_and_says_so():
    # In-memory batches of TensorFlow ops: the live model times all the CPU
    # the input uses, a few hundredths of a core, which can take no more than
    # that share from 60 ms steps: "not input-bound" whatever the check finds.
    # Steps this long keep the wait as well as the bound far under the 5 %
    # boundary, whatever the load: beside three busy loops the fetch of an
    # in-memory batch took up to 1 ms, and with 20 ms steps the wait and the
    # bound reached the boundary's margin, where the check is due.
    report = _fit(cached_source(24 * BATCH).batch(BATCH), tiny_model(0.06), epochs=3)
    judgement = report.judgement
    assert judgement.contention_ceiling < 0.02, judgement
    assert report.what_if is None, (judgement, report.notes)
    assert _noted(report, CLASS_STANDS, 'the verdict stays "not input-bound"')
    assert "contention check" not in report.tuner_cost.parts


def test_a_check_whose_input_could_change_the_class_is_not_skipped_for_it():
    # The same steps beside a map of TensorFlow ops that keeps a core busy:
    # its CPU could take a share of the step that changes the class.
    dataset = cached_source(24 * BATCH).batch(BATCH).map(busy_map(BATCH), num_parallel_calls=2)
    model = tiny_model(0.02)
    tuner = kpt.PipelineTuner(profile="off", verbose=0)
    model.fit(dataset, epochs=3, callbacks=[tuner], verbose=0)
    report = tuner.report
    assert report.judgement.contention_ceiling >= 0.1, report.judgement
    assert not any(note.startswith(CLASS_STANDS) for note in report.notes)


class CountsTraces(keras.Sequential):
    """A model whose `train_step` counts how often it is traced (Python runs only then)."""

    traces = 0
    # Where each trace came from: the tuner's and Keras' frames of its stack.
    callers = []

    def train_step(self, data):
        CountsTraces.traces += 1
        CountsTraces.callers.append(
            [
                f"{frame.filename.rsplit('/', 1)[-1]}:{frame.name}"
                for frame in traceback.extract_stack()
                if "keras_pipeline_tuner" in frame.filename or "/keras/" in frame.filename
            ]
        )
        return super().train_step(data)


def test_the_check_reuses_the_step_fit_traced(contention_cap_raised):
    # Tracing the step again took seconds on a busy machine, most of the
    # check's set-up: the check runs fit's own timed function instead.
    model = CountsTraces(
        [keras.Input((FEATURES,)), keras.layers.Dense(4), Sleep(0.005), keras.layers.Dense(1)]
    )
    model.compile("sgd", "mse")
    CountsTraces.traces = 0
    CountsTraces.callers = []
    report = _fit(cached_source(24 * BATCH).batch(BATCH), model, cost_budget_s=30)
    assert report.what_if is not None, report.notes
    assert report.what_if.replay_steps >= 5
    # Once for fit (the partial last batch of 96 / 4 is none: one shape), and
    # never for the check. On a busy machine the host's work between steps can
    # make the steps_per_execution replay due too, which compiles the step at
    # two settings of its own (beside three busy loops once: three traces).
    check = ("what_if_replay.py", "replay_probe.py")
    fit = [c for c in CountsTraces.callers if not any(f.startswith("probes.py") for f in c)]
    by_check = [c for c in CountsTraces.callers if any(f.startswith(check) for f in c)]
    assert len(fit) == 1 and not by_check, (CountsTraces.callers, report.notes)


def test_later_fits_reuse_the_timed_step_the_first_traced():
    # Keras traces its step once for a model's fits; a timed function of the
    # tuner's own per fit traced it again each time (0.2 s a fit for a step of
    # ~10 ms here). A model compiled again gets a new function, traced anew.
    model = CountsTraces([keras.Input((FEATURES,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    CountsTraces.traces = 0
    CountsTraces.callers = []
    data = cached_source(24 * BATCH).batch(BATCH)
    for _ in range(3):
        report = _fit(data, model, epochs=1, check_contention=False)
        assert report.measurement != "whole-step", report.notes
    assert CountsTraces.traces == 1, CountsTraces.callers
    model.compile("sgd", "mse")
    _fit(data, model, epochs=1, check_contention=False)
    assert CountsTraces.traces == 2, CountsTraces.callers


def test_a_check_over_large_numpy_arrays_never_reads_their_graph(
    contention_cap_raised, monkeypatch
):
    # fit(x, y): Keras' dataset holds the arrays as one from_tensors element
    # (72 MB here), which no stand-in makes lighter. Its graph used to be read
    # in full for the check's set-up (2.9 s for 188 MB), and then refused: the
    # check now replays batches of Keras' own dataset, which holds no code or
    # state of the user's, without reading or copying its graph. Its set-up took
    # over 5 s once in CI, beside the suite's other worker: the check gets
    # 20 s here, within the budget of 30.
    monkeypatch.setattr(what_if_replay, "CONTENTION_LEAST_S", 20.0)
    x = np.zeros((96, 3 * 2**18 // 4), np.float32)
    y = np.zeros((96,), np.float32)
    model = keras.Sequential([keras.Input(x.shape[1:]), Sleep(0.02), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    tuner = kpt.PipelineTuner(verbose=0, profile="off", cost_budget_s=30)
    model.fit(x, y, batch_size=BATCH, epochs=2, callbacks=[tuner], verbose=0)
    report = tuner.report
    assert report.what_if is not None, report.notes
    assert not any("in-memory" in note for note in report.notes), report.notes
