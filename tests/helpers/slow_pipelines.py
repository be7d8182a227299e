"""Pipelines whose epoch takes seconds: a Python decode that sleeps a known time per element."""

import time

import numpy as np
import tensorflow as tf


def slow_python_map(element_s: float, elements: int, batch_size: int = 8, parallel=False):
    """`range(elements).map(load).batch(batch_size)`; `load` sleeps `element_s` in Python.

    With `parallel`, the map runs with AUTOTUNE parallel calls (the hand-made fix).
    """

    def load_python(index):
        time.sleep(element_s)
        return np.full((4,), index, np.float32)

    def load(index):
        x = tf.py_function(load_python, [index], tf.float32)
        x.set_shape((4,))
        return x

    calls = tf.data.AUTOTUNE if parallel else None
    return tf.data.Dataset.range(elements).map(load, num_parallel_calls=calls).batch(batch_size)
