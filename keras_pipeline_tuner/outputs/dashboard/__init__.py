"""The "Input pipeline" TensorBoard dashboard: what the tuner writes, the plugin serving it.

- `summaries`: the plugin-tagged summaries the tuner writes (step rows in
  blocks, the report, the profiler window's stage rows, a `kpt.tune` result).
- `step_series`: step rows downsampled for display, full detail for a zoomed range.
- `run_data`: reads a run's data back through TensorBoard's data provider,
  with `report.json` as the fallback for runs written before the dashboard.
- `plugin`: the TensorBoard plugin (routes, and the tab's script and style).
"""
