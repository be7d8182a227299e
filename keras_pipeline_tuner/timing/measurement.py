"""How a run's steps were timed: the values of `Report.measurement`.

Decided by the timing source (or the run's fallback) and shown with the report,
so a reader knows what "input wait" and "compute" mean for this run.
"""

# `model.fit`: the wait for the batch and the compute split inside the step.
IN_STEP = "in-step"
# Only each call is timed: input wait is not told apart from compute.
WHOLE_STEP = "whole-step"
# Custom loops: what timed them.
DECORATOR = "decorator"
ITERATOR = "iterator"
DECORATOR_AND_ITERATOR = "decorator+iterator"
NOT_TIMED = "not timed"
