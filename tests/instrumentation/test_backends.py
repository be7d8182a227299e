"""The fit callback on every Keras backend: TensorFlow, JAX and torch.

The backend is fixed when Keras is imported, so each backend's fits run in a
subprocess of their own (`tests/helpers/backend_fit.py`), which prints what the
tuner measured as JSON. Delays are injected sleeps that dominate the step, so
the truth is known and a busy machine cannot change it.

One process per backend runs every scenario the session selected for it (a
backend's imports take seconds), each on its own models and data, and reports
each one's outcome apart: every test reads one scenario, and a scenario that
fails fails its own test only.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO_ROOT

pytestmark = [pytest.mark.backends, pytest.mark.multiprocess]

BACKENDS = ("tensorflow", "jax", "torch")
# The processes: a backend, and JAX and torch as a user without TensorFlow has them.
WITHOUT_TENSORFLOW = " without TensorFlow"
_ENVIRONMENT = {
    f"{backend}{WITHOUT_TENSORFLOW}": {"KPT_TEST_WITHOUT_TENSORFLOW": "1"}
    for backend in ("jax", "torch")
}
SLOW_MS = 80.0
LOOP_SOURCE_MS = 50.0


# The scenarios every run of the suite checks on each backend: what fit is
# given, the verdict both ways, the first step, identical training, outputs.
# The others (loaders' advice, custom loops, the profiler window, Grain,
# outputs without TensorFlow) are marked slow: CI runs them in its second pass.
CORE = (
    "inputs", "slow", "fast", "cached", "first_step", "identical", "outputs", "source_rows",
    "user_calls", "live_model", "replay",
)


def on(scenario, *backends):
    """Runs the test once per backend (all by default), on that backend's `scenario`."""
    backends = backends or BACKENDS

    def decorate(test):
        test = pytest.mark.parametrize("backend", backends)(test)
        if scenario not in CORE or any(WITHOUT_TENSORFLOW in name for name in backends):
            test = pytest.mark.slow(test)
        return pytest.mark.scenario(scenario)(test)

    return decorate


