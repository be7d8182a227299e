"""Fits on the Keras backend of this process, with known injected delays; prints JSON.

The Keras backend is fixed when Keras is imported, so tests run this script in
a subprocess per backend (`KERAS_BACKEND=jax python -m tests.helpers.backend_fit
SCENARIO ...`); it prints one JSON object on stdout, one entry per scenario.

Each scenario's truth survives a busy machine: input delays and compute that
matter are sleeps (a sleep needs no CPU), and a delay that must decide a verdict
is far larger than the step around it (80 ms of input against a step of about a
millisecond, or 100 ms of sleeping compute against an in-memory batch). Each
scenario builds its own models, tuners and data, and the runner puts back what
the process shares between them (Keras' session, a profiler left running) after
each one: a scenario that fails reports its error in its own entry, and the
others run as if it had not.
"""

import dataclasses
import gc
import json
import os
import signal
import sys
import threading
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if os.environ.get("KPT_TEST_WITHOUT_TENSORFLOW"):
    # As if TensorFlow were not installed: importing it raises ImportError.
    sys.modules["tensorflow"] = None

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_pipeline_tuner as kpt  # noqa: E402
from tests.helpers import live_model_fits  # noqa: E402

FEATURES = 8
BATCH = 32


def arrays(batches: int, features: int = FEATURES, batch: int = BATCH):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batches * batch, features)).astype(np.float32)
    y = (x.sum(axis=1, keepdims=True) > 0).astype(np.float32)
    return x, y


def _sleep(delay_s: float):
    def sleep(_):
        time.sleep(delay_s)
        return np.float32(0.0)

    return sleep


class SleepingCompute(keras.layers.Layer):
    """Identity whose forward pass sleeps `delay_s`: a compute time load cannot stretch.

    Fed the batch, as real compute is (work that needs no data could start while
    the batch is still being fetched and hide in the input wait). On TensorFlow
    a `numpy_function`, on JAX a `pure_callback` inside the compiled step, on
    torch (eager) a plain sleep.
    """

    def __init__(self, delay_s: float, **kwargs):
        super().__init__(**kwargs)
        self.delay_s = delay_s

    def call(self, inputs):
        backend = keras.backend.backend()
        sleep = _sleep(self.delay_s)
        if backend == "tensorflow":
            import tensorflow as tf

            zero = tf.numpy_function(sleep, [inputs], tf.float32, stateful=True)
            zero.set_shape(())
        elif backend == "jax":
            import jax

            zero = jax.pure_callback(
                sleep, jax.ShapeDtypeStruct((), np.float32), jax.lax.stop_gradient(inputs)
            )
        else:
            # Eager: the step runs this line as it computes.
            sleep(None)
            return inputs
        return inputs + keras.ops.stop_gradient(zero)

    def compute_output_shape(self, input_shape):
        return input_shape


def tiny_model(steps_per_execution: int = 1, features: int = FEATURES, compute_s: float = 0.0):
    """A two-layer model of about a millisecond a step; `compute_s` sleeps in each step."""
    keras.utils.set_random_seed(1)
    layers = [keras.Input((features,))]
    if compute_s:
        layers.append(SleepingCompute(compute_s))
    layers += [keras.layers.Dense(4), keras.layers.Dense(1)]
    model = keras.Sequential(layers)
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=steps_per_execution)
    return model


def slow_batches(batches: int, delay_s: float, features: int = FEATURES, batch: int = BATCH):
    """A tf.data source of whole batches, each `delay_s` late (no prefetch)."""
    import tensorflow as tf

    x, y = arrays(batches, features, batch)

    def generate():
        for i in range(batches):
            time.sleep(delay_s)
            yield x[i * batch : (i + 1) * batch], y[i * batch : (i + 1) * batch]

    return tf.data.Dataset.from_generator(
        generate,
        output_signature=(
            tf.TensorSpec((None, features), tf.float32),
            tf.TensorSpec((None, 1), tf.float32),
        ),
    )


class SlowPyDataset(keras.utils.PyDataset):
    """Batches of (x, y) whose `__getitem__` sleeps `delay_s`."""

    def __init__(self, batches, delay_s, features=FEATURES, batch=BATCH, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y = arrays(batches, features, batch)
        self.batches, self.delay_s, self.batch = batches, delay_s, batch

    def __len__(self):
        return self.batches

    def __getitem__(self, index):
        time.sleep(self.delay_s)
        part = slice(index * self.batch, (index + 1) * self.batch)
        return self.x[part], self.y[part]


def torch_loader(batches, delay_s, num_workers=0, features=FEATURES, batch=BATCH):
    """A torch `DataLoader` over a map-style dataset whose items sleep `delay_s`."""
    import torch

    x, y = arrays(batches, features, batch)

    class SlowDataset(torch.utils.data.Dataset):
        def __len__(self):
            return batches

        def __getitem__(self, index):
            time.sleep(delay_s)
            part = slice(index * batch, (index + 1) * batch)
            return torch.from_numpy(x[part]), torch.from_numpy(y[part])

    return torch.utils.data.DataLoader(
        SlowDataset(),
        batch_size=None,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
    )


def summary(tuner, model=None):
    # With the profiler window's evidence, which may join after fit.
    report = tuner.wait_for_profile()
    train = report.train
    return {
        "verdict": report.verdict.value,
        "input_fraction": report.input_fraction,
        "steps": train.steps,
        "validation_steps": report.validation.steps if report.validation else 0,
        "wait_ms": train.input_wait.median_ms if train.input_wait else None,
        "compute_ms": train.compute.median_ms if train.compute else None,
        "measurement": report.measurement,
        "notes": report.notes,
        "recommendations": [r.id for r in report.recommendations],
        "findings": [f.id for f in report.findings],
        "environment": report.environment,
        # Keras' own function is back on the model after fit.
        "restored": model is None or "Timed" not in type(model.train_function).__name__,
        "fetch_floor": report.judgement.fetch_floor_how if report.judgement else None,
        "verdict_line": report.judgement.line if report.judgement else "",
        "first_step": dataclasses.asdict(report.first_steps["train"])
        if "train" in report.first_steps
        else None,
    }


def inputs():
    """fit runs to the end on arrays, tf.data, a PyDataset (and a DataLoader on torch)."""
    import tensorflow as tf

    x, y = arrays(6)
    given = {
        "arrays": dict(x=x, y=y, batch_size=BATCH),
        "tf.data": dict(x=tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)),
        "PyDataset": dict(x=SlowPyDataset(6, 0.0)),
    }
    if keras.backend.backend() == "torch":
        given["DataLoader"] = dict(x=torch_loader(6, 0.0))
    if keras.backend.backend() in ("jax", "torch"):
        import grain

        # Keras 3 takes Grain datasets directly.
        given["Grain"] = dict(
            x=grain.MapDataset.source(
                [(x[i * BATCH : (i + 1) * BATCH], y[i * BATCH : (i + 1) * BATCH]) for i in range(6)]
            )
        )
    results = {}
    for name, data in given.items():
        tuner, model = kpt.PipelineTuner(verbose=0), tiny_model()
        history = model.fit(epochs=2, callbacks=[tuner], verbose=0, **data)
        results[name] = {"epochs": len(history.history["loss"]), **summary(tuner, model)}
    return results


