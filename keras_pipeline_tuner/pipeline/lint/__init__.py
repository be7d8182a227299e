"""The inspection: the finding catalogue, the tf.data rules and the lints of other inputs."""
