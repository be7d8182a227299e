"""`kpt.tune`: rewrites of a pipeline's graph, rebuilt, checked and timed side by side."""
