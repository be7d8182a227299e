"""The `keras-pipeline-tuner` command: `demo` and `report LOGDIR`."""

import argparse
import os
import sys
from typing import List, Optional


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keras-pipeline-tuner",
        description=(
            "Find out whether a Keras model waits for its tf.data input pipeline, why, "
            "and what to change."
        ),
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    demo = commands.add_parser(
        "demo",
        help="train a small CNN on a slow image pipeline, diagnose it, fix it, measure it",
        description=(
            "Writes a small synthetic JPEG data set, trains a small CNN on the pipeline a "
            "newcomer writes, prints the tuner's verdict, then trains on the fixed pipeline "
            "and prints the measured speed-up. Needs no download."
        ),
    )
    demo.add_argument("--log-dir", default=None, help="where to write logs (default: a temp dir)")
    demo.add_argument("--quick", action="store_true", help="fewer images and steps (~20 s)")
    report = commands.add_parser(
        "report",
        help="print the verdict and advice stored in a log dir",
        description=(
            "Prints the report a PipelineTuner wrote to LOGDIR/report.json; for a folder "
            "of runs (e.g. the demo's naive/ and tuned/), each run's report below it."
        ),
    )
    report.add_argument("log_dir", metavar="LOGDIR")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the command line.

    Args:
        argv: the arguments, without the program name; `sys.argv[1:]` by default.

    Returns:
        The exit status.
    """
    args = _parser().parse_args(argv)
    if args.command == "report":
        return _report(args.log_dir)
    from keras_pipeline_tuner.demo import run_demo

    run_demo(log_dir=args.log_dir, quick=args.quick)
    return 0


def _report(log_dir: str) -> int:
    from keras_pipeline_tuner.outputs.report import REPORT_FILENAME

    path = os.path.join(log_dir, REPORT_FILENAME)
    if os.path.isfile(path):
        return _print_report(path)
    runs = _runs_below(log_dir, REPORT_FILENAME)
    if not runs:
        sys.stderr.write(
            f"keras-pipeline-tuner: no report in {log_dir!r} or the folders below it "
            f"(expected {REPORT_FILENAME}). Pass the log_dir given to "
            "PipelineTuner(log_dir=...) after a fit has ended.\n"
        )
        return 2
    # A folder of runs (e.g. the demo's naive/ and tuned/): each one in turn.
    status = 0
    for run in runs:
        sys.stdout.write(f"\n== {os.path.relpath(os.path.dirname(run), log_dir)} ==\n")
        sys.stdout.flush()
        status = max(status, _print_report(run))
    return status


def _runs_below(log_dir: str, filename: str, depth: int = 3) -> List[str]:
    found = []
    for root, folders, files in os.walk(log_dir):
        if os.path.relpath(root, log_dir).count(os.sep) >= depth:
            folders[:] = []
        # A profile capture holds no report; skip its large folders.
        folders[:] = sorted(name for name in folders if name != "plugins")
        if filename in files and root != log_dir:
            found.append(os.path.join(root, filename))
    return sorted(found)


def _print_report(path: str) -> int:
    from keras_pipeline_tuner.outputs.report import Report
    from keras_pipeline_tuner.outputs.terminal import print_summary

    try:
        with open(path, encoding="utf-8") as file:
            report = Report.from_json(file.read())
    except (OSError, ValueError) as error:
        sys.stderr.write(f"keras-pipeline-tuner: cannot read {path}: {error}\n")
        return 2
    print_summary(report, details=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
