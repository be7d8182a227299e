"""TensorBoard with the package's dashboard plugin, as `tensorboard` would load it.

The plugin is loaded through the `tensorboard_plugins` entry point declared in
setup.cfg (the same line pip installs), so a wrong entry point fails the tests
even where an older copy of the package is installed.
"""

import configparser
import importlib.metadata

from tensorboard import default
from tensorboard import program
from tensorboard.backend import application
from tensorboard.backend.event_processing import data_ingester
from werkzeug import test as werkzeug_test
from werkzeug import wrappers

from tests.helpers.paths import REPO_ROOT

ENTRY_POINT_GROUP = "tensorboard_plugins"


def declared_plugin():
    """The plugin class setup.cfg's `tensorboard_plugins` entry point names."""
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / "setup.cfg")
    lines = config["options.entry_points"][ENTRY_POINT_GROUP].strip().splitlines()
    assert len(lines) == 1, lines
    name, value = (part.strip() for part in lines[0].split("="))
    return importlib.metadata.EntryPoint(name, value, ENTRY_POINT_GROUP).load()


def tensorboard_plugins():
    """TensorBoard's plugins (its own and the installed ones) and the declared dashboard."""
    plugin = declared_plugin()
    # An installed copy of the package brings its own, maybe older, dashboard.
    others = [
        loaded
        for loaded in default.get_plugins()
        if getattr(loaded, "plugin_name", None) != plugin.plugin_name
    ]
    return others + [plugin]


def wsgi_client(log_dir) -> werkzeug_test.Client:
    """TensorBoard's WSGI app over `log_dir`, loaded once, with a test client."""
    board = program.TensorBoard(plugins=tensorboard_plugins())
    board.configure(
        argv=[
            None,
            "--logdir",
            str(log_dir),
            "--load_fast",
            "false",
            "--reload_task",
            "blocking",
            "--reload_interval",
            "0",
        ]
    )
    ingester = data_ingester.LocalDataIngester(board.flags)
    ingester.start()
    app = application.TensorBoardWSGIApp(
        board.flags,
        board.plugin_loaders,
        ingester.data_provider,
        board.assets_zip_provider,
        ingester.deprecated_multiplexer,
    )
    return werkzeug_test.Client(app, wrappers.Response)


def serve(argv):
    """Runs the `tensorboard` command line with the dashboard plugin (`python -m` this)."""
    board = program.TensorBoard(plugins=tensorboard_plugins())
    board.configure(argv=[None, *argv])
    return board.main()


if __name__ == "__main__":
    import sys

    sys.exit(serve(sys.argv[1:]))
