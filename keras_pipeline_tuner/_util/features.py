"""The names of the tuner's features, as the guard and its warnings say them.

A failure inside one feature turns that feature off (see `feature_guard`); its
name is how the warning, the report's notes and the tests refer to it.
"""

STEP_CLOCK = "step clock"
LOOP_CLOCK = "custom loop clock"
PROFILER_WINDOW = "profiler window"
INSPECTION = "pipeline inspection"
WHAT_IF = "what-if replay"
FIX_TIMING = "fix timing"
ADVICE = "advice"
REPORT = "report"
REPORT_FILE = "report file"
SUMMARY = "terminal summary"
EARLY_VERDICT = "early verdict"
CONTENTION_CHECK = "contention check"
STEP_TRACE = "step timeline trace"
TENSORBOARD_SCALARS = "TensorBoard scalars"
TENSORBOARD_TEXT = "TensorBoard report text"
TENSORBOARD_TIMELINE = "TensorBoard timeline image"
TENSORBOARD_DASHBOARD = "TensorBoard dashboard data"
WORKER_SUMMARY = "worker summary"
WORKER_COMPARISON = "worker comparison"
CPU_USAGE = "CPU usage"
GRAIN_STAGES = "Grain stage timing"
USER_CALLS = "user call timing"
LIVE_MODEL = "tf.data live model"