class _PeriodProbe(keras.callbacks.Callback):
    """Times the training loop from outside the tuner: one batch begin to the next."""

    def __init__(self):
        super().__init__()
        self.begins = []

    def on_train_batch_begin(self, batch, logs=None):
        self.begins.append(time.perf_counter())


# The input-bound fit: each batch 80 ms late against a step of about a millisecond.
SLOW_S = 0.08
# The fit that is not input-bound: in-memory batches against 100 ms of (sleeping)
# compute: even a fetch stretched to a few milliseconds by a busy machine stays
# under the 5 % boundary. Thirty of them: on JAX and torch Keras slices the
# next batch between steps, and beside three busy loops one stall there read
# 7.4 % over nine steps.
FAST_COMPUTE_S = 0.1
FAST_BATCHES = 30


def slow():
    """Highly input-bound: a PyDataset whose batches come `SLOW_S` late, a tiny model.

    Returns the tuner's summary and the loop's median period between batch
    begins (steady state: the source's pace).
    """
    tuner, probe = kpt.PipelineTuner(verbose=0), _PeriodProbe()
    # One worker: Keras fetches on the training thread on JAX and torch, and
    # through tf.data's prefetch on TensorFlow (which overlaps the short step).
    tiny_model().fit(SlowPyDataset(16, SLOW_S), epochs=1, callbacks=[tuner, probe], verbose=0)
    period_ms = float(np.median(np.diff(probe.begins[2:]))) * 1e3
    return {"period_ms": period_ms, **summary(tuner)}


def fast():
    """Not input-bound: in-memory arrays, which Keras slices ahead, and a 100 ms step."""
    tuner = kpt.PipelineTuner(verbose=0)
    x, y = arrays(FAST_BATCHES)
    tiny_model(compute_s=FAST_COMPUTE_S).fit(
        x, y, batch_size=BATCH, epochs=1, callbacks=[tuner], verbose=0
    )
    return summary(tuner)


# The cached fit's step: 100 ms of (sleeping) compute, so that a busy machine's
# scheduling delays cannot make the wait of a ready batch a tenth of it. Beside
# three busy loops sub-millisecond steps read 33-44 % "input" from the run
# queue alone, and on torch a fetch took 2-5 ms beyond its floor at 10-40 ms
# steps (the training thread waiting for Python's lock while Keras' callback
# thread, which holds it, waits for a core).
CACHED_COMPUTE_S = 0.1


def cached():
    """Not input-bound: a cached, prefetched tf.data pipeline into 100 ms steps.

    The wait at the fetch is then mostly the fetch of a ready batch itself,
    which the tuner measures after training (or its replay does).
    """
    import tensorflow as tf

    x, y = arrays(10)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).cache().prefetch(2)
    tuner = kpt.PipelineTuner(verbose=0)
    tiny_model(compute_s=CACHED_COMPUTE_S).fit(data, epochs=3, callbacks=[tuner], verbose=0)
    return summary(tuner)


def first_step():
    """The first step of a tiny model, which traces (and on JAX compiles) the step."""
    tuner = kpt.PipelineTuner(verbose=0)
    x, y = arrays(8)
    tiny_model().fit(x, y, batch_size=BATCH, epochs=1, callbacks=[tuner], verbose=0)
    return summary(tuner)


def steps_per_execution():
    tuner = kpt.PipelineTuner(verbose=0)
    x, y = arrays(12)
    model = tiny_model(steps_per_execution=4)
    model.fit(x, y, batch_size=BATCH, epochs=1, callbacks=[tuner], verbose=0)
    return {"rows": tuner.clock.stats("train").steps, "first": "train" in tuner.clock.first_steps}


def identical():
    """Weights and history with and without the tuner, with validation."""
    x, y = arrays(8)
    results = []
    for callbacks in ([], [kpt.PipelineTuner(verbose=0)]):
        model = tiny_model()
        history = model.fit(
            x, y, batch_size=BATCH, epochs=2, validation_data=(x[:64], y[:64]),
            shuffle=False, callbacks=callbacks, verbose=0,
        )
        results.append((model.get_weights(), history.history, callbacks))
    (plain_weights, plain_history, _), (weights, history, (tuner,)) = results
    plain_next, tuned_next = _next_fit_after(tuned=False), _next_fit_after(tuned=True)
    return {
        "weights": all(np.array_equal(a, b) for a, b in zip(plain_weights, weights)),
        "history": plain_history == history,
        "validation_steps": tuner.report.validation.steps if tuner.report.validation else 0,
        "train_steps": tuner.report.train.steps,
        "next_fit": _same_training(plain_next, tuned_next),
        "next_fit_verdict": tuned_next[3],
    }


