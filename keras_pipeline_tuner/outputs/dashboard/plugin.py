"""The "Input pipeline" tab: a TensorBoard plugin serving the tuner's runs.

TensorBoard finds it through the package's `tensorboard_plugins` entry point and
lists the tab for any log dir holding the dashboard's summaries (or, for runs
written before the dashboard, a `report.json`). The tab is a plain ES module and
a style sheet shipped with the package and served by the plugin itself, so it
works offline and within TensorBoard's Content-Security-Policy.

Routes, under `/data/plugin/keras_pipeline_tuner/`:

- `runs`: every run with its verdict;
- `run?run=R`: the run's report, `kpt.tune` result and profiler-window rows;
- `steps?run=R[&first=A&last=B][&points=N]`: step rows of steps A-B, downsampled
  on the server to at most N marks (default 2000), full detail for a narrow range.
"""

import dataclasses
import importlib.resources
from typing import Any
from typing import Dict
from typing import Optional
from typing import Tuple

from tensorboard import plugin_util
from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from keras_pipeline_tuner.outputs.dashboard import run_data
from keras_pipeline_tuner.outputs.dashboard import step_series
from keras_pipeline_tuner.outputs.dashboard import summaries
from keras_pipeline_tuner.outputs.log_dir_runs import REPORT_FILENAME

TAB_NAME = "Input pipeline"
_STATIC = {
    "/index.js": ("index.js", "text/javascript"),
    "/style.css": ("style.css", "text/css"),
}


class _BadRequest(ValueError):
    """A request the plugin cannot answer, with what to send instead."""


class InputPipelinePlugin(base_plugin.TBPlugin):
    """TensorBoard plugin of the "Input pipeline" tab.

    Args:
        context: TensorBoard's `TBContext` (its data provider and log dir).

    Example:

    ```python
    from tensorboard import program
    from tensorboard import default

    board = program.TensorBoard(plugins=default.get_plugins() + [InputPipelinePlugin])
    board.configure(logdir="logs")
    board.launch()
    ```
    """

    plugin_name = summaries.PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext):
        super().__init__(context)
        self._data = run_data.RunData(context.data_provider, context.logdir or "")

    def get_plugin_apps(self) -> Dict[str, Any]:
        """The plugin's routes: its script and style, and its data."""
        apps = {route: self._static(name, kind) for route, (name, kind) in _STATIC.items()}
        apps.update(
            {
                "/runs": self._route(self._runs),
                "/run": self._route(self._run),
                "/steps": self._route(self._steps),
            }
        )
        return apps

    def is_active(self) -> bool:
        """Active for log dirs holding only `report.json` files (runs older than the tab).

        Log dirs with the dashboard's summaries are found by TensorBoard itself
        through `data_plugin_names`.
        """
        return bool(self._data.report_file_runs())

    def data_plugin_names(self) -> Tuple[str, ...]:
        """The plugin name the tuner's summaries carry."""
        return (summaries.PLUGIN_NAME,)

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        """Loads the tab as the ES module `index.js`."""
        return base_plugin.FrontendMetadata(
            es_module_path="/index.js", tab_name=TAB_NAME
        )

    # Routes.

    def _static(self, name: str, kind: str):
        body = (importlib.resources.files(__package__) / "static" / name).read_bytes()

        @wrappers.Request.application
        def serve(request):
            return http_util.Respond(request, body, kind)

        return serve

    def _answer(self, request, build):
        try:
            body = build(
                plugin_util.context(request.environ),
                plugin_util.experiment_id(request.environ),
                request.args,
            )
        except _BadRequest as error:
            return http_util.Respond(request, {"error": str(error)}, "application/json", code=400)
        return http_util.Respond(request, body, "application/json")

    def _route(self, build):
        @wrappers.Request.application
        def serve(request):
            return self._answer(request, build)

        return serve

    # What the routes answer.

    def _runs(self, ctx, experiment_id: str, args) -> Dict[str, Any]:
        return {"runs": self._data.runs(ctx, experiment_id)}

    def _run(self, ctx, experiment_id: str, args) -> Dict[str, Any]:
        run = _run_argument(args)
        # What can be read is answered; what cannot is named in `problems`.
        problems = []
        try:
            report, source = self._data.report(ctx, experiment_id, run)
        except run_data.UnreadableRun as reason:
            report, source = None, ""
            problems.append(str(reason))
        else:
            if report is None:
                raise _BadRequest(
                    f"No report for run {run!r}: it holds no dashboard summaries and no "
                    f"{REPORT_FILENAME}. Pick a run listed by ./runs."
                )
        answer = {"run": run, "source": source, "report": report, "problems": problems}
        for name, read in (
            ("tune", self._data.tune),
            ("profile", self._data.profile_stages),
        ):
            try:
                answer[name] = read(ctx, experiment_id, run)
            except run_data.UnreadableRun as reason:
                answer[name] = None
                problems.append(str(reason))
        return answer

    def _steps(self, ctx, experiment_id: str, args) -> Dict[str, Any]:
        run = _run_argument(args)
        first = _int_argument(args, "first")
        last = _int_argument(args, "last")
        points = _int_argument(args, "points")
        points = step_series.DEFAULT_POINTS if points is None else points
        if not 1 <= points <= step_series.MAX_POINTS:
            raise _BadRequest(
                f"`points` must be between 1 and {step_series.MAX_POINTS}, got {points}."
            )
        problems = []
        try:
            rows, source = self._data.steps(ctx, experiment_id, run)
        except run_data.UnreadableRun as reason:
            rows, source = run_data.EMPTY_ROWS, ""
            problems.append(str(reason))
        series = step_series.downsample(rows, first, last, points)
        return {"run": run, "source": source, "problems": problems, **dataclasses.asdict(series)}


def _run_argument(args) -> str:
    run = args.get("run")
    if not run:
        raise _BadRequest("Missing `run`: pass ?run=NAME, a run listed by ./runs.")
    return run


def _int_argument(args, name: str) -> Optional[int]:
    value = args.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise _BadRequest(f"`{name}` must be an integer step number, got {value!r}.") from None
