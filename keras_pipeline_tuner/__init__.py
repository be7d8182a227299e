"""keras-pipeline-tuner: find out whether a Keras model waits for its input pipeline.

Example:

```python
import keras_pipeline_tuner as kpt

tuner = kpt.PipelineTuner(log_dir="logs/run1")
model.fit(train_ds, epochs=5, callbacks=[tuner])
print(tuner.report.verdict)
```
"""

from keras_pipeline_tuner.advice.figures import Figures
from keras_pipeline_tuner.advice.recommendation import Recommendation
from keras_pipeline_tuner.outputs.report import Report
from keras_pipeline_tuner.profiling.evidence import ProfileEvidence
from keras_pipeline_tuner.timing.cpu_usage import CpuUsage
from keras_pipeline_tuner.timing.step_clock import EpochBreakdown
from keras_pipeline_tuner.timing.step_clock import FirstStep
from keras_pipeline_tuner.timing.step_clock import StepClock
from keras_pipeline_tuner.timing.step_stats import Distribution
from keras_pipeline_tuner.timing.step_stats import StepStats
from keras_pipeline_tuner.timing.step_stats import Verdict
from keras_pipeline_tuner.workers.exchange import MultiWorkerSummary
from keras_pipeline_tuner.workers.exchange import WorkerSummary

__version__ = "0.1.0"

# Benchmark, what-if replay, tuning and writing its result: loaded on first use (they
# need TensorFlow).
_MEASUREMENT_NAMES = {
    "benchmark": "keras_pipeline_tuner.pipeline.benchmark",
    "BenchmarkResult": "keras_pipeline_tuner.pipeline.benchmark",
    "tune": "keras_pipeline_tuner.pipeline.tune.tuning",
    "TuneResult": "keras_pipeline_tuner.pipeline.tune.results",
    "RewriteOutcome": "keras_pipeline_tuner.pipeline.tune.results",
    "LoaderTuneResult": "keras_pipeline_tuner.pipeline.tune.loader_results",
    "SettingTiming": "keras_pipeline_tuner.pipeline.tune.halving",
    "what_if": "keras_pipeline_tuner.after_training.what_if_replay",
    "WhatIfResult": "keras_pipeline_tuner.after_training.what_if_replay",
    "write_tune_result": "keras_pipeline_tuner.outputs.dashboard.summaries",
}


def __getattr__(name):
    # The callback subclasses keras.callbacks.Callback, so importing it imports
    # Keras (and TensorFlow on its backend); keep `import keras_pipeline_tuner` light.
    if name in ("PipelineTuner", "instrument"):
        import keras

        if keras.backend.backend() == "tensorflow":
            # The install hint, before anything else needs TensorFlow.
            from keras_pipeline_tuner._util.tf_import import tensorflow

            tensorflow()
        from keras_pipeline_tuner.run.tuner import PipelineTuner
        from keras_pipeline_tuner.run.tuner import instrument

        return PipelineTuner if name == "PipelineTuner" else instrument
    if name == "inspect":
        from keras_pipeline_tuner.pipeline.lint.keras_inputs import inspect

        return inspect
    if name in ("Finding", "Findings"):
        from keras_pipeline_tuner.pipeline.lint import findings

        return getattr(findings, name)
    if name in _MEASUREMENT_NAMES:
        import importlib

        return getattr(importlib.import_module(_MEASUREMENT_NAMES[name]), name)
    raise AttributeError(f"module 'keras_pipeline_tuner' has no attribute {name!r}")


__all__ = [
    "CpuUsage",
    "Distribution",
    "EpochBreakdown",
    "Finding",
    "Figures",
    "Findings",
    "FirstStep",
    "MultiWorkerSummary",
    "PipelineTuner",
    "ProfileEvidence",
    "Recommendation",
    "Report",
    "StepClock",
    "StepStats",
    "Verdict",
    "WorkerSummary",
    "inspect",
    "instrument",
    *_MEASUREMENT_NAMES,
]
