"""Work after training ends: replays of the model's step and timings of pipelines, within a budget.

Everything here runs once `fit` (or a custom loop) has ended, on the training
thread, in this process, within the tuner's cost budget
(`timing.tuner_cost`), and only where it cannot touch what the user's next fit
reads:

- the what-if replay and the contention check (`what_if_replay`, driven by
  `replay_probe`): the model's compiled step on batches held in memory, every
  piece of state it moves restored;
- the timing of advised fixes (`fix_timing`): rewrites of a tf.data pipeline
  made of TensorFlow ops, rebuilt from its graph and read apart from training's;
- a PyDataset's advised workers (`py_dataset_timing`) and, where training's
  Grain iterators were not timed, Grain's stage timing in a pass of its own,
  only when the user asks (`measure_fixes=True` with `allow_unverified=True`):
  they run the user's Python again.

Never: a copy of the process (no `fork()`), or the user's Python called again
unasked. A Python stage's evidence is its calls timed during training
(`instrumentation.user_calls`), a Grain stage's Grain's own timing of the
iterators training read (`instrumentation.grain_stage_timing`); a fix's gain
is then a prediction.

`probes.AfterTraining` runs the phase; `settings.ProbeSettings` holds what it
needs of the tuner's arguments. It reads the evidence (the step clock, the
pipeline's graph, the CPU budget) and hands its results to the advice, which
never runs here.
"""
