"""Where the repository's parts are, for tests that run its scripts."""

import pathlib

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"
HELPERS = REPO_ROOT / "tests" / "helpers"