def _next_fit_after(tuned: bool):
    """A fit, with or without the tuner, on a Python generator that draws from a NumPy
    generator, then a plain fit on the same draws: what the second one trains on and gets.

    The tuner asks for its fixes to be timed (`measure_fixes=True`) on a slow,
    input-bound source: it must not draw from the user's generator after training.
    """
    rng = np.random.default_rng(5)

    def batches(count):
        for _ in range(count):
            time.sleep(0.02)
            x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
            yield x, (x.sum(axis=1, keepdims=True) > 0).astype(np.float32)

    model = tiny_model()
    callbacks = [kpt.PipelineTuner(verbose=0, measure_fixes=True)] if tuned else []
    model.fit(batches(12), steps_per_epoch=6, epochs=2, callbacks=callbacks, verbose=0)
    verdict = callbacks[0].report.verdict.value if tuned else None
    history = model.fit(batches(6), steps_per_epoch=6, epochs=1, verbose=0)
    return model.get_weights(), history.history, float(rng.random()), verdict


def _same_training(a, b) -> bool:
    return (
        all(np.array_equal(x, y) for x, y in zip(a[0], b[0])) and a[1] == b[1] and a[2] == b[2]
    )


class _ThreadProbe(keras.callbacks.Callback):
    """Records on which thread Keras runs batch-end hooks."""

    async_safe = True

    def __init__(self):
        super().__init__()
        self.threads = set()

    def on_train_batch_end(self, batch, logs=None):
        self.threads.add(threading.get_ident())


class _TunerThreads(keras.callbacks.Callback):
    """Names the tuner's own threads alive while steps run."""

    async_safe = True

    def __init__(self):
        super().__init__()
        self.names = set()

    def on_train_batch_begin(self, batch, logs=None):
        self.names.update(
            thread.name for thread in threading.enumerate()
            if thread.name.startswith("keras-pipeline-tuner")
        )


def dispatch():
    """Whether Keras still runs batch-end hooks off the training thread with the tuner.

    Also which threads of its own the tuner runs during fit, with one step and
    with four steps per call, and the rows it measured.
    """
    probe = _ThreadProbe()
    x, y = arrays(4)
    tiny_model().fit(
        x, y, batch_size=BATCH, epochs=1, callbacks=[kpt.PipelineTuner(verbose=0), probe],
        verbose=0,
    )
    threads = {}
    x, y = arrays(12)
    cases = {"1": (1, False), "1 after another batch-end hook": (1, True), "4": (4, False)}
    if keras.backend.backend() == "torch":
        # Keras' torch backend requires steps_per_execution=1.
        del cases["4"]
    for name, (steps, behind) in cases.items():
        tuner, names = kpt.PipelineTuner(verbose=0), _TunerThreads()
        callbacks = [_ThreadProbe(), tuner, names] if behind else [tuner, names]
        tiny_model(steps_per_execution=steps).fit(
            x, y, batch_size=BATCH, epochs=1, callbacks=callbacks, verbose=0
        )
        threads[name] = {"names": sorted(names.names), "rows": tuner.report.train.steps}
    return {"off_training_thread": threading.get_ident() not in probe.threads, "threads": threads}


# A slow loader: 60 ms a batch, against 30 ms of (sleeping) compute a step.
LOADER_S = 0.06
LOADER_COMPUTE_S = 0.03


def _loader_advice(make, before: int, after: int) -> dict:
    """Fits on a loader with `before` workers, then with `after`, as the advice says.

    One worker leaves each step waiting 30-60 ms for its batch (60 ms a batch,
    the step computes 30); four load a batch every 15 ms, ahead of the step.
    """
    results = {}
    for label, workers in (("before", before), ("after", after)):
        tuner = kpt.PipelineTuner(verbose=0)
        tiny_model(compute_s=LOADER_COMPUTE_S).fit(
            make(workers), epochs=2, callbacks=[tuner], verbose=0
        )
        report = tuner.report
        results[label] = {
            "workers": workers,
            "input_fraction": report.input_fraction,
            "verdict": report.verdict.value,
            "recommendations": [r.id for r in report.recommendations],
            "findings": [f.id for f in report.findings],
            "reasons": [f.reason for f in report.findings],
            "gain": [
                (r.expected_gain.basis, r.expected_gain.statement) if r.expected_gain else None
                for r in report.recommendations
            ],
        }
    return results


def advice_pydataset():
    """A `PyDataset` on one worker, then on four threads."""
    return _loader_advice(lambda workers: SlowPyDataset(12, LOADER_S, workers=workers), 1, 4)


def advice_dataloader():
    """A torch `DataLoader` with `num_workers=0`, then with four worker processes."""
    return _loader_advice(lambda workers: torch_loader(12, LOADER_S, workers), 0, 4)


def outputs():
    """Every output of a fit with a log_dir: report file, event files, summary, CLI."""
    import contextlib
    import io
    import tempfile

    from tensorboard.backend.event_processing import event_accumulator

    log_dir = tempfile.mkdtemp()
    x, y = arrays(6)
    printed = io.StringIO()
    tuner = kpt.PipelineTuner(log_dir=log_dir, verbose=1)
    with contextlib.redirect_stdout(printed):
        tiny_model().fit(x, y, batch_size=BATCH, epochs=2, callbacks=[tuner], verbose=0)
    run_dir = os.path.join(log_dir, "pipeline_tuner")
    events = event_accumulator.EventAccumulator(
        run_dir, size_guidance={event_accumulator.TENSORS: 0, event_accumulator.IMAGES: 0}
    )
    events.Reload()
    tags = events.Tags()
    wait_steps = [event.step for event in events.Tensors("input_pipeline/input_wait_ms")]
    command = subprocess_report(log_dir)
    return {
        "report_file": os.path.isfile(os.path.join(log_dir, "report.json")),
        # Tag: the TensorBoard plugin that shows it (scalars, text, images).
        "plugins": {
            tag: events.SummaryMetadata(tag).plugin_data.plugin_name
            for tag in tags.get("tensors", [])
        },
        "wait_steps": wait_steps,
        "summary": printed.getvalue(),
        "notes": tuner.report.notes,
        "failures": dict(tuner.guard.failures),
        "cli": command,
        "tensorflow_imported": sys.modules.get("tensorflow") is not None,
    }


