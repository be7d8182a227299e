"""The `keras-pipeline-tuner` command: `demo`, `report LOGDIR`, `compare A B`, `check LOGDIR`."""

import argparse
import os
import sys
from typing import List
from typing import Optional

# Exit statuses, one per cause (listed in `--help`).
OK = 0
CHECK_FAILED = 1
USAGE = 2  # argparse's own
NO_REPORT = 3
UNREADABLE = 4
NOTHING_MEASURED = 5
EXIT_STATUSES = (
    (OK, "done; for check, every run's input share is within the limit"),
    (CHECK_FAILED, "check: a run's input share of step time is above --max-input-fraction"),
    (USAGE, "the command line is wrong (argparse's message says how)"),
    (NO_REPORT, "no report.json where the path points, nor in the folders below it"),
    (
        UNREADABLE,
        "a report.json that is not a report this version reads, or holds a value no run "
        "writes (a negative duration, a share outside 0-1): the field at fault is named",
    ),
    (NOTHING_MEASURED, "the report holds no measured training step, or no input share to judge"),
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keras-pipeline-tuner",
        description=(
            "Find out whether a Keras model waits for its tf.data input pipeline, why, "
            "and what to change."
        ),
        epilog="exit statuses:\n"
        + "\n".join(f"  {status}  {meaning}" for status, meaning in EXIT_STATUSES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    demo.add_argument("--quick", action="store_true", help="fewer images and steps (~30 s)")
    report = commands.add_parser(
        "report",
        help="print the verdict and advice stored in a log dir",
        description=(
            "Prints the report a PipelineTuner wrote to LOGDIR/report.json; for a folder "
            "of runs (e.g. the demo's naive/ and tuned/), each run's report below it."
        ),
    )
    report.add_argument("log_dir", metavar="LOGDIR")
    compare = commands.add_parser(
        "compare",
        help="two runs side by side: step time, input wait, compute, verdict",
        description=(
            "Compares the training steps of two runs (log dirs holding report.json, or "
            "report files): means, their ratio, and whether the medians differ by more "
            "than the runs' own step-to-step spread."
        ),
    )
    compare.add_argument("run_a", metavar="RUN_A", help="the baseline: a log dir or report.json")
    compare.add_argument("run_b", metavar="RUN_B", help="the other run: a log dir or report.json")
    check = commands.add_parser(
        "check",
        help="exit 1 when a run waits for input more than allowed (a CI gate)",
        description=(
            "Reads LOGDIR/report.json (for a folder of runs, each run's report below it, as "
            "`report` does) and exits with status 1 when a run's share of training step time "
            "spent waiting for input exceeds --max-input-fraction, 0 when none does; 3-5 "
            "when there is no report to judge (see keras-pipeline-tuner --help)."
        ),
    )
    check.add_argument("log_dir", metavar="LOGDIR", help="a log dir or report.json")
    check.add_argument(
        "--max-input-fraction",
        type=_fraction,
        default=0.2,
        metavar="F",
        help="the largest share of step time the input may cost (the verdict's input "
        "fraction), 0-1 (default 0.2)",
    )
    return parser


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(
            f"must be a share between 0 and 1, e.g. 0.2 for 20 %, got {text!r}"
        )
    return value


class _NoReport(Exception):
    """The path given holds no readable report; the message says what to pass.

    Args:
        message: what is wrong and what to pass instead.
        status: `NO_REPORT` (nothing there) or `UNREADABLE` (not a report).
    """

    def __init__(self, message: str, status: int = NO_REPORT):
        super().__init__(message)
        self.status = status


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
    if args.command == "compare":
        return _compare(args.run_a, args.run_b)
    if args.command == "check":
        return _check(args.log_dir, args.max_input_fraction)
    if (
        args.log_dir is not None
        and os.path.exists(args.log_dir)
        and not os.path.isdir(args.log_dir)
    ):
        return _failed(
            ValueError(
                f"--log-dir {args.log_dir} is a file, not a folder: pass a folder (new or "
                "existing) for the demo's images and logs."
            ),
            USAGE,
        )
    from keras_pipeline_tuner.demo import run_demo

    run_demo(log_dir=args.log_dir, quick=args.quick)
    return OK


def _load_report(path: str):
    """The `Report` in a log dir or a report file, local or on a TensorFlow file system."""
    from keras_pipeline_tuner._util import files
    from keras_pipeline_tuner.outputs.report import REPORT_FILENAME
    from keras_pipeline_tuner.outputs.report import Report

    try:
        if files.is_file(path):
            file_path = path
        elif files.exists(path):
            file_path = os.path.join(path, REPORT_FILENAME)
            if not files.is_file(file_path):
                raise _NoReport(
                    f"no report in {path!r} (expected {REPORT_FILENAME}). "
                    "Pass the log_dir given to PipelineTuner(log_dir=...) after a fit has ended."
                )
        else:
            raise _NoReport(
                f"{path!r} does not exist. Pass a log dir holding {REPORT_FILENAME}, or the file."
            )
        text = files.read_text(file_path)
    except (ImportError, OSError, UnicodeDecodeError) as error:
        raise _NoReport(f"cannot read {path}: {error}", UNREADABLE) from error
    try:
        return Report.from_json(text)
    except ValueError as error:
        raise _NoReport(f"cannot read {path}: {error}", UNREADABLE) from error


def _failed(error: Exception, status: int = NO_REPORT) -> int:
    sys.stderr.write(f"keras-pipeline-tuner: {error}\n")
    return getattr(error, "status", status)


def _reports_at(log_dir: str) -> Optional[List[str]]:
    """The reports a path holds: itself (a log dir or a report file), or each run below it.

    `None` for a folder with no report in it or below it.
    """
    from keras_pipeline_tuner.outputs.report import REPORT_FILENAME

    if not os.path.isdir(log_dir) or os.path.isfile(os.path.join(log_dir, REPORT_FILENAME)):
        return [log_dir]
    return _runs_below(log_dir, REPORT_FILENAME) or None


def _each_report(log_dir: str, read) -> int:
    """`read(path, name)` for each report at `log_dir` (`_reports_at`); the worst status.

    A folder of runs (e.g. the demo's naive/ and tuned/) is read run by run,
    each named by its folder, so that one command reads what the other does.
    """
    from keras_pipeline_tuner.outputs.report import REPORT_FILENAME

    runs = _reports_at(log_dir)
    if runs is None:
        return _failed(
            f"no report in {log_dir!r} or the folders below it (expected {REPORT_FILENAME}). "
            "Pass the log_dir given to PipelineTuner(log_dir=...) after a fit has ended."
        )
    if runs == [log_dir]:
        return read(log_dir, None)
    status = OK
    for run in runs:
        status = max(status, read(run, os.path.relpath(os.path.dirname(run), log_dir)))
    return status


def _report(log_dir: str) -> int:
    def read(path: str, name: Optional[str]) -> int:
        if name is not None:
            sys.stdout.write(f"\n== {name} ==\n")
            sys.stdout.flush()
        return _print_report(path)

    return _each_report(log_dir, read)


def _runs_below(log_dir: str, filename: str, depth: int = 3) -> List[str]:
    from keras_pipeline_tuner.outputs.log_dir_runs import RUN

    found = []
    for root, folders, names in os.walk(log_dir):
        if os.path.relpath(root, log_dir).count(os.sep) >= depth:
            folders[:] = []
        # A profile capture holds no report; skip its large folders. A log dir's
        # runs keep their own reports in its pipeline_tuner folder: the log
        # dir's own report (its latest training run) stands for them.
        folders[:] = sorted(name for name in folders if name not in ("plugins", RUN))
        if filename in names and root != log_dir:
            found.append(os.path.join(root, filename))
    return sorted(found)


def _print_report(path: str) -> int:
    from keras_pipeline_tuner.outputs.terminal import print_summary

    try:
        report = _load_report(path)
    except _NoReport as error:
        return _failed(error)
    print_summary(report, details=True)
    if not report.train.steps:
        # A run that measured nothing must not pass for a good one in a script.
        sys.stderr.write(
            f"keras-pipeline-tuner: the report in {path!r} holds no measured training "
            "step, so it has no verdict: the fit ended (or failed) before its first "
            "timed step. See the notes above.\n"
        )
        return NOTHING_MEASURED
    return OK


def _compare(run_a: str, run_b: str) -> int:
    from keras_pipeline_tuner.outputs.comparison import compare_reports
    from keras_pipeline_tuner.outputs.comparison import format_comparison

    try:
        report_a, report_b = _load_report(run_a), _load_report(run_b)
    except _NoReport as error:
        return _failed(error)
    sys.stdout.write(format_comparison(compare_reports(report_a, report_b), run_a, run_b))
    return OK


def _check(log_dir: str, max_fraction: float) -> int:
    def read(path: str, name: Optional[str]) -> int:
        return _check_one(path, name, max_fraction)

    return _each_report(log_dir, read)


def _check_one(path: str, name: Optional[str], max_fraction: float) -> int:
    """One run's line of `check`, and its status."""
    try:
        report = _load_report(path)
    except _NoReport as error:
        return _failed(error)
    fraction = report.input_fraction
    if fraction is None:
        return _failed(
            f"the report in {path!r} has no input fraction: the input wait was not "
            f"measured ({report.measurement}). See its notes with "
            f"`keras-pipeline-tuner report {path}`.",
            NOTHING_MEASURED,
        )
    # The verdict's figure: the wait, or the input's measured cost where the
    # replay found the pipeline slowing the step beyond its wait.
    run = f"{name}: " if name is not None else ""
    shown = f"{run}input {fraction * 100:.1f} % of training step time ({report.verdict.value})"
    if fraction > max_fraction:
        sys.stdout.write(
            f"FAIL: {shown}, more than the allowed {max_fraction * 100:.1f} %. "
            f"See what to change with `keras-pipeline-tuner report {path}`.\n"
        )
        return CHECK_FAILED
    sys.stdout.write(f"OK: {shown}, within the allowed {max_fraction * 100:.1f} %.\n")
    return OK


if __name__ == "__main__":
    sys.exit(main())