def run_backend(process, scenarios):
    """Runs `scenarios` in one subprocess for `process` (a backend); their outcomes."""
    backend = process.split(" ")[0]
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
    env.update(_ENVIRONMENT.get(process, {}))
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    result = subprocess.run(
        [sys.executable, "-m", "tests.helpers.backend_fit", *scenarios],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode != 0:
        return {"crashed": result.stderr[-4000:]}
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def outcomes(request):
    """`outcomes(process)`: every selected scenario's outcome in that process, run once."""
    selected = {}
    for item in request.session.items:
        marker = item.get_closest_marker("scenario")
        callspec = getattr(item, "callspec", None)
        if marker is None or callspec is None or item.module is not request.module:
            continue
        process = callspec.params["backend"]
        selected.setdefault(process, [])
        if marker.args[0] not in selected[process]:
            selected[process].append(marker.args[0])
    ran = {}

    def outcome_of(process):
        if process not in ran:
            ran[process] = run_backend(process, selected.get(process, []))
        return ran[process]

    return outcome_of


@pytest.fixture
def measured(request, backend, outcomes):
    """The result of this test's scenario on `backend`; its error fails this test only."""
    scenario = request.node.get_closest_marker("scenario").args[0]
    found = outcomes(backend)
    if "crashed" in found:
        pytest.fail(f"The {backend} process ended before reporting:\n{found['crashed']}")
    outcome = found[scenario]
    if "error" in outcome:
        pytest.fail(f"Scenario {scenario!r} on {backend} raised:\n{outcome['error']}")
    return outcome["result"]


@on("inputs")
def test_fit_runs_to_the_end_on_every_input(backend, measured):
    expected = {"arrays", "tf.data", "PyDataset"}
    if backend == "torch":
        expected.add("DataLoader")
    if backend in ("jax", "torch"):
        expected.add("Grain")
    assert set(measured) == expected
    for name, result in measured.items():
        assert result["epochs"] == 2, name
        # 6 batches a epoch, 2 epochs, the first step reported apart.
        assert result["steps"] == 11, name
        assert result["measurement"].startswith("in-step"), (name, result["notes"])
        assert result["restored"], name
        assert result["environment"]["backend"] == backend


@on("slow")
def test_input_bound_source_is_judged_highly_input_bound(backend, measured):
    slow = measured
    assert slow["verdict"] == "highly input-bound", slow
    # The loop runs no faster than the source (each batch takes 80 ms); the
    # truth of the input wait is the period between steps (measured apart,
    # from a callback) less the step's compute: with a synchronous fetch
    # (JAX, torch) about 80 ms, with a fetch that overlaps the step
    # (TensorFlow's prefetch) 80 ms less the overlap.
    assert slow["period_ms"] >= 0.75 * SLOW_MS, slow
    truth = slow["period_ms"] - slow["compute_ms"]
    assert slow["wait_ms"] == pytest.approx(truth, rel=0.25), slow
    if backend == "jax":
        # The time inside next() is reported apart from the wait.
        notes = " ".join(slow["notes"])
        assert "fetch time (inside next())" in notes
        assert "device sat idle" in notes


@on("fast")
def test_source_with_no_delay_is_not_input_bound(backend, measured):
    assert measured["input_fraction"] < 0.05, measured
    assert measured["verdict"] == "not input-bound"


@on("cached")
def test_a_healthy_cached_pipeline_is_not_input_bound_beyond_its_measured_fetch(
    backend, measured
):
    # The fetch of a ready batch may be much of the wait, and is then measured:
    # by the replay where it ran, else through the fit's own kind of fetch
    # (Keras' iterator on JAX and torch, TensorFlow's fetch op in a compiled
    # function). Where the whole wait is already under the boundary, the floor
    # could only lower it, and is not measured.
    assert measured["verdict"] == "not input-bound", measured["verdict_line"]
    floor = measured["fetch_floor"]
    if floor is None:
        assert measured["input_fraction"] < 0.04, measured["verdict_line"]
        return
    assert floor == "the replay" or any(
        how in floor for how in ("Keras' iterator", "TensorFlow's fetch op")
    ), measured["verdict_line"]


@on("source_rows")
@pytest.mark.parametrize("driver", ["fit", "loop"])
def test_every_timing_source_hands_the_run_the_same_rows(backend, driver, measured):
    """Each backend's fit source and the custom loop's speak one contract to the run."""
    rows = measured[driver]
    # Eight batches, each 80 ms late: one (start, ready, end) row per step, the
    # first call's kept apart by the run, every later one's ready observed.
    assert rows["kinds"] == ["train"] and rows["rows"] == 8, rows
    assert rows["first_call_rows"] == 1 and rows["first_step_apart"], rows
    assert rows["report_steps"] == 7, rows
    assert rows["ordered"] and rows["ready_seen"] and rows["ready_inside"], rows
    assert 0.9 * SLOW_MS <= rows["median_wait_ms"] < 2 * SLOW_MS, rows
    # A call's wall time covers its rows (from its fetch to its last step's end).
    assert rows["wall_covers_rows"], rows


@on("user_calls")
@pytest.mark.parametrize("given", ["generator", "PyDataset", "py_function"])
def test_the_users_python_is_timed_during_training_and_never_called_again(
    backend, given, measured
):
    """A generator given to fit, a thread-backed PyDataset, a py_function map."""
    fit = measured[given]
    # The user's function ran as often as in the same fit without the tuner
    # (the py_function counted from the start of training), and training was
    # the same.
    assert fit["calls"] == fit["plain_calls"], fit
    assert fit["history"] and fit["weights"], fit
    (timed,) = fit["timed"]
    if given == "generator":
        # Keras reads two batches to learn their shapes before fit begins; the
        # six batches training reads after them are each one timed `next()`.
        assert timed["stage"] == "generator()" and timed["function"] == "batches", timed
        assert timed["source"] == "generator next" and timed["calls"] == 6, timed
        expected_ms = 20
    elif given == "PyDataset":
        assert timed["function"] == "CountingPyDataset.__getitem__", timed
        # Two epochs of four batches, on Keras' worker threads.
        assert timed["calls"] == 8 and timed["per_batch_calls"] == 1.0, timed
        expected_ms = 15
    else:
        assert timed["stage"] == "map(load)" and timed["function"] == "slow_identity", timed
        assert timed["source"] == "tf.py_function" and timed["calls"] == 16, timed
        assert fit["calls"] == 16, fit
        assert timed["per_batch_calls"] == 4.0, timed
        expected_ms = 10
    assert 0.9 * expected_ms <= timed["wall_ms_median"] <= 3 * expected_ms, timed
    # Sleeping takes no CPU: the figure is the thread's own, not the process's.
    assert timed["cpu_ms"] < timed["wall_ms"] / 2, timed
    assert measured["registry_restored"]


@on("first_step")
def test_first_step_is_reported_apart_with_its_tracing(backend, measured):
    first = measured["first_step"]
    steady_ms = measured["compute_ms"]
    # Its parts add up to no more than its wall time.
    assert first["compute_ms"] + first["tracing_ms"] <= first["wall_ms"] * 1.05 + 1, first
    if backend == "torch":
        # Eager: nothing to trace, the first step computes as the others do.
        assert first["tracing_ms"] < first["wall_ms"] / 2, first
        return
    # TensorFlow traces the step function, JAX traces and compiles it (on JAX
    # inside a call that returns before the step computes): either takes
    # longer than a step of this small model computes, and is not compute.
    assert first["tracing_ms"] > steady_ms, (first, steady_ms)
    assert first["compute_ms"] < first["tracing_ms"], first


@on("steps_per_execution", "tensorflow", "jax")
def test_steps_per_execution_gives_one_row_per_step(backend, measured):
    # 12 batches in 3 calls of 4 steps: every step a row, the first apart.
    # (Keras' torch backend requires steps_per_execution=1.)
    assert measured == {"rows": 11, "first": True}


@on("identical")
def test_training_is_identical_with_and_without_the_tuner(backend, measured):
    assert measured["weights"] and measured["history"], measured
    # Validation rows are tagged as validation: 2 epochs of 2 batches, and
    # the training rows hold the training steps only (2 x 8, less the first).
    assert measured["validation_steps"] == 3
    assert measured["train_steps"] == 15
    # A later plain fit after a tuned, input-bound fit on a generator that
    # draws from a NumPy generator trains as after a plain fit: the tuner drew
    # nothing of the user's after training.
    assert measured["next_fit_verdict"] == "highly input-bound", measured
    assert measured["next_fit"], measured


@on("dispatch", "jax", "torch")
def test_keras_still_dispatches_batch_end_hooks_asynchronously(backend, measured):
    # (Keras dispatches callbacks synchronously on TensorFlow.)
    assert measured["off_training_thread"]
    if backend != "jax":
        return
    # JAX: the step-end stamps of its asynchronous dispatch.
    threads = measured["threads"]
    # One step per call: Keras already waits for each call's logs before its
    # batch-end hooks, where the end is stamped; no thread wakes per step.
    assert threads["1"] == {"names": [], "rows": 11}, threads
    # Several steps per call: Keras sees the last step's logs only; or
    # another callback's batch-end hook runs first and would delay the stamp:
    # a thread of the tuner's waits for each step's outputs.
    waiter = {"names": ["keras-pipeline-tuner-jax-steps"], "rows": 11}
    assert threads["4"] == waiter, threads
    assert threads["1 after another batch-end hook"] == waiter, threads


def check_loader_advice(measured, finding):
    before, after = measured["before"], measured["after"]
    # One worker, 60 ms a batch against a 30 ms step: input-bound, and the
    # first recommendation is the loader's own knob.
    assert before["verdict"] == "highly input-bound", before
    assert before["recommendations"][0] == finding, before
    # Following it (more workers) lowers the input fraction (generous margin)
    # and the finding goes away.
    assert after["input_fraction"] < 0.7 * before["input_fraction"], (before, after)
    assert finding not in after["findings"], after
    # kpt.tune is named for the measured gain (a PyDataset's is also
    # predicted from its calls timed in training: see test_fix_timing).
    _, statement = before["gain"][0]
    assert "kpt.tune(loader) measures it" in statement, statement
    return before


@on("advice_pydataset", "jax", "torch")
def test_pydataset_on_one_worker_is_advised_more_and_that_helps(backend, measured):
    check_loader_advice(measured, "py-dataset-workers")


@on("advice_dataloader", "torch")
def test_dataloader_without_workers_is_advised_more_and_that_helps(backend, measured):
    before = check_loader_advice(measured, "torch-dataloader-workers")
    # Read from the loader object itself.
    assert "num_workers=0" in before["reasons"][0]


def check_outputs(outputs):
    assert outputs["failures"] == {}, outputs["failures"]
    assert outputs["report_file"]
    plugins = outputs["plugins"]
    for name in ("input_wait_ms", "compute_ms", "step_ms", "input_fraction"):
        assert plugins[f"input_pipeline/{name}"] == "scalars"
    assert plugins["input_pipeline/report"] == "text"
    assert plugins["input_pipeline/timeline"] == "images"
    # One scalar per measured training step (2 epochs of 6, the first apart).
    assert outputs["wait_steps"] == list(range(1, 12))
    assert outputs["summary"].startswith("Input pipeline: ")
    assert outputs["cli"]["returncode"] == 0
    assert outputs["cli"]["stdout"].startswith("Input pipeline: ")


@on("outputs", "tensorflow")
def test_outputs_on_the_tensorflow_backend(backend, measured):
    check_outputs(measured)


@on("outputs", *_ENVIRONMENT)
def test_outputs_need_no_tensorflow_on_jax_and_torch(backend, measured):
    # As a JAX or torch user without TensorFlow installed: importing it fails.
    check_outputs(measured)
    assert not measured["tensorflow_imported"]
    # The report says what needs TensorFlow.
    assert any(
        note.startswith("No profiler window") and "TensorFlow" in note
        for note in measured["notes"]
    ), measured["notes"]


@on("custom_loop", "jax", "torch")
def test_custom_loop_step_is_timed_to_outputs_ready(backend, measured):
    # (Custom loops on TensorFlow are tested in test_custom_loop.py.)
    loop = measured
    assert loop["measurement"] == "decorator+iterator"
    # 10 batches, the first (compiling) step reported apart.
    assert loop["steps"] == 9
    # The source sleeps 50 ms a batch; `iterate` times the fetch itself: at
    # least the sleep, and not the step's compute on top of it.
    assert 0.95 * LOOP_SOURCE_MS <= loop["wait_ms"] < 1.5 * LOOP_SOURCE_MS, loop
    assert loop["verdict"] != "not input-bound"
    # Compute is the step up to its outputs being ready, as the same step
    # timed directly: at least a good part of it, and short of it plus the
    # source's sleep, which compute would hold if the fetch leaked into it
    # (timed apart, the two vary on a busy machine: 29 ms against 11 ms once).
    assert 0.4 * loop["direct_ms"] <= loop["compute_ms"], loop
    assert loop["compute_ms"] < loop["direct_ms"] + 0.6 * LOOP_SOURCE_MS, loop
    if backend == "jax":
        # Not the dispatch, which returns long before the outputs are ready:
        # nearer the step timed directly than the dispatch.
        to_direct = abs(loop["compute_ms"] - loop["direct_ms"])
        assert to_direct < abs(loop["compute_ms"] - loop["dispatch_ms"]), loop


@on("recovery", "jax", "torch")
def test_keras_functions_are_restored_after_an_error(backend, measured):
    # (Tested on TensorFlow in test_interruption.py.)
    assert measured["error"] == "bad batch"
    assert measured["restored"]
    assert measured["later_fit"] == 1


@on("ctrl_c", "jax", "torch")
def test_ctrl_c_leaves_keras_own_function_on_the_model(backend, measured):
    # (On TensorFlow: test_interruption.py.) A real SIGINT between steps, and
    # while a batch is fetched (inside Keras' function on JAX, before it on torch).
    for where, result in measured.items():
        assert result == {"interrupted": True, "restored": True}, (where, result)


@on("compiles", "jax")
def test_second_fit_compiles_nothing_extra(backend, measured):
    # The counter sees compilations: the first fit compiles its step...
    assert measured["first_fit"]["tuner"] > 0
    # ...and a second fit with the tuner compiles no more than a plain one.
    assert measured["second_fit"]["tuner"] == measured["second_fit"]["plain"]


def check_profiled(backend, result, trigger):
    assert result["verdict"] == "highly input-bound", result
    if backend == "torch":
        # Not opened on torch; the report says so.
        assert result["profile"] is None
        assert any(note.startswith("No profiler window") for note in result["notes"])
        return
    profile = result["profile"]
    assert profile is not None, result["notes"]
    assert profile["trigger"].startswith(trigger)
    assert profile["xplane"]
    # The analyzer found the marked steps and the stages as the user wrote them.
    assert profile["steps"] >= 5, profile
    assert "map(load)" in profile["stages"], profile
    assert profile["bottleneck"] == "map(load)", profile
    assert profile["input_fraction"] > 0.5, profile
    # The top recommendation is about that stage, and rests on the profile too.
    top = result["top"]
    # The stage's fix: parallelise it, or (first, where its work is deterministic)
    # cache it; one recommendation per stage, the other folded into its evidence.
    assert top["id"] in ("sequential-map", "cache-missing"), top
    assert "map(load)" in top["title"], top
    assert "map(load) holds" in top["evidence"], top
    # The markers span whole calls: the report says what the window's share is.
    assert any("upper bound" in note for note in result["notes"]), result["notes"]


# (On TensorFlow: tests/profiling/test_profiler_window.py.)
@on("profile_auto", "jax", "torch")
def test_automatic_profiler_window_names_the_users_stage_on_jax(backend, measured):
    check_profiled(backend, measured, "auto: the step clock measured")


@on("profile_steps", "jax", "torch")
def test_requested_profiler_window_names_the_users_stage_on_jax(backend, measured):
    check_profiled(backend, measured, "requested: profile=(2, 12)")


def check_grain_stage_timing(result):
    # A Grain pipeline whose one map sleeps 1.25 ms an element after
    # to_iter_dataset: 80 ms a batch.
    assert result["verdict"] == "highly input-bound", result
    assert result["bottleneck"] == "map(slow_parse)", result
    timed = result["stages"]["map(slow_parse)"]
    # Grain's own time per element, against the known sleep (generous margin).
    per_element_ms = timed["self_ms"] / timed["calls"]
    assert 1.0 <= per_element_ms <= 5.0, timed
    assert result["stages"]["to_iter_dataset"]["waiting"], result["stages"]
    assert result["recommendations"][0] == "grain-sequential-stage", result
    assert "grain.ReadOptions(num_threads=" in result["fix"], result["fix"]
    assert "map(slow_parse)" in result["summary"], result["summary"]
    assert "Grain stage timing" in result["markdown"], result["markdown"]
    # Timed on the iterators training read, not in a pass of the tuner's own.
    assert result["timed_in_training"] is True, result
    assert "during training" in result["trigger"], result["trigger"]
    assert "batches training read" in result["markdown"], result["markdown"]
    assert "separate pass" not in result["markdown"], result["markdown"]
    assert "Grain stage timing" in result["terminal"], result["terminal"]
    assert "slowest stage map(slow_parse)" in result["terminal"], result["terminal"]


@on("grain_in_training")
def test_grain_stages_are_timed_on_the_iterators_fit_reads(backend, measured):
    """A MapDataset whose map sleeps, given to fit as it is, with the default tuner."""
    result = measured
    assert result["verdict"] == "highly input-bound", result
    assert result["bottleneck"] == "map(slow_parse)", result
    assert result["timed_in_training"] is True, result
    # Of two epochs of 48 batches, the first 64 batches fit read were timed.
    assert "first 64 batches fit read during training" in result["trigger"], result
    assert "then turned off" in result["trigger"], result["trigger"]
    output = result["stages"]["to_iter_dataset"]
    assert output["waiting"] and output["calls"] == 64, result["stages"]
    timed = result["stages"]["map(slow_parse)"]
    # Grain's own time per element, against the known 20 ms sleep (generous:
    # Grain's 16 read threads share two busy cores).
    assert 20.0 <= timed["self_ms"] / timed["calls"] <= 100.0, timed
    # The elements of those batches, and of the ones Grain's threads had begun.
    assert 64 * 8 <= timed["calls"] <= 2 * 48 * 8, timed
    # Read on Grain's threads: the advice is about them.
    assert result["recommendations"][0] == "grain-read-threads", result
    # The user's map ran exactly as often as in the same fit without the
    # tuner (counted from the start of training), and training was the same.
    assert result["calls"] == result["plain_calls"] == 2 * 48 * 8, result
    assert result["history"] and result["weights"], result
    # The dataset's nodes hold the recorders they hold after a plain fit.
    assert result["recorders"] == result["plain_recorders"], result
    assert "_ExecutionStats" not in result["recorders"], result


@on("grain_advice")
def test_grain_stage_timing_names_the_sleeping_map_and_its_advice_helps(backend, measured):
    before, after = measured["before"], measured["after"]
    check_grain_stage_timing(before)
    # The advised code was run as written (exec) and trained on.
    assert after["input_fraction"] < 0.7 * before["input_fraction"], (before, after)
    assert "grain-sequential-stage" not in after["findings"], after


# Grain's stage timing itself is the same on every backend: the fits that
# show how Keras feeds Grain run on each, the rest on JAX (Grain's home).
@on("grain_loop", "jax")
def test_grain_stage_timing_in_a_custom_loop(backend, measured):
    check_grain_stage_timing(measured)


@on("grain_identical", "jax")
def test_grain_stage_timing_leaves_training_unchanged(backend, measured):
    assert measured == {"history": True, "weights": True}


@on("grain_failing", "jax")
def test_grain_stage_timing_failure_turns_it_off_and_fit_ends(backend, measured):
    failing = measured
    assert failing["verdict"] == "highly input-bound", failing
    assert failing["bottleneck"] is None, failing
    assert any(
        note.startswith("Grain stage timing was turned off after a failure")
        and "execution summary went away" in note
        for note in failing["notes"]
    ), failing["notes"]
    assert failing["history"] and failing["weights"], failing


@on("live_model", *BACKENDS)
def test_report_names_the_users_map_with_what_autotune_chose(backend, measured):
    """tf.data's live model of fit's own iterator, on every backend, no profiler needed."""
    table = measured["stage_table"]
    assert table is not None, measured["notes"]
    assert not measured["profiled"]
    (row,) = [row for row in table["rows"] if row["stage"].startswith("map(decode")]
    # The map is the pipeline's one real work: matrix products, TensorFlow ops.
    assert row["ms_per_element"] > 0 and row["elements"] > 0, row
    assert row["share"] > 0.5, table
    assert row["parallelism"] is not None and 1 <= row["parallelism"], row
    assert row["parallelism_max"] is None or row["parallelism"] <= row["parallelism_max"], row
    assert table["reads"] >= 1 and table["batches"] > 0, table
    # Scalars over time, and training the same with and without the tuner.
    assert any(tag.endswith("map_decode/ms_per_element") for tag in measured["stage_scalars"])
    assert measured["weights"] and measured["history"], measured
    # The reader holds the fit's iterator weakly: none outlives Keras' hold on it.
    assert measured["alive_tuned"] == measured["alive_plain"], measured
    # A single pass shorter than the steady read's step is read at its end.
    assert measured["unknown_length_stages"], measured


@on("replay")
@pytest.mark.parametrize("source", ["arrays", "tf.data"])
def test_the_replay_check_runs_the_fits_own_step_and_leaves_training_unchanged(
    backend, source, measured
):
    """On JAX the jitted step, on torch the compiled one, on TensorFlow the timed function."""
    found = measured[source]
    if source == "arrays" and backend != "tensorflow":
        # Keras slices the arrays on the training thread, between steps: nothing
        # of the input runs beside the step, so there is no contention to check.
        assert not found["checked"], found
        assert any("slices NumPy arrays on the training thread" in note
                   for note in found["notes"]), found["notes"]
        assert found["weights"] and found["history"], found
        return
    assert found["checked"], found["notes"]
    assert found["replay_steps"] >= 5 and found["rounds"] >= 1, found
    if source == "tf.data":
        # The replayed batches come as fit's came, through tf.data and Keras'
        # adapter (about a millisecond here), not from a list (a microsecond):
        # the share is defined against that in-memory copy, as the floor is.
        # A busy machine only lengthens the fetch.
        assert found["replay_fetch_ms"] > 0.05, found
    # The next fit trains as it would have: weights and history, bit for bit.
    assert found["weights"] and found["history"], found