def subprocess_report(log_dir):
    """`keras-pipeline-tuner report LOGDIR`, in a process of its own."""
    import subprocess

    result = subprocess.run(
        [sys.executable, "-m", "keras_pipeline_tuner.cli", "report", log_dir],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return {"returncode": result.returncode, "stdout": result.stdout}


# The custom loop's source sleeps this long a batch; its step chains matmuls
# (some 5-20 ms here, more on a busy machine).
LOOP_SOURCE_S = 0.05
LOOP_MATMULS = 10


def custom_loop():
    """`@tuner.instrument` on a JAX (jax.jit) or torch step, `tuner.iterate` on a slow source.

    Also times the same step directly (outputs ready), for the truth of compute.
    """
    tuner = kpt.PipelineTuner(verbose=0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 512)).astype(np.float32)

    def source(batches=10):
        for _ in range(batches):
            time.sleep(LOOP_SOURCE_S)
            yield x

    if keras.backend.backend() == "jax":
        import jax
        import jax.numpy as jnp

        w = jnp.asarray(rng.normal(size=(512, 512)).astype(np.float32) / 32)

        def chain(x):
            # Each matmul needs the previous one: nothing to fold away.
            for _ in range(LOOP_MATMULS):
                x = jnp.tanh(x @ w)
            return x.mean()

        plain = jax.jit(chain)
        step = tuner.instrument(jax.jit(chain))
        wait = jax.block_until_ready
    else:
        import torch

        w = torch.from_numpy(rng.normal(size=(512, 512)).astype(np.float32) / 32)

        def chain(x):
            x = torch.from_numpy(x)
            for _ in range(LOOP_MATMULS):
                x = torch.tanh(x @ w)
            return x.mean()

        plain = chain
        step = tuner.instrument(chain)

        def wait(outputs):
            return outputs

    wait(plain(x))
    direct, dispatch = [], []
    for _ in range(7):
        began = time.perf_counter()
        outputs = plain(x)
        dispatch.append(time.perf_counter() - began)
        wait(outputs)
        direct.append(time.perf_counter() - began)
    for batch in tuner.iterate(source()):
        step(batch)
    report = tuner.close()
    return {
        "measurement": report.measurement,
        "steps": report.train.steps,
        "wait_ms": report.train.input_wait.median_ms,
        "compute_ms": report.train.compute.median_ms,
        "direct_ms": float(np.median(direct)) * 1e3,
        "dispatch_ms": float(np.median(dispatch)) * 1e3,
        "verdict": report.verdict.value,
    }


def _rows_handed_over(drive) -> dict:
    """What reaches the run's one way in (`Run.add_rows`) while `drive()` trains.

    Every timing source (each backend's fit source, the custom loop's) hands
    the run the same thing: per call, `(kind, rows, wall_s, called_at)`, rows
    of `(start, ready, end)` seconds; the run keeps the first call apart.
    """
    from keras_pipeline_tuner.run.lifecycle import Run

    calls = []
    add_rows = Run.add_rows

    def spy(self, kind, rows, wall_s, called_at, tracing_s=None):
        calls.append((kind, np.asarray(rows, dtype=np.float64).reshape(-1, 3), wall_s))
        return add_rows(self, kind, rows, wall_s, called_at, tracing_s)

    Run.add_rows = spy
    try:
        report = drive()
    finally:
        Run.add_rows = add_rows
    rows = np.concatenate([r for _, r, _ in calls]) if calls else np.zeros((0, 3))
    later = np.concatenate([r for _, r, _ in calls[1:]]) if len(calls) > 1 else rows[:0]
    return {
        "kinds": sorted({kind for kind, _, _ in calls}),
        "rows": int(rows.shape[0]),
        "first_call_rows": int(calls[0][1].shape[0]) if calls else 0,
        "ordered": bool(np.all(rows[:, 0] <= rows[:, 2])),
        "ready_seen": bool(np.all(np.isfinite(later[:, 1]))),
        "ready_inside": bool(np.all((later[:, 0] <= later[:, 1]) & (later[:, 1] <= later[:, 2]))),
        "median_wait_ms": float(np.median(later[:, 1] - later[:, 0]) * 1e3) if len(later) else None,
        "wall_covers_rows": all(
            wall + 1e-3 >= float(r[-1, 2] - r[0, 0]) for _, r, wall in calls
        ),
        "report_steps": report.train.steps,
        "first_step_apart": "train" in report.first_steps,
    }


def source_rows():
    """The rows each timing source hands the run: fit, and a custom loop's `iterate`."""
    def fit():
        tuner = kpt.PipelineTuner(verbose=0)
        tiny_model().fit(SlowPyDataset(8, SLOW_S), epochs=1, callbacks=[tuner], verbose=0)
        return tuner.report

    def loop():
        tuner = kpt.PipelineTuner(verbose=0)
        for _ in tuner.iterate(SlowPyDataset(8, SLOW_S)):
            time.sleep(0.001)
        return tuner.close()

    return {"fit": _rows_handed_over(fit), "loop": _rows_handed_over(loop)}


# The user's Python timed during training: a 20 ms generator, a 15 ms PyDataset.
USER_GENERATOR_S = 0.02
USER_GET_ITEM_S = 0.015
USER_BATCHES = 8


