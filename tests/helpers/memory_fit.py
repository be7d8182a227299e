"""Joins a memory cgroup, then inspects (or fits on) a pipeline whose cache will not fit.

    python -m tests.helpers.memory_fit CGROUP_DIR inspect|fit

Prints one JSON line: what `kpt.inspect` found, or what the tuner said before
the first step of a fit (which stops after that step: the cache never fills).
"""

import json
import logging
import os
import sys

CACHE_ELEMENTS = 768
ELEMENT_FLOATS = 1024 * 1024  # 4 MiB an element: 3 GiB cached


# Elements the pipeline made in this process (counted by `dataset(counted=True)`).
READ = []


def dataset(counted: bool = False):
    import tensorflow as tf

    def label(i):
        if not counted:
            return tf.cast(i % 2, tf.float32)

        def count(value):
            READ.append(1)
            return value

        found = tf.py_function(count, [tf.cast(i % 2, tf.float32)], tf.float32)
        found.set_shape(())
        return found

    return (
        tf.data.Dataset.range(CACHE_ELEMENTS)
        .map(lambda i: (tf.zeros([ELEMENT_FLOATS], tf.float32), label(i)))
        .cache()
        .batch(2)
    )


def main(cgroup: str, what: str) -> None:
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as file:
        file.write(str(os.getpid()))
    import keras_pipeline_tuner as kpt

    if what == "inspect":
        findings = kpt.inspect(dataset(counted=True))
        memory = findings.memory
        result = {
            "elements_read": len(READ),
            "findings": [
                {"id": f.id, "severity": str(f.severity), "stage": f.stage, "reason": f.reason}
                for f in findings
            ],
            "budget": memory.budget.limit_bytes if memory.budget else None,
            "budget_source": memory.budget.source if memory.budget else None,
        }
    else:
        import keras

        said = []

        class Said(logging.Handler):
            def emit(self, record):
                said.append(record.getMessage())

        logging.getLogger("keras_pipeline_tuner").addHandler(Said())
        before_first_step = []

        class FirstStep(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                if batch == 0:
                    before_first_step.extend(said)
                    self.model.stop_training = True

        model = keras.Sequential([keras.Input((ELEMENT_FLOATS,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        tuner = kpt.PipelineTuner(verbose=0, measure_fixes=False, check_contention=False)
        model.fit(dataset(), epochs=1, steps_per_epoch=1, callbacks=[tuner, FirstStep()],
                  verbose=0)
        result = {"before_first_step": before_first_step}
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
