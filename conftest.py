"""Names every docstring example may use, as a Keras user's script would have them."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _docstring_namespace(doctest_namespace):
    import keras
    import tensorflow as tf

    import keras_pipeline_tuner as kpt

    doctest_namespace.update(np=np, tf=tf, keras=keras, kpt=kpt)
