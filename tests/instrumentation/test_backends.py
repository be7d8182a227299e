"""The fit callback on every Keras backend: TensorFlow, JAX and torch.

The backend is fixed when Keras is imported, so each backend's fits run in a
subprocess of their own (`tests/helpers/backend_fit.py`), which prints what the
tuner measured as JSON. Delays are injected (sleeps), so the truth is known.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO_ROOT

pytestmark = [pytest.mark.backends, pytest.mark.multiprocess]

BACKENDS = ("tensorflow", "jax", "torch")
# Per backend: all scenarios in one process (a backend's imports take seconds).
SCENARIOS = {
    "tensorflow": [
        "inputs", "slow", "fast", "steps_per_execution", "identical", "dispatch", "outputs",
        "grain",
    ],
    "jax": [
        "inputs", "slow", "fast", "steps_per_execution", "identical", "dispatch", "advice",
        "custom_loop", "recovery", "profile", "grain",
    ],
    # torch: steps_per_execution must be 1 (Keras says so).
    "torch": [
        "inputs", "slow", "fast", "identical", "dispatch", "advice", "custom_loop", "recovery",
        "profile", "grain",
    ],
}
DELAY_MS = 80.0


def run_backend(backend, scenarios, extra_env=None):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
    env.update(extra_env or {})
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    result = subprocess.run(
        [sys.executable, "-m", "tests.helpers.backend_fit", *scenarios],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module", params=BACKENDS)
def measured(request):
    results = run_backend(request.param, SCENARIOS[request.param])
    assert results["backend"] == request.param
    return results


def test_fit_runs_to_the_end_on_every_input(measured):
    inputs = measured["inputs"]
    expected = {"arrays", "tf.data", "PyDataset"}
    if measured["backend"] == "torch":
        expected.add("DataLoader")
    if measured["backend"] in ("jax", "torch"):
        expected.add("Grain")
    assert set(inputs) == expected
    for name, result in inputs.items():
        assert result["epochs"] == 2, name
        # 6 batches a epoch, 2 epochs, the first step reported apart.
        assert result["steps"] == 11, name
        assert result["measurement"].startswith("in-step"), (name, result["notes"])
        assert result["restored"], name
        assert result["environment"]["backend"] == measured["backend"]


def test_input_bound_source_is_judged_highly_input_bound(measured):
    slow = measured["slow"]
    assert slow["verdict"] == "highly input-bound", slow
    # The loop runs no faster than the source (each batch takes 80 ms); the
    # truth of the input wait is the period between steps (measured apart,
    # from a callback) less the step's compute: with a synchronous fetch
    # (torch) about 80 ms, with a fetch that overlaps the step (TF's injected
    # prefetch, JAX's asynchronous dispatch) 80 ms less the overlap.
    assert slow["period_ms"] >= 0.75 * DELAY_MS, slow
    truth = slow["period_ms"] - slow["compute_ms"]
    assert slow["wait_ms"] == pytest.approx(truth, rel=0.25), slow


def test_source_with_no_delay_is_not_input_bound(measured):
    fast = measured["fast"]
    assert fast["input_fraction"] < 0.05, fast
    assert fast["verdict"] == "not input-bound"


def test_first_step_is_reported_apart_with_its_tracing(measured):
    first = measured["fast"]["first_step"]
    steady_ms = measured["fast"]["compute_ms"]
    # Its parts add up to no more than its wall time.
    assert first["compute_ms"] + first["tracing_ms"] <= first["wall_ms"] * 1.05 + 1, first
    if measured["backend"] == "torch":
        # Eager: nothing to trace, the first step computes as the others do.
        assert first["tracing_ms"] < first["wall_ms"] / 2, first
        return
    # TensorFlow traces the step function, JAX traces and compiles it (on JAX
    # inside a call that returns before the step computes): either takes
    # longer than a step of this small model computes, and is not compute.
    assert first["tracing_ms"] > steady_ms, (first, steady_ms)
    assert first["compute_ms"] < first["tracing_ms"], first


def test_jax_fetch_time_is_reported_apart_from_the_wait(measured):
    if measured["backend"] != "jax":
        pytest.skip("fetch time is reported on the JAX backend only")
    notes = " ".join(measured["slow"]["notes"])
    assert "fetch time (inside next())" in notes
    assert "device sat idle" in notes


def test_steps_per_execution_gives_one_row_per_step(measured):
    if measured["backend"] == "torch":
        pytest.skip("Keras' torch backend requires steps_per_execution=1")
    # 12 batches in 3 calls of 4 steps: every step a row, the first apart.
    assert measured["steps_per_execution"] == {"rows": 11, "first": True}


def test_training_is_identical_with_and_without_the_tuner(measured):
    identical = measured["identical"]
    assert identical["weights"] and identical["history"], identical
    # Validation rows are tagged as validation: 2 epochs of 2 batches, and
    # the training rows hold the training steps only (2 x 8, less the first).
    assert identical["validation_steps"] == 3
    assert identical["train_steps"] == 15


def test_keras_still_dispatches_batch_end_hooks_asynchronously(measured):
    if measured["backend"] == "tensorflow":
        pytest.skip("Keras dispatches callbacks synchronously on TensorFlow")
    assert measured["dispatch"]["off_training_thread"]


def test_jax_steps_end_without_a_thread_of_the_tuners_own(measured):
    if measured["backend"] != "jax":
        pytest.skip("the step-end stamps of JAX's asynchronous dispatch")
    threads = measured["dispatch"]["threads"]
    # One step per call: Keras already waits for each call's logs before its
    # batch-end hooks, where the end is stamped; no thread wakes per step.
    assert threads["1"] == {"names": [], "rows": 11}, threads
    # Several steps per call: Keras sees the last step's logs only; or
    # another callback's batch-end hook runs first and would delay the stamp:
    # a thread of the tuner's waits for each step's outputs.
    waiter = {"names": ["keras-pipeline-tuner-jax-steps"], "rows": 11}
    assert threads["4"] == waiter, threads
    assert threads["1 after another batch-end hook"] == waiter, threads


@pytest.mark.parametrize(
    "loader, finding, backends",
    [
        ("PyDataset", "py-dataset-workers", ("jax", "torch")),
        ("DataLoader", "torch-dataloader-workers", ("torch",)),
    ],
)
def test_loader_on_one_worker_is_advised_more_and_that_helps(measured, loader, finding, backends):
    if measured["backend"] not in backends:
        pytest.skip(f"{loader} advice is checked on {backends}")
    before = measured["advice"][f"{loader} before"]
    after = measured["advice"][f"{loader} after"]
    # One worker, 40 ms a batch against a ~30 ms step: input-bound, and the
    # first recommendation is the loader's own knob.
    assert before["verdict"] == "highly input-bound", before
    assert before["recommendations"][0] == finding, before
    if loader == "DataLoader":
        # Read from the loader object itself.
        assert "num_workers=0" in before["reasons"][0]
    # Following it (more workers) lowers the input fraction (generous margin)
    # and the finding goes away.
    assert after["input_fraction"] < 0.7 * before["input_fraction"], (before, after)
    assert finding not in after["findings"], after


@pytest.fixture(scope="module", params=("jax", "torch"))
def without_tensorflow(request):
    # As a JAX or torch user without TensorFlow installed: importing it fails.
    return run_backend(request.param, ["outputs"], {"KPT_TEST_WITHOUT_TENSORFLOW": "1"})


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


def test_outputs_on_the_tensorflow_backend(measured):
    if measured["backend"] != "tensorflow":
        pytest.skip("JAX and torch outputs are checked without TensorFlow below")
    check_outputs(measured["outputs"])


def test_outputs_need_no_tensorflow_on_jax_and_torch(without_tensorflow):
    outputs = without_tensorflow["outputs"]
    check_outputs(outputs)
    assert not outputs["tensorflow_imported"]
    # The report says what needs TensorFlow.
    assert any(
        note.startswith("No profiler window") and "TensorFlow" in note
        for note in outputs["notes"]
    ), outputs["notes"]


def test_custom_loop_step_is_timed_to_outputs_ready(measured):
    if measured["backend"] == "tensorflow":
        pytest.skip("custom loops on TensorFlow are tested in test_custom_loop.py")
    loop = measured["custom_loop"]
    assert loop["measurement"] == "decorator+iterator"
    # 10 batches, the first (compiling) step reported apart.
    assert loop["steps"] == 9
    # The source sleeps 30 ms a batch; `iterate` times the fetch itself.
    assert loop["wait_ms"] == pytest.approx(30.0, rel=0.25)
    assert loop["verdict"] != "not input-bound"
    # Compute is the step up to its outputs being ready, as the same step
    # timed directly (generous bounds: a shared machine).
    assert 0.4 * loop["direct_ms"] <= loop["compute_ms"] <= 2.5 * loop["direct_ms"], loop
    if measured["backend"] == "jax":
        # Not the dispatch, which returns long before the outputs are ready
        # (0.3-2 ms here, against some 17 ms to the outputs): nearer the step
        # timed directly than the dispatch.
        to_direct = abs(loop["compute_ms"] - loop["direct_ms"])
        assert to_direct < abs(loop["compute_ms"] - loop["dispatch_ms"]), loop


def test_keras_functions_are_restored_after_an_error(measured):
    if measured["backend"] == "tensorflow":
        pytest.skip("tested on TensorFlow in test_interruption.py")
    recovery = measured["recovery"]
    assert recovery["error"] == "bad batch"
    assert recovery["restored"]


def test_second_fit_compiles_nothing_extra(measured):
    if measured["backend"] != "jax":
        pytest.skip("compilations are counted on JAX")
    recovery = measured["recovery"]
    # The counter sees compilations: the first fit compiles its step...
    assert recovery["first_fit_compiles"]["tuner"] > 0
    # ...and a second fit with the tuner compiles no more than a plain one.
    assert recovery["second_fit_compiles"]["tuner"] == recovery["second_fit_compiles"]["plain"]


@pytest.mark.parametrize("window", ["auto", "steps"])
def test_profiler_window_names_the_users_stage_on_jax(measured, window):
    if measured["backend"] == "tensorflow":
        pytest.skip("tested on TensorFlow in tests/profiling/test_profiler_window.py")
    result = measured["profile"][window]
    assert result["verdict"] == "highly input-bound", result
    if measured["backend"] == "torch":
        # Not opened on torch; the report says so.
        assert result["profile"] is None
        assert any(note.startswith("No profiler window") for note in result["notes"])
        return
    profile = result["profile"]
    assert profile is not None, result["notes"]
    trigger = {"auto": "auto: the step clock measured", "steps": "requested: profile=(2, 12)"}
    assert profile["trigger"].startswith(trigger[window])
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


def _grain(measured):
    if "grain" not in measured:
        pytest.skip("this backend's scenarios leave Grain input out")
    return measured["grain"]


@pytest.mark.parametrize("run", ["before", "loop"])
def test_grain_stage_timing_names_the_sleeping_map(measured, run):
    # fit (and a custom loop through tuner.iterate) on a Grain pipeline whose one
    # map sleeps 1.25 ms an element after to_iter_dataset: 80 ms a batch.
    result = _grain(measured)[run]
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
    assert "separate pass over" in result["markdown"], result["markdown"]
    assert "Grain stage timing" in result["terminal"], result["terminal"]
    assert "slowest stage map(slow_parse)" in result["terminal"], result["terminal"]


def test_grain_advised_fix_runs_and_lowers_the_input_fraction(measured):
    grain = _grain(measured)
    before, after = grain["before"], grain["after"]
    # The advised code was run as written (exec) and trained on.
    assert after["input_fraction"] < 0.7 * before["input_fraction"], (before, after)
    assert "grain-sequential-stage" not in after["findings"], after


def test_grain_stage_timing_leaves_training_unchanged(measured):
    assert _grain(measured)["identical"] is True


def test_grain_stage_timing_failure_turns_it_off_and_fit_ends(measured):
    failing = _grain(measured)["failing"]
    assert failing["verdict"] == "highly input-bound", failing
    assert failing["bottleneck"] is None, failing
    assert any(
        note.startswith("Grain stage timing was turned off after a failure")
        and "record store went away" in note
        for note in failing["notes"]
    ), failing["notes"]