class CountingPyDataset(SlowPyDataset):
    """A `SlowPyDataset` that counts the calls of its `__getitem__`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = 0
        self._lock = threading.Lock()

    def __getitem__(self, index):
        with self._lock:
            self.calls += 1
        return super().__getitem__(index)


class _TrainingBegins(keras.callbacks.Callback):
    """Sets `state["training"]` when fit begins, before the tuner's hook runs."""

    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_train_begin(self, logs=None):
        self.state["training"] = True


def _user_fit(data, with_tuner, epochs=1, callbacks=()):
    """One fit of a tiny model on `data`; what the tuner timed of the user's Python."""
    tuner = (
        kpt.PipelineTuner(verbose=0, profile="off", what_if=False, check_contention=False)
        if with_tuner
        else None
    )
    model = tiny_model()
    callbacks = list(callbacks) + ([tuner] if tuner else [])
    history = model.fit(data, epochs=epochs, callbacks=callbacks, verbose=0)
    timed = [dataclasses.asdict(t) for t in tuner.report.user_calls] if tuner else None
    notes = tuner.report.notes if tuner else None
    return history.history, model.get_weights(), timed, notes


def user_calls():
    """The user's Python, timed where fit calls it, with the calls counted by the user's code.

    A Python generator given to fit (Keras iterates it in Python on JAX and
    torch, inside `from_generator` on TensorFlow), a `PyDataset` on two worker
    threads, and a tf.data map of a `tf.py_function`: each fit once without
    the tuner and once with it.
    """
    results = {}
    x, y = arrays(USER_BATCHES)

    def generator_fit(with_tuner):
        counted = {"calls": 0}

        def batches():
            for i in range(USER_BATCHES):
                counted["calls"] += 1
                time.sleep(USER_GENERATOR_S)
                yield x[i * BATCH : (i + 1) * BATCH], y[i * BATCH : (i + 1) * BATCH]

        return _user_fit(batches(), with_tuner) + (counted["calls"],)

    def py_dataset_fit(with_tuner):
        data = CountingPyDataset(USER_BATCHES // 2, USER_GET_ITEM_S, workers=2)
        return _user_fit(data, with_tuner, epochs=2) + (data.calls,)

    def py_function_fit(with_tuner):
        import tensorflow as tf

        # Counted from the start of training: before it, on JAX and torch,
        # Keras reads a batch to build the model and drops that iterator, whose
        # read-ahead (one element or two, by the machine's load) tf.data makes.
        counted = {"calls": 0, "training": False}

        def slow_identity(value):
            counted["calls"] += counted["training"]
            time.sleep(LOAD_DELAY_S)
            return value

        def load(features, label):
            features = tf.py_function(slow_identity, [features], tf.float32)
            features.set_shape((FEATURES,))
            return features, label

        dataset = tf.data.Dataset.from_tensor_slices(arrays(4, batch=4)).map(load).batch(4)
        fit = _user_fit(dataset, with_tuner, callbacks=[_TrainingBegins(counted)])
        return fit + (counted["calls"],)

    for name, fit in (
        ("generator", generator_fit),
        ("PyDataset", py_dataset_fit),
        ("py_function", py_function_fit),
    ):
        plain_history, plain_weights, _, _, plain_calls = fit(False)
        history, weights, timed, notes, calls = fit(True)
        results[name] = {
            "calls": calls,
            "plain_calls": plain_calls,
            "history": history == plain_history,
            "weights": all(np.array_equal(a, b) for a, b in zip(plain_weights, weights)),
            "timed": timed,
            "notes": notes,
        }
    from tensorflow.python.ops import script_ops

    registry = script_ops.FuncRegistry.__dict__["__call__"]
    results["registry_restored"] = registry.__qualname__ == "FuncRegistry.__call__" and (
        registry.__module__ == script_ops.__name__
    )
    return results


class FailingPyDataset(SlowPyDataset):
    """Raises ValueError when batch `fail_at` is loaded."""

    def __init__(self, batches, fail_at, **kwargs):
        super().__init__(batches, 0.0, **kwargs)
        self.fail_at = fail_at

    def __getitem__(self, index):
        if index == self.fail_at:
            raise ValueError("bad batch")
        return super().__getitem__(index)


def _compilations():
    """Counts XLA compilations in this process (JAX backend), or None elsewhere."""
    if keras.backend.backend() != "jax":
        return None
    import jax

    counted = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kwargs: counted.append(event)
        if event == "/jax/core/compile/backend_compile_duration"
        else None
    )
    return counted


def recovery():
    """Keras' own functions after an error in the user's data."""
    x, y = arrays(6)
    failed = tiny_model()
    error = None
    try:
        failed.fit(FailingPyDataset(6, 3), epochs=1, callbacks=[kpt.PipelineTuner(verbose=0)],
                   verbose=0)
    except ValueError as raised:
        error = str(raised)
    restored = "Timed" not in type(failed.train_function).__name__
    # A plain fit afterwards is not timed into the failed fit's run.
    history = failed.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    return {"error": error, "restored": restored, "later_fit": len(history.history["loss"])}


class _CtrlCAt(keras.callbacks.Callback):
    """Sends the process a real SIGINT (a user's Ctrl-C) in one step's batch-end hook.

    Not `async_safe`: the hook runs on the training thread, between steps,
    where the KeyboardInterrupt then lands.
    """

    def __init__(self, batch):
        super().__init__()
        self.batch = batch

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.batch:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)


class CtrlCPyDataset(SlowPyDataset):
    """Sends the process a real SIGINT while batch `at` is loaded."""

    def __init__(self, batches, at, **kwargs):
        super().__init__(batches, 0.0, **kwargs)
        self.at = at

    def __getitem__(self, index):
        if index == self.at:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)
        return super().__getitem__(index)


