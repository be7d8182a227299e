"""keras-pipeline-tuner: find out whether a Keras model waits for its input pipeline.

Example:

```python
import keras_pipeline_tuner as kpt

tuner = kpt.PipelineTuner(log_dir="logs/run1")
model.fit(train_ds, epochs=5, callbacks=[tuner])
print(tuner.report.verdict)
```
"""

from keras_pipeline_tuner.report import Report
from keras_pipeline_tuner.step_clock import EpochBreakdown
from keras_pipeline_tuner.step_clock import FirstStep
from keras_pipeline_tuner.step_clock import StepClock
from keras_pipeline_tuner.step_stats import Distribution
from keras_pipeline_tuner.step_stats import StepStats
from keras_pipeline_tuner.step_stats import Verdict

__version__ = "0.1.0"


def __getattr__(name):
    # The callback subclasses keras.callbacks.Callback, so importing it imports
    # Keras (and TensorFlow); keep `import keras_pipeline_tuner` light.
    if name == "PipelineTuner":
        from keras_pipeline_tuner.tf_import import tensorflow

        tensorflow()
        from keras_pipeline_tuner.pipeline_tuner import PipelineTuner

        return PipelineTuner
    raise AttributeError(f"module 'keras_pipeline_tuner' has no attribute {name!r}")


__all__ = [
    "Distribution",
    "EpochBreakdown",
    "FirstStep",
    "PipelineTuner",
    "Report",
    "StepClock",
    "StepStats",
    "Verdict",
]
