"""Moving a CPU-bound input pipeline to the tf.data service, measured by keras-pipeline-tuner.

The pipeline stands in for image preprocessing: each example costs a few large
matrix products, already run in parallel (`num_parallel_calls=AUTOTUNE`). With a
small model, training waits for it, and the preprocessing keeps every CPU core
busy: more parallelism has no core to run on. The tuner sees the three facts
(input-bound, every stage parallel, CPUs saturated) and recommends the tf.data
service, which runs the pipeline on worker processes of other hosts.

The example then starts a tf.data service inside this process (a dispatcher and
two workers), hands it the same pipeline with
`dataset.apply(tf.data.experimental.service.distribute(...))`, and trains again:
the tuner recognises the service in the pipeline and measures the wait for it
like any other input.

On one machine the service's workers share that machine's cores, so this run
shows the mechanics, not the speed-up: on a cluster, start a `WorkerServer` on
each host with idle CPUs and give `distribute` the dispatcher's address.

TensorFlow's service servers listen on every network interface of the machine
(the address they are given only says how to reach them), on ports the
operating system picks. Run the example where those ports are not reachable
from other machines.

Run it as is:

    python examples/data_service.py

Set KPT_EXAMPLE_QUICK=1 for a run of a few seconds. The reports go to
logs/data_service/local and logs/data_service/service
(`keras-pipeline-tuner report logs/data_service/service` prints one again).
"""

import os

import keras
import tensorflow as tf

import keras_pipeline_tuner as kpt

QUICK = os.environ.get("KPT_EXAMPLE_QUICK") == "1"
EXAMPLES = 256 if QUICK else 2048
EPOCHS = 2 if QUICK else 3
BATCH_SIZE = 16
SIZE = 160
ROUNDS = 3
LOG_DIR = os.path.join("logs", "data_service")


def preprocess(index):
    # Stands in for decoding and randomly augmenting an image (so nothing can be
    # cached): TensorFlow ops only, which the service's workers can run.
    pixels = tf.random.normal([SIZE, SIZE])
    for _ in range(ROUNDS):
        pixels = tf.tanh(tf.matmul(pixels, pixels) / SIZE)
    return tf.reduce_mean(pixels, axis=0), tf.cast(index % 2, tf.float32)


def make_dataset() -> tf.data.Dataset:
    return (
        tf.data.Dataset.range(EXAMPLES)
        .map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(BATCH_SIZE)
    )


def make_model() -> keras.Model:
    model = keras.Sequential(
        [keras.Input((SIZE,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(optimizer="adam", loss="mse")
    return model


def start_service():
    """A dispatcher and two workers, in this process, on ports the OS picks."""
    service = tf.data.experimental.service
    dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
    address = dispatcher.target.split("://")[1]
    workers = [
        service.WorkerServer(
            service.WorkerConfig(
                dispatcher_address=address, worker_address="localhost:%port%", port=0
            )
        )
        for _ in range(2)
    ]
    return dispatcher, workers


def main() -> None:
    print("1. Training on the pipeline, preprocessing in this process.")
    local = kpt.PipelineTuner(log_dir=os.path.join(LOG_DIR, "local"), profile="off")
    make_model().fit(
        make_dataset().prefetch(tf.data.AUTOTUNE), epochs=EPOCHS, verbose=0, callbacks=[local]
    )
    offload = next(
        (item for item in local.report.recommendations if item.id == "data-service-offload"),
        None,
    )
    cpu = local.report.cpu
    print(f"CPU busy while training: {cpu.busy * 100:.0f} % of {cpu.cpu_count} cores.")
    if offload is None:
        print("The tuner did not recommend the tf.data service on this run (see above).")
    else:
        print(f"Recommended: {offload.title}\n{offload.fix}")

    print("\n2. Training on the same pipeline, run by a tf.data service.")
    dispatcher, workers = start_service()
    print(f"Dispatcher at {dispatcher.target}, {len(workers)} workers.")
    dataset = make_dataset().apply(
        tf.data.experimental.service.distribute(
            processing_mode="distributed_epoch", service=dispatcher.target, job_name="train"
        )
    )
    dataset = dataset.prefetch(tf.data.AUTOTUNE)
    print(f"The pipeline as the tuner reads it: {kpt.inspect(dataset).pipeline}")
    service = kpt.PipelineTuner(log_dir=os.path.join(LOG_DIR, "service"), profile="off")
    make_model().fit(dataset, epochs=EPOCHS, verbose=0, callbacks=[service])
    report = service.report
    print(f"Service run: {report.train.steps} steps measured, findings: {report.findings[0].id}")
    print(f"Verdict: {report.verdict} ({(report.input_fraction or 0) * 100:.1f} % input wait)")


if __name__ == "__main__":
    main()