def ctrl_c():
    """Ctrl-C in a batch-end hook and in the batch fetch: Keras' own function is left.

    Python's SIGINT handler is installed for the fits, as a terminal's process
    has it (a background job starts with SIGINT ignored).
    """
    results = {}
    # A signal handled while the garbage collector runs a finalizer raises
    # inside it, where Python prints and drops the KeyboardInterrupt: collected
    # beforehand, the interrupt reaches the fit as a user's Ctrl-C does.
    gc.collect()
    gc.disable()
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for where, data, callbacks in (
            ("batch-end hook", SlowPyDataset(8, 0.0), [_CtrlCAt(3)]),
            ("batch fetch", CtrlCPyDataset(8, 4), []),
        ):
            model = tiny_model()
            model.fit(SlowPyDataset(2, 0.0), epochs=1, verbose=0)
            keras_train = model.train_function
            tuner = kpt.PipelineTuner(verbose=0)
            interrupted = False
            try:
                model.fit(data, epochs=1, callbacks=[tuner, *callbacks], verbose=0)
            except KeyboardInterrupt:
                interrupted = True
            results[where] = {
                "interrupted": interrupted,
                "restored": model.train_function is keras_train,
            }
    finally:
        signal.signal(signal.SIGINT, handler)
        gc.enable()
    return results


def compiles():
    """What a first and a second fit compile, with the tuner and without (JAX)."""
    x, y = arrays(6)
    counted = _compilations()
    first, second = {}, {}
    for label, make_callbacks in (
        ("plain", lambda: []), ("tuner", lambda: [kpt.PipelineTuner(verbose=0)])
    ):
        model = tiny_model()
        before = len(counted)
        model.fit(x, y, batch_size=BATCH, epochs=1, callbacks=make_callbacks(), verbose=0)
        middle = len(counted)
        model.fit(x, y, batch_size=BATCH, epochs=1, callbacks=make_callbacks(), verbose=0)
        first[label], second[label] = middle - before, len(counted) - middle
    return {"first_fit": first, "second_fit": second}


LOAD_DELAY_S = 0.01


def load(x, y):
    """The user's slow loader: a py_function that sleeps `LOAD_DELAY_S` per element."""
    import tensorflow as tf

    def slow_identity(value):
        time.sleep(LOAD_DELAY_S)
        return value

    x = tf.py_function(slow_identity, [x], tf.float32)
    x.set_shape((FEATURES,))
    return x, y


def _profiled(profile_arg) -> dict:
    """A slow `map(load)` tf.data pipeline, fit with the profiler window on `profile_arg`.

    40 ms of loading a batch against a step of about a millisecond: highly
    input-bound, with `map(load)` the stage that holds the time.
    """
    import tensorflow as tf

    x, y = arrays(40, batch=4)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).map(load).batch(4)
    tuner = kpt.PipelineTuner(verbose=0, profile=profile_arg)
    tiny_model().fit(dataset, epochs=1, callbacks=[tuner], verbose=0)
    report = tuner.wait_for_profile()
    evidence = report.profile
    return {
        **summary(tuner),
        "profile": None if evidence is None else {
            "trigger": evidence.trigger,
            "steps": len(evidence.steps),
            "input_fraction": evidence.input_fraction,
            "bottleneck": evidence.bottleneck,
            "stages": [it.stage for it in evidence.iterators],
            "xplane": os.path.isfile(evidence.xplane_path),
        },
        "top": None if not report.recommendations else {
            "id": report.recommendations[0].id,
            "title": report.recommendations[0].title,
            "evidence": str(report.recommendations[0].evidence),
        },
    }


# A Grain pipeline whose one map sleeps: 64 elements of 1.25 ms, 80 ms a batch
# when the map runs on the reading thread.
GRAIN_BATCH = 64
GRAIN_BATCHES = 12
GRAIN_ELEMENT_S = 0.00125


def grain_parse():
    """The map of the Grain scenarios: sleeps, looks an element up."""
    x, y = arrays(GRAIN_BATCHES, FEATURES, GRAIN_BATCH)

    def slow_parse(index):
        time.sleep(GRAIN_ELEMENT_S)
        return x[index], y[index]

    return slow_parse


def grain_sequential(slow_parse):
    """The map after to_iter_dataset: it runs on the thread that reads the batches."""
    import grain

    return (
        grain.MapDataset.range(GRAIN_BATCHES * GRAIN_BATCH)
        .to_iter_dataset(grain.ReadOptions(num_threads=0))
        .map(slow_parse)
        .batch(GRAIN_BATCH)
    )


def grain_report(tuner):
    import io

    from keras_pipeline_tuner.outputs.markdown import render_markdown
    from keras_pipeline_tuner.outputs.terminal import print_summary

    report = tuner.report
    terminal = io.StringIO()
    print_summary(report, file=terminal)
    profile = kpt.Report.from_json(report.to_json()).profile
    return {
        "verdict": report.verdict.value,
        "input_fraction": report.input_fraction,
        "findings": [f.id for f in report.findings],
        "recommendations": [r.id for r in report.recommendations],
        "fix": report.recommendations[0].fix if report.recommendations else "",
        "bottleneck": profile.bottleneck if profile else None,
        "stages": {
            row.stage: {"calls": row.calls, "self_ms": row.self_ms, "waiting": row.waiting}
            for row in (profile.iterators if profile else [])
        },
        "summary": profile.summary() if profile else "",
        "trigger": profile.trigger if profile else "",
        "timed_in_training": getattr(profile, "timed_in_training", None),
        "markdown": render_markdown(report),
        "terminal": terminal.getvalue(),
        "notes": report.notes,
    }


# The Grain advice's fit computes (sleeps) this long a step: the batches the
# advised threads read ahead (some 5 ms each) then keep ahead of the step.
GRAIN_COMPUTE_S = 0.03


