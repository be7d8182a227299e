"""The input's true cost against the tuner's figure, on the pipelines users write, per backend.

The input's true share of a step is measured from outside the tuner:

    truth = 1 - (step on an in-memory copy of the same batches) / (step on the real input)

same model, same process, fits alternated (real, copy, real, copy, ...), the
median of each side's steady step period over its later epochs (the first
epoch of each fit is left out: cache fill), where a step period is the time
from one step's end to the next one's, each epoch's first two steps left out
as the tuner's steady state leaves them out: the iterator's set-up at an
epoch's start is reported apart by the tuner ("set-up"), not in its share. The
truth with each epoch's set-up counted in is printed beside it. Beside each real fit a
tuned fit (`PipelineTuner(verbose=0)`, defaults) of the same pipeline gives
the tuner's input share, its class and its "with input free: at most N x"
figure, which is checked against what free input delivered, `1 / (1 - truth)`.

Whole fits alternated a second or more apart leave the truth open to the
machine's drift: steps here slow by up to 30 % for seconds at a time, and one
case's truth read 0.0 % and 4.6 % in runs an hour apart. Where the
input is a tf.data pipeline, the truth is therefore measured within one fit
as well, and that figure is the one the tuner is judged against: the fit reads
`tf.data.Dataset.choose_from_datasets` over the real pipeline and its
in-memory copy in alternating blocks of `BLOCK` steps (about half a second),
and a block's period is timed over its steps after the first `BLOCK_SKIP`
(where the pipeline fills, or drains, its buffers: no step position showed a
difference once past them). Each real block is set against the mean of the
copy blocks on either side, and the truth is one less the median of those
ratios. A torch DataLoader alternates with its batches kept in memory through
one Python generator, so Keras fetches both alike. NumPy arrays, which Keras
slices itself, keep the fits' truth alone.

Cases (each fits a small model for a few seconds):

- `augment` (TensorFlow): the keras.io augmentation recipe, Keras' `RandomFlip`
  and `RandomRotation` in a tf.data `map`, into a small CNN.
- `numpy` (TensorFlow): `fit(x, y)` from NumPy arrays into a small CNN.
- `guide` (TensorFlow): a tf.data map of TensorFlow ops into a small CNN,
  parallel, prefetched (the guide's shape).
- `generator` (torch): a tf.data generator that sleeps 80 ms a batch, small CNN.
- `loader` (torch): a torch DataLoader (`num_workers=0`) of in-memory
  tensors into a step of a few ms.
- `jax_map` (JAX): a CPU-heavy tf.data map of TensorFlow ops, small CNN.
- `python_map` (TensorFlow): a parallel `py_function` map computing in pure
  Python (about 3 ms a batch, holding the GIL), prefetched: it keeps ahead of
  the step, so it costs the step through the CPU, not as a wait.
- `loop` (TensorFlow): the `guide` pipeline and model in a custom loop
  (`tf.GradientTape` step, `@tuner.instrument`, `tuner.iterate`).
- `workers` (torch): a DataLoader with two worker processes, each sample
  computed with NumPy, into a small CNN.
- `cached` (every backend): a cached, prefetched in-memory pipeline: healthy.

Acceptance (issue: contention measured where it happens): the tuner's share
within max(0.05, 25 % of truth) of the truth, the class right (either side is
fair within 0.02 of a boundary), and "at most N x" within [0.67, 1.5] of what
free input delivered.

    python bench/contention_truth.py [--cases augment numpy ...] [--rounds 3] [--busy-loops 0]
                                     [--why]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

import busy_loops

BACKEND_OF = {
    "augment": "tensorflow",
    "numpy": "tensorflow",
    "guide": "tensorflow",
    "cached": "tensorflow",
    "generator": "torch",
    "loader": "torch",
    "cached_torch": "torch",
    "jax_map": "jax",
    "python_map": "tensorflow",
    "loop": "tensorflow",
    "workers": "torch",
    "cached_jax": "jax",
}
EPOCHS = 3
# The interleaved truth: steps a block, the steps at each block's start left
# out, pairs of blocks (real, copy) a measurement.
BLOCK = 48
BLOCK_SKIP = 16
BLOCK_PAIRS = 8
BOUNDARIES = (0.05, 0.2)
FAIR_NEAR_BOUNDARY = 0.02


def _classify(fraction: float) -> str:
    if fraction >= BOUNDARIES[1]:
        return "highly"
    return "moderately" if fraction >= BOUNDARIES[0] else "not"


def _class_right(tuner: float, truth: float) -> bool:
    if _classify(tuner) == _classify(truth):
        return True
    return any(abs(truth - edge) <= FAIR_NEAR_BOUNDARY for edge in BOUNDARIES)


def _case(name: str):
    """(model factory, real input factory, fit kwargs) of a case; imports the backend."""
    import keras
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)

    def cnn(side=32, channels=3, filters=16):
        def make():
            keras.utils.set_random_seed(0)
            net = keras.Sequential(
                [
                    keras.Input((side, side, channels)),
                    keras.layers.Conv2D(filters, 3, activation="relu"),
                    keras.layers.Conv2D(filters, 3, activation="relu"),
                    keras.layers.GlobalAveragePooling2D(),
                    keras.layers.Dense(10),
                ]
            )
            net.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            return net

        return make

    images = rng.random((64 * 32, 32, 32, 3), dtype=np.float32)
    labels = rng.integers(0, 10, 64 * 32)
    if name == "augment":
        augment = keras.Sequential(
            [keras.layers.RandomFlip("horizontal"), keras.layers.RandomRotation(0.1)]
        )

        def real():
            data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(32)
            data = data.map(
                lambda x, y: (augment(x, training=True), y), num_parallel_calls=tf.data.AUTOTUNE
            )
            return data.prefetch(tf.data.AUTOTUNE)

        return cnn(), real, {}
    if name == "numpy":
        digits = rng.random((2048, 28, 28, 1), dtype=np.float32)
        classes = rng.integers(0, 10, 2048)
        return cnn(28, 1, 32), lambda: (digits, classes), {"batch_size": 32}
    if name in ("guide", "jax_map", "loop"):

        def heavy(x, y):
            for _ in range(4):
                x = tf.image.resize(x, (48, 48))
                x = tf.image.resize(x, (32, 32))
            return x, y

        def real():
            data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(32)
            return data.map(heavy, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
                tf.data.AUTOTUNE
            )

        return cnn(), real, {}
    if name == "generator":

        def real():
            def batches():
                for index in range(64):
                    time.sleep(0.08)
                    rows = slice(index * 32, (index + 1) * 32)
                    yield images[rows], labels[rows]

            return tf.data.Dataset.from_generator(
                batches,
                output_signature=(
                    tf.TensorSpec((None, 32, 32, 3), tf.float32),
                    tf.TensorSpec((None,), tf.int64),
                ),
            )

        return cnn(filters=32), real, {}
    if name == "loader":
        import torch

        small = torch.from_numpy(rng.random((256 * 32, 64), dtype=np.float32))
        targets = torch.from_numpy(rng.random((256 * 32, 1), dtype=np.float32))

        def dense():
            keras.utils.set_random_seed(0)
            net = keras.Sequential(
                [keras.Input((64,)), keras.layers.Dense(512), keras.layers.Dense(512),
                 keras.layers.Dense(1)]
            )
            net.compile("adam", "mse")
            return net

        def real():
            return torch.utils.data.DataLoader(
                torch.utils.data.TensorDataset(small, targets), batch_size=32, shuffle=True
            )

        return dense, real, {}
    if name == "python_map":

        def spin(x):
            end = time.perf_counter() + 0.003
            while time.perf_counter() < end:
                pass
            return x

        def real():
            data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(32)

            def mapped(x, y):
                x = tf.py_function(spin, [x], tf.float32)
                x.set_shape((None, 32, 32, 3))
                return x, y

            return data.map(mapped, num_parallel_calls=2).prefetch(tf.data.AUTOTUNE)

        return cnn(), real, {}
    if name == "workers":
        import torch

        class Samples(torch.utils.data.Dataset):
            def __len__(self):
                return len(images)

            def __getitem__(self, index):
                image = images[index]
                for _ in range(3):
                    image = np.sqrt(np.abs(np.fft.ifft2(np.fft.fft2(image, axes=(0, 1)),
                                                        axes=(0, 1)))).astype(np.float32)
                return torch.from_numpy(image), int(labels[index])

        def real():
            return torch.utils.data.DataLoader(
                Samples(), batch_size=32, num_workers=2, persistent_workers=False
            )

        return cnn(), real, {}
    if name.startswith("cached"):

        def real():
            data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(32)
            return data.cache().prefetch(tf.data.AUTOTUNE)

        return cnn(), real, {}
    raise SystemExit(f"unknown case {name!r}")


def _in_memory(real_input):
    """The batches one epoch of `real_input` yields, as a cached in-memory tf.data pipeline."""
    import numpy as np
    import tensorflow as tf

    if isinstance(real_input, tuple):
        return None  # fit(x, y): its copy is the same arrays, fed as one cached tf.data
    if hasattr(real_input, "as_numpy_iterator"):
        batches = list(real_input.as_numpy_iterator())
    else:
        batches = [tuple(part.numpy() for part in batch) for batch in real_input]
    parts = tuple(np.stack([batch[i] for batch in batches]) for i in range(len(batches[0])))
    return tf.data.Dataset.from_tensor_slices(parts).cache().prefetch(tf.data.AUTOTUNE)


def _numpy_copy(x, y, batch_size):
    import tensorflow as tf

    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size).cache()
    return data.prefetch(tf.data.AUTOTUNE)


# Steps at each epoch's start left out of the steady period, as the tuner's
# steady state leaves them out (`timing.step_clock.EPOCH_START_STEPS`).
START_STEPS = 2


class _StepTimes:
    """When each step of each epoch ended, and when each epoch began."""

    def __init__(self):
        self.epochs = []

    def begin_epoch(self):
        self.epochs.append([time.perf_counter()])

    def step_ended(self):
        self.epochs[-1].append(time.perf_counter())

    def periods(self, steps):
        """(steady ms a step, ms a step with the epoch's set-up): medians of the later epochs."""
        steady, whole = [], []
        for began, *ends in self.epochs[1:]:
            steady.append((ends[-1] - ends[START_STEPS - 1]) / (len(ends) - START_STEPS) * 1e3)
            whole.append((ends[-1] - began) / steps * 1e3)
        return statistics.median(steady), statistics.median(whole)


class _EpochTimes:
    def __init__(self):
        import keras

        times = self.times = _StepTimes()

        class Timer(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                times.begin_epoch()

            def on_train_batch_end(self, batch, logs=None):
                times.step_ended()

        self.callback = Timer()


def _loop(model, data, steps, tuner=None):
    """`EPOCHS` epochs of a custom training loop; `_StepTimes.periods`."""
    step = _loop_step(model)
    if tuner is not None:
        step = tuner.instrument(step)
    times = _StepTimes()
    for _ in range(EPOCHS):
        times.begin_epoch()
        for x, y in (tuner.iterate(data) if tuner is not None else data):
            step(x, y)
            times.step_ended()
    if tuner is not None:
        tuner.close()
    return times.periods(steps)


def _blocks_truth(model, real_input, copy) -> float:
    """The truth from one fit over the real input and its copy in alternating blocks.

    `copy` is the in-memory copy: a cached tf.data dataset, or a list of batches.
    """
    import keras
    import tensorflow as tf

    if hasattr(copy, "as_numpy_iterator"):
        pattern = tf.data.Dataset.from_tensor_slices(
            tf.constant([0] * BLOCK + [1] * BLOCK, tf.int64)
        ).repeat()
        data = tf.data.Dataset.choose_from_datasets(
            [real_input().repeat(), copy.repeat()], pattern
        )
    else:
        data = _alternating(real_input, copy)
    # One block more than the pairs: the first (real) block is left out, the
    # pipeline's threads and buffers starting then.
    steps = BLOCK * (2 * BLOCK_PAIRS + 1)
    ends = []
    if _LOOP[0]:
        step = _loop_step(model)
        for x, y in data.take(steps):
            step(x, y)
            ends.append(time.perf_counter())
    else:

        class Timer(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                ends.append(time.perf_counter())

        model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[Timer()])
    periods = [
        (ends[(block + 1) * BLOCK - 1] - ends[block * BLOCK + BLOCK_SKIP - 1])
        / (BLOCK - BLOCK_SKIP)
        for block in range(1, 2 * BLOCK_PAIRS + 1)
    ]
    # Blocks 1, 3, ... are the copy's, 2, 4, ... the real input's.
    ratios = [
        (periods[index - 1] + periods[index + 1]) / 2 / periods[index]
        for index in range(1, len(periods) - 1, 2)
    ]
    return max(0.0, 1.0 - statistics.median(ratios))


def _alternating(real_input, batches):
    """Blocks of `BLOCK` batches from the real input (restarted as it ends) and from `batches`.

    Both through one Python generator, so Keras fetches either the same way.
    """
    def source(make):
        while True:
            # A DataLoader's batch is a list; Keras takes a generator's as a tuple.
            yield from (tuple(batch) for batch in make())

    real, copy = source(real_input), source(lambda: batches)
    while True:
        for _ in range(BLOCK):
            yield next(real)
        for _ in range(BLOCK):
            yield next(copy)


def _loop_step(model):
    import keras
    import tensorflow as tf

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = model.optimizer

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_weights)
        optimizer.apply_gradients(zip(grads, model.trainable_weights))
        return loss

    return step


def _fit(model, data, kwargs, steps, callbacks=()):
    if _LOOP[0]:
        tuners = [c for c in callbacks if hasattr(c, "iterate")]
        return _loop(model, data, steps, tuners[0] if tuners else None)
    timer = _EpochTimes()
    if isinstance(data, tuple):
        model.fit(*data, epochs=EPOCHS, verbose=0, callbacks=[timer.callback, *callbacks],
                  **kwargs)
    else:
        model.fit(data, epochs=EPOCHS, verbose=0, callbacks=[timer.callback, *callbacks])
    return timer.times.periods(steps)


# Whether the case trains in a custom loop rather than fit.
_LOOP = [False]


def run_case(name: str, rounds: int, why: bool = False) -> str:
    import keras_pipeline_tuner as kpt

    _LOOP[0] = name == "loop"
    make_model, real_input, kwargs = _case(name)
    first = real_input()
    if isinstance(first, tuple):
        x, y = first
        steps = -(-len(x) // kwargs["batch_size"])
        copy = _numpy_copy(x, y, kwargs["batch_size"])
    else:
        copy = _in_memory(first)
        steps = sum(1 for _ in copy)
    model = make_model()
    _fit(model, copy, {}, steps)  # traces the step once, not counted
    # A tf.data input is interleaved with its copy by tf.data, a torch
    # DataLoader with its batches kept in memory through one generator; NumPy
    # arrays, which Keras slices itself, are not interleaved.
    if hasattr(first, "as_numpy_iterator"):
        interleaved = copy
    elif isinstance(first, tuple):
        interleaved = None
    else:
        interleaved = list(first)
    real_ms, copy_ms, blocks, tuned = [], [], [], []
    for _ in range(rounds):
        real_ms.append(_fit(model, real_input(), kwargs, steps))
        copy_ms.append(_fit(model, copy, {}, steps))
        if interleaved is not None:
            blocks.append(_blocks_truth(model, real_input, interleaved))
        tuner = kpt.PipelineTuner(verbose=0)
        _fit(model, real_input(), kwargs, steps, [tuner])
        figures = tuner.report.figures
        ceiling = figures.input_free.speedup if figures.input_free is not None else None
        tuned.append((figures.input_fraction or 0.0, ceiling, figures.source,
                      tuner.report.judgement.line if why else ""))
    real = statistics.median(ms[0] for ms in real_ms)
    free = statistics.median(ms[0] for ms in copy_ms)
    fits_truth = max(0.0, 1.0 - free / real)
    truth = statistics.median(blocks) if blocks else fits_truth
    real_whole = statistics.median(ms[1] for ms in real_ms)
    whole = max(0.0, 1.0 - statistics.median(ms[1] for ms in copy_ms) / real_whole)
    delivered = 1.0 / (1.0 - truth)
    rows = []
    for share, ceiling, source, line in tuned:
        within = abs(share - truth) <= max(0.05, 0.25 * truth)
        ratio = (ceiling / delivered) if ceiling else float("nan")
        rows.append(
            f"{share * 100:5.1f} % {_classify(share):10s} ({source}) "
            f"share {'ok' if within else 'OFF'}, "
            f"class {'ok' if _class_right(share, truth) else 'WRONG'}, "
            f"at most {ceiling or 0:.2f}x = {ratio:.2f} of delivered"
            f" {'ok' if 0.67 <= ratio <= 1.5 else 'OFF'}"
            + (f"\n          {line}" if line else "")
        )
    # Free input's gain is the judged truth's; the fits' step times are theirs.
    blocks_part = (
        f"in blocks of one fit, rounds {' '.join(f'{b * 100:.1f}' for b in blocks)} %; "
        if blocks
        else ""
    )
    head = (
        f"{name:12s} truth {truth * 100:5.1f} % {_classify(truth):10s} "
        f"(free input {delivered:.2f}x; {blocks_part}alternated fits {fits_truth * 100:.1f} %: "
        f"step {real:.2f} ms real, {free:.2f} ms in memory; with each epoch's set-up "
        f"{whole * 100:.1f} %, {real_whole:.2f} ms a step real)"
    )
    return "\n".join([head] + ["    tuner " + row for row in rows])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="*", default=list(BACKEND_OF))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--busy-loops", type=int, default=0)
    parser.add_argument("--why", action="store_true", help="print each tuned fit's verdict line")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(run_case(args.one, args.rounds, args.why), flush=True)
        return
    loops = busy_loops.start(args.busy_loops)
    try:
        print(f"{time.strftime('%Y-%m-%d %H:%M')}, busy loops {args.busy_loops}, "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
        for name in args.cases:
            env = dict(os.environ, KERAS_BACKEND=BACKEND_OF[name], TF_CPP_MIN_LOG_LEVEL="3")
            done = subprocess.run(
                [sys.executable, __file__, "--one", name, "--rounds", str(args.rounds)]
                + (["--why"] if args.why else []),
                env=env, capture_output=True, text=True,
            )
            print(done.stdout.strip() or f"{name}: failed\n{done.stderr[-2000:]}", flush=True)
    finally:
        busy_loops.stop(loops)


if __name__ == "__main__":
    main()
