"""Two `MultiWorkerMirroredStrategy` workers on loopback, each fitting with a tuner.

Run by the tests inside a private network namespace (see `private_network`):

    python multi_worker_training.py launch --log-dir DIR [--slow-task 1] ...

starts the two workers as subprocesses of its own, with `TF_CONFIG` naming
127.0.0.1 ports, waits for both (killing them after `--timeout` seconds) and
prints one JSON line with each worker's exit status, result and log tail.

The model and data work around two limits of Keras 3 under this strategy
(keras-team/keras#20585): `fit` reduces its first batch across workers with a
reduction that takes a single tensor, not an `(x, y)` tuple, and reduces the
step's logs along an axis that scalars do not have. So each batch is one tensor
holding features and target, and the train step returns its logs as vectors.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time

FEATURES = 8
BATCH_SIZE = 16
RESULT = "RESULT "


def launch(args) -> None:
    ports = _free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    processes, logs = [], []
    began = time.monotonic()
    try:
        for task in range(2):
            config = {"cluster": cluster, "task": {"type": "worker", "index": task}}
            env = dict(os.environ, TF_CONFIG=json.dumps(config), TF_CPP_MIN_LOG_LEVEL="2")
            # Beside the log dir, not in it: the tuners own that.
            log = open(os.path.join(os.path.dirname(args.log_dir), f"stderr_{task}.txt"), "w+")
            logs.append(log)
            processes.append(
                subprocess.Popen(
                    [sys.executable, __file__, "worker", *sys.argv[2:], "--task", str(task)],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                )
            )
        outputs = []
        for process in processes:
            remaining = max(args.timeout - (time.monotonic() - began), 1.0)
            try:
                stdout, _ = process.communicate(timeout=remaining)
            except subprocess.TimeoutExpired:
                process.kill()
                stdout, _ = process.communicate()
            outputs.append(stdout)
    finally:
        for process in processes:
            if process.poll() is None:
                # The strategy catches SIGTERM (preemption handling).
                process.kill()
                process.wait()
    workers = []
    for task, (process, stdout, log) in enumerate(zip(processes, outputs, logs)):
        log.seek(0)
        lines = [line for line in stdout.splitlines() if line.startswith(RESULT)]
        result = json.loads(lines[-1][len(RESULT):]) if lines else None
        workers.append(
            {
                "task": task,
                "returncode": process.returncode,
                "result": result,
                "stderr": log.read()[-4000:],
            }
        )
        log.close()
    print(json.dumps({"workers": workers, "seconds": time.monotonic() - began}))


def worker(args) -> None:
    import numpy as np
    import tensorflow as tf

    import keras_pipeline_tuner as kpt

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    delay = args.delay if args.task == args.slow_task else 0.0

    def load(batch):
        # Stands in for a slow disk or a busy host: only one worker is slowed.
        def slow(values):
            time.sleep(delay)
            return values

        loaded = tf.numpy_function(slow, [batch], tf.float32)
        loaded.set_shape(batch.shape)
        return loaded

    rng = np.random.default_rng(args.task)
    data = rng.random((BATCH_SIZE * 32, FEATURES + 1), dtype=np.float32)
    dataset = (
        tf.data.Dataset.from_tensor_slices(data)
        .batch(BATCH_SIZE, drop_remainder=True)
        .map(load)
        .repeat()
        .prefetch(2)
    )
    options = tf.data.Options()
    # Each worker reads its own data: no sharding by the strategy.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset = dataset.with_options(options)

    with strategy.scope():
        model = _packed_regression()()
        model.compile(optimizer="adam")
    log_dir = args.log_dir
    if args.task == args.blocked_task:
        log_dir = os.path.join(args.log_dir, f"blocked_{args.task}", "logs")
    tuner = kpt.PipelineTuner(
        log_dir=log_dir,
        profile=args.profile,
        verbose=0,
        tensorboard_workers=args.tensorboard_workers,
        worker_timeout_s=args.worker_timeout_s,
    )
    if args.task == args.blocked_task:
        # This worker's tuner can no longer write anything: its log dir's
        # parent is now a file.
        with open(os.path.dirname(log_dir), "w") as file:
            file.write("not a directory")
    began = time.monotonic()
    if args.loop == "custom":
        losses = custom_loop(strategy, model, dataset, tuner, args)
    else:
        history = model.fit(
            dataset, epochs=args.epochs, steps_per_epoch=args.steps, verbose=0, callbacks=[tuner]
        )
        losses = history.history["loss"]
    fit_s = time.monotonic() - began
    # With the profiler window's evidence, which may join after fit.
    report = tuner.wait_for_profile()
    workers = report.workers
    result = {
        "fit_s": fit_s,
        "loss": [float(value) for value in losses],
        "steps": report.train.steps,
        "input_wait_ms": report.train.input_wait.mean_ms,
        "compute_ms": report.train.compute.mean_ms,
        "step_ms": report.train.step.mean_ms,
        "input_fraction": report.train.input_fraction,
        "straggler": workers.straggler if workers else None,
        "missing": workers.missing if workers else None,
        "waited_s": workers.waited_s if workers else None,
        "recommendations": [item.id for item in report.recommendations],
        "failures": sorted(tuner.guard.failures),
    }
    print(RESULT + json.dumps(result), flush=True)


def custom_loop(strategy, model, dataset, tuner, args):
    """The same training as a custom loop, its step timed by `tuner.instrument`."""
    import tensorflow as tf

    iterator = iter(strategy.experimental_distribute_dataset(dataset))

    @tuner.instrument
    @tf.function
    def train_step(batch):
        def step(batch):
            with tf.GradientTape() as tape:
                loss = model.compute_loss(x=batch, y_pred=model(batch, training=True))
                scaled = loss / strategy.num_replicas_in_sync
            gradients = tape.gradient(scaled, model.trainable_weights)
            model.optimizer.apply(gradients, model.trainable_weights)
            return loss

        return strategy.reduce("MEAN", strategy.run(step, args=(batch,)), axis=None)

    losses = []
    for _ in range(args.epochs):
        for _ in range(args.steps):
            loss = train_step(next(iterator))
        losses.append(float(loss))
        tuner.end_epoch()
    tuner.close()
    return losses


def _packed_regression():
    import keras
    import tensorflow as tf

    class PackedRegression(keras.Model):
        """A regression whose batches hold the features and, last, the target."""

        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(32, activation="relu")
            self.out = keras.layers.Dense(1)

        def call(self, batch):
            return self.out(self.hidden(batch[:, :FEATURES]))

        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
            return keras.ops.mean(keras.ops.square(x[:, FEATURES:] - y_pred))

        def train_step(self, data):
            logs = super().train_step(data)
            return {name: tf.reshape(value, [1]) for name, value in logs.items()}

    return PackedRegression


def _free_ports(count):
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _parser():
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("launch", "worker"))
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--task", type=int, default=0)
    parser.add_argument("--slow-task", type=int, default=-1)
    parser.add_argument("--delay", type=float, default=0.06)
    parser.add_argument("--blocked-task", type=int, default=-1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--tensorboard-workers", default="chief")
    parser.add_argument("--worker-timeout-s", type=float, default=30.0)
    parser.add_argument("--timeout", type=float, default=100.0)
    parser.add_argument("--loop", choices=("fit", "custom"), default="fit")
    parser.add_argument("--profile", choices=("off", "auto"), default="off")
    return parser


if __name__ == "__main__":
    arguments = _parser().parse_args()
    if arguments.role == "launch":
        launch(arguments)
    else:
        worker(arguments)
