"""The global random state of Python, NumPy, TensorFlow and Keras, kept across the tuner's work.

The tuner runs things of its own after training (a replay of the model's step,
the user's pipeline for the fix timing, Grain's stage timing): whatever they
draw from a global generator must leave the user's next draws as they would
have been without the tuner. Kept and put back:

- Python's `random` and NumPy's global generator (a `tf.py_function` may draw
  from them);
- TensorFlow's eager op-seed sequence (with a global seed set, each eager
  random op or unseeded dataset shuffle created takes the next seed from it)
  and its global `tf.random.Generator`, when one exists;
- Keras' global `SeedGenerator` (`keras.random.*` calls with `seed=None`);
- torch's global CPU generator, when torch is imported (a DataLoader draws
  from it each time an iterator over it is made).

TensorFlow and Keras are only read when the process has imported them; the
TensorFlow op-seed sequence is an attribute of its eager context, read when
present (no public accessor exists).
"""

import contextlib
import random
import sys
from typing import Callable
from typing import Iterator
from typing import List

import numpy as np


@contextlib.contextmanager
def preserved_random_state() -> Iterator[None]:
    """Restores the global random generators after the block.

    Example:

    >>> with preserved_random_state():
    ...     _ = np.random.random()
    """
    restore: List[Callable[[], None]] = []
    python_state = random.getstate()
    numpy_state = np.random.get_state()
    restore.append(lambda: random.setstate(python_state))
    restore.append(lambda: np.random.set_state(numpy_state))
    restore += _tensorflow_states()
    restore += _keras_states()
    restore += _torch_states()
    try:
        yield
    finally:
        for put_back in restore:
            put_back()


def _tensorflow_states() -> List[Callable[[], None]]:
    if sys.modules.get("tensorflow") is None:
        return []
    from tensorflow.python.eager import context
    from tensorflow.python.ops import stateful_random_ops

    restore = []
    rng = getattr(context.context(), "_rng", None)
    if rng is not None:
        state = rng.getstate()
        restore.append(lambda: rng.setstate(state))
    generator = getattr(stateful_random_ops, "global_generator", None)
    if generator is not None:
        # Only when the user made one: asking for it would create it.
        value = generator.state.numpy()
        restore.append(lambda: generator.state.assign(value))
    return restore


def _torch_states() -> List[Callable[[], None]]:
    # A DataLoader draws its workers' base seed from torch's global generator
    # each time an iterator over it is made.
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    state = torch.get_rng_state()
    return [lambda: torch.set_rng_state(state)]


def _keras_states() -> List[Callable[[], None]]:
    if sys.modules.get("keras") is None:
        return []
    from keras.src.backend.common import global_state

    generator = global_state.get_global_attribute("global_seed_generator")
    state = getattr(generator, "state", None)
    if state is None:
        return []
    value = np.array(state.numpy())
    return [lambda: state.assign(value)]
