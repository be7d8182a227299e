"""The pipeline model and its reader: a tf.data dataset's graph as stages a person can read."""