def grain_advice():
    """Grain's own stage timing names the sleeping map; the advised fix, run, helps."""
    import grain

    results = {}
    tuner = kpt.PipelineTuner(verbose=0)
    model = tiny_model(compute_s=GRAIN_COMPUTE_S)
    model.fit(grain_sequential(grain_parse()), epochs=2, callbacks=[tuner], verbose=0)
    results["before"] = grain_report(tuner)
    # The advised code, run as written on the stages before to_iter_dataset.
    namespace = {
        "grain": grain,
        "slow_parse": grain_parse(),
        "ds_before_to_iter_dataset": grain.MapDataset.range(GRAIN_BATCHES * GRAIN_BATCH),
    }
    fix = results["before"]["fix"]
    exec(fix, namespace)  # noqa: S102 - the advice is code to run.
    if "ds" not in namespace:
        raise AssertionError(f"the advised fix made no `ds`: {fix!r} ({results['before']})")
    tuner = kpt.PipelineTuner(verbose=0)
    tiny_model(compute_s=GRAIN_COMPUTE_S).fit(
        namespace["ds"].batch(GRAIN_BATCH), epochs=2, callbacks=[tuner], verbose=0
    )
    results["after"] = grain_report(tuner)
    return results


def grain_identical():
    """Grain timing fit's own iterators leaves training as it was: a plain fit gives the same."""
    histories, weights = [], []
    for callbacks in ([kpt.PipelineTuner(verbose=0)], []):
        model = tiny_model()
        history = model.fit(
            grain_sequential(grain_parse()), epochs=2, callbacks=callbacks, verbose=0
        )
        histories.append(history.history)
        weights.append(model.get_weights())
    return {
        "history": histories[0] == histories[1],
        "weights": all(np.array_equal(a, b) for a, b in zip(*weights)),
    }


def grain_failing():
    """Reading Grain's timing fails during training (injected): that feature is
    turned off, fit ends normally and trains as without the tuner.
    """
    from keras_pipeline_tuner.profiling import grain_stages

    def fails(recorder):
        raise OSError("the execution summary went away")

    histories, weights = [], []
    for callbacks in ([], [kpt.PipelineTuner(verbose=0)]):
        model = tiny_model()
        reads = grain_stages.stage_summary
        grain_stages.stage_summary = fails
        try:
            history = model.fit(
                grain_sequential(grain_parse()), epochs=2, callbacks=callbacks, verbose=0
            )
        finally:
            grain_stages.stage_summary = reads
        histories.append(history.history)
        weights.append(model.get_weights())
    return {
        **grain_report(callbacks[0]),
        "history": histories[0] == histories[1],
        "weights": all(np.array_equal(a, b) for a, b in zip(*weights)),
    }


# A Grain MapDataset given to fit as it is, whose map sleeps: Keras reads it on
# Grain's 16 read threads (`grain.ReadOptions()`), 48 batches of 8 elements of
# 20 ms, some 10 ms a batch against a step of a millisecond or two.
GRAIN_MAP_BATCH = 8
GRAIN_MAP_BATCHES = 48
GRAIN_MAP_ELEMENT_S = 0.02


class _CountsTraining(keras.callbacks.Callback):
    """Counts the map's calls from the start of training, before the tuner's hook runs.

    Before fit begins, Keras reads the dataset to learn its batches' shapes
    and drops that iterator; the batches Grain's read threads had started by
    then (as many as the machine's load let start) end after it: they are
    waited for first, so that only training's calls are counted.
    """

    def __init__(self, counted):
        super().__init__()
        self.counted = counted

    def on_train_begin(self, logs=None):
        for thread in threading.enumerate():
            if thread.name.startswith("grain-prefetch"):
                thread.join(timeout=30)
        with self.counted["lock"]:
            self.counted["calls"] = 0


def grain_map_fit(with_tuner):
    """One fit on the sleeping Grain MapDataset; what the map was called, what the tuner saw."""
    import grain

    x, y = arrays(GRAIN_MAP_BATCHES, FEATURES, GRAIN_MAP_BATCH)
    counted = {"calls": 0, "lock": threading.Lock()}

    def slow_parse(index):
        with counted["lock"]:
            counted["calls"] += 1
        time.sleep(GRAIN_MAP_ELEMENT_S)
        return x[index], y[index]

    dataset = (
        grain.MapDataset.range(GRAIN_MAP_BATCHES * GRAIN_MAP_BATCH)
        .map(slow_parse)
        .batch(GRAIN_MAP_BATCH)
    )
    tuner = kpt.PipelineTuner(verbose=0) if with_tuner else None
    model = tiny_model()
    callbacks = [_CountsTraining(counted)] + ([tuner] if tuner else [])
    history = model.fit(dataset, epochs=2, callbacks=callbacks, verbose=0)
    # The recorders the user's dataset's nodes hold once fit has returned.
    nodes, node = [], dataset
    while node is not None:
        nodes.append(type(vars(node).get("_stats")).__name__)
        node = node.parents[0] if node.parents else None
    return {
        "history": history.history,
        "weights": model.get_weights(),
        "calls": counted["calls"],
        "report": grain_report(tuner) if tuner else None,
        "recorders": nodes,
    }


def grain_in_training():
    """A fit on a Grain MapDataset: Grain times the stages of fit's own iterators."""
    plain = grain_map_fit(False)
    tuned = grain_map_fit(True)
    report = tuned["report"]
    return {
        **report,
        "calls": tuned["calls"],
        "plain_calls": plain["calls"],
        "history": tuned["history"] == plain["history"],
        "weights": all(np.array_equal(a, b) for a, b in zip(plain["weights"], tuned["weights"])),
        "recorders": tuned["recorders"],
        "plain_recorders": plain["recorders"],
    }


def grain_loop():
    """A custom loop over the Grain dataset through `tuner.iterate`."""
    tuner = kpt.PipelineTuner(verbose=0)
    weights = np.ones((FEATURES, 64), np.float32)
    step = tuner.instrument(lambda x, y: float((x @ weights).sum()))
    for x, y in tuner.iterate(grain_sequential(grain_parse())):
        step(x, y)
    tuner.close()
    return grain_report(tuner)


REPLAY_COMPUTE_S = 0.01


