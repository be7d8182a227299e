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
        description="Prints the report a PipelineTuner wrote to LOGDIR/report.json.",
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
    from keras_pipeline_tuner._util import files
    from keras_pipeline_tuner.outputs.report import REPORT_FILENAME
    from keras_pipeline_tuner.outputs.report import Report
    from keras_pipeline_tuner.outputs.terminal import print_summary

    path = os.path.join(log_dir, REPORT_FILENAME)
    try:
        found = files.is_file(path)
    except (ImportError, OSError) as error:
        sys.stderr.write(f"keras-pipeline-tuner: cannot read {path}: {error}\n")
        return 2
    if not found:
        sys.stderr.write(
            f"keras-pipeline-tuner: no report in {log_dir!r} (expected {REPORT_FILENAME}). "
            "Pass the log_dir given to PipelineTuner(log_dir=...) after a fit has ended.\n"
        )
        return 2
    try:
        report = Report.from_json(files.read_text(path))
    except (OSError, ValueError) as error:
        sys.stderr.write(f"keras-pipeline-tuner: cannot read {path}: {error}\n")
        return 2
    print_summary(report, details=True)
    if not report.train.steps:
        # A run that measured nothing must not pass for a good one in a script.
        sys.stderr.write(
            f"keras-pipeline-tuner: the report in {log_dir!r} holds no measured training "
            "step, so it has no verdict: the fit ended (or failed) before its first "
            "timed step. See the notes above.\n"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