def replay():
    """The contention check after fit on this backend: the fit's own step, state restored.

    For Keras' batches of NumPy arrays and a shuffled tf.data dataset, a model
    with dropout and adam: a fit with the tuner (the check on, as by
    default) then a plain fit, against two plain fits, bit for bit.
    """
    from keras_pipeline_tuner.advice import verdict
    from keras_pipeline_tuner.after_training import what_if_replay

    def make(source):
        keras.utils.set_random_seed(3)
        # 10 ms of (sleeping) compute a step: a busy machine's scheduling
        # delays cannot make the wait decide (it did at 46 % of sub-millisecond
        # steps beside three busy loops), which would leave no check to test.
        model = keras.Sequential(
            [
                keras.Input((FEATURES,)),
                SleepingCompute(REPLAY_COMPUTE_S),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dropout(0.3),
                keras.layers.Dense(1),
            ]
        )
        model.compile("adam", "mse", metrics=["mae"])
        x, y = arrays(16, batch=8)
        if source == "arrays":
            return model, (x, y, 8)
        import tensorflow as tf

        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=1)
        return model, (dataset.batch(8).prefetch(2),)

    def two_fits(source, tuned):
        model, data = make(source)
        # A budget load cannot exhaust: beside three busy loops the check's
        # set-up once outgrew the default 2 s before it timed a step.
        tuner = kpt.PipelineTuner(
            verbose=0, profile="off", measure_fixes=False, cost_budget_s=60
        )
        model.fit(*data, epochs=3, callbacks=[tuner] if tuned else [], verbose=0)
        history = model.fit(*data, epochs=1, verbose=0).history
        weights = [np.asarray(weight) for weight in model.get_weights()]
        return history, weights, tuner.report if tuned else None

    # Whether a fit this short allows the check its time is tested apart
    # (tests/after_training/test_replay_wherever_safe.py); here it must run, to
    # show what it runs and what it leaves. Beside three busy loops its shortest
    # form (0.5-1.7 s) outgrew a quarter of these fits, its usual bound, and it
    # was skipped: it may take up to four fits' time here, and only here (the
    # process's other scenarios keep the usual bound). A check that cannot
    # change the verdict has a cap of its own, at least 0.5 s, which its set-up
    # outgrew there too: 30 s here. Where the pipeline's measured CPU bounds
    # the check below a class change it is skipped (tested apart): here it is
    # due whatever it could find.
    usual_share = what_if_replay.CONTENTION_NEEDED_FIT_SHARE
    usual_least = what_if_replay.CONTENTION_LEAST_S
    usual_due = verdict.check_can_change_class
    found = {}
    sources = ["arrays"] if os.environ.get("KPT_TEST_WITHOUT_TENSORFLOW") else [
        "arrays", "tf.data"
    ]
    for source in sources:
        plain = two_fits(source, False)
        what_if_replay.CONTENTION_NEEDED_FIT_SHARE = 4.0
        what_if_replay.CONTENTION_LEAST_S = 30.0
        verdict.check_can_change_class = lambda judgement, step_ms: True
        try:
            tuned = two_fits(source, True)
        finally:
            what_if_replay.CONTENTION_NEEDED_FIT_SHARE = usual_share
            what_if_replay.CONTENTION_LEAST_S = usual_least
            verdict.check_can_change_class = usual_due
        report = tuned[2]
        found[source] = {
            "history": plain[0] == tuned[0],
            "weights": all(np.array_equal(a, b) for a, b in zip(plain[1], tuned[1])),
            "method": report.what_if.method if report.what_if else None,
            "checked": report.what_if.method == what_if_replay.CONTENTION_METHOD
            if report.what_if else False,
            "replay_steps": report.what_if.replay_steps if report.what_if else 0,
            "rounds": len(report.what_if.rounds) if report.what_if else 0,
            "replay_fetch_ms": report.what_if.replay_input_wait.median_ms
            if report.what_if else None,
            "notes": report.notes,
        }
    return found


SCENARIOS = {
    "inputs": inputs,
    "slow": slow,
    "fast": fast,
    "cached": cached,
    "first_step": first_step,
    "steps_per_execution": steps_per_execution,
    "identical": identical,
    "dispatch": dispatch,
    "advice_pydataset": advice_pydataset,
    "advice_dataloader": advice_dataloader,
    "outputs": outputs,
    "custom_loop": custom_loop,
    "recovery": recovery,
    "ctrl_c": ctrl_c,
    "compiles": compiles,
    "profile_auto": lambda: _profiled("auto"),
    "profile_steps": lambda: _profiled((2, 12)),
    "grain_advice": grain_advice,
    "grain_identical": grain_identical,
    "grain_failing": grain_failing,
    "grain_loop": grain_loop,
    "grain_in_training": grain_in_training,
    "source_rows": source_rows,
    "user_calls": user_calls,
    "live_model": live_model_fits.live_model,
    "replay": replay,
}


def _run(name: str) -> dict:
    """One scenario's outcome: what it returned, or the error it raised; and its time."""
    began = time.perf_counter()
    try:
        outcome = {"result": SCENARIOS[name]()}
    except Exception:  # noqa: BLE001 - reported in this scenario's entry, not the others'.
        outcome = {"error": traceback.format_exc()}
    outcome["seconds"] = round(time.perf_counter() - began, 2)
    _reset_shared_state()
    return outcome


def _reset_shared_state() -> None:
    """Puts back what one process's scenarios share, whatever the last one left."""
    keras.backend.clear_session()
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        try:
            # A profiler session left running would refuse the next window.
            tf.profiler.experimental.stop()
        except Exception:  # noqa: BLE001 - none was running: the usual case.
            pass


def main(names):
    if keras.backend.backend() == "torch":
        import torch

        # Two torch threads beside the other processes of a shared 2-core
        # machine oversubscribe it (steps 5-10x slower); one keeps steps steady.
        torch.set_num_threads(1)
    results = {"backend": keras.backend.backend()}
    for name in names:
        results[name] = _run(name)
    sys.stdout.write(json.dumps(results, default=str) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
