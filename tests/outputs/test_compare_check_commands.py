"""`keras-pipeline-tuner compare` and `check` on the reports of real fits."""

import json
import re

import numpy as np
import pytest

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner import cli
from keras_pipeline_tuner.outputs.comparison import compare_reports
from keras_pipeline_tuner.outputs.comparison import format_comparison
from keras_pipeline_tuner.timing.step_stats import Distribution
from keras_pipeline_tuner.timing.step_stats import StepStats
from keras_pipeline_tuner.timing.step_stats import verdict_for
from tests.helpers.training_data import cached_source
from tests.helpers.training_data import slow_source
from tests.helpers.training_data import tiny_model
from tests.outputs.test_cli import run

# A sleep that dominates the step: a busy machine stalls a few steps by tens
# of milliseconds, which must not reach the middle half of them.
INPUT_DELAY_S = 0.03
COMPUTE_DELAY_S = 0.015
STEPS = 20


@pytest.fixture(scope="module")
def fits(tmp_path_factory):
    """An input-bound and a compute-bound fit, each with its report.json."""
    root = tmp_path_factory.mktemp("compare")
    runs = {}
    for name, dataset, model in (
        ("input_bound", slow_source(STEPS, INPUT_DELAY_S).batch(1), tiny_model()),
        ("compute_bound", cached_source(STEPS).batch(1), tiny_model(COMPUTE_DELAY_S)),
    ):
        tuner = kpt.PipelineTuner(log_dir=root / name, verbose=0, profile="off")
        model.fit(dataset, epochs=1, callbacks=[tuner], verbose=0)
        runs[name] = (root / name, tuner.report)
    return runs


def main(capsys, *args):
    status = cli.main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def test_compare_puts_two_runs_side_by_side(fits, capsys):
    (dir_a, report_a), (dir_b, report_b) = fits["input_bound"], fits["compute_bound"]
    assert report_a.verdict.value == "highly input-bound"
    status, out, err = main(capsys, "compare", str(dir_a), str(dir_b / "report.json"))
    assert status == 0, err
    assert f"A: {dir_a}" in out and f"B: {dir_b / 'report.json'}" in out
    comparison = compare_reports(report_a, report_b)
    lines = {line.split("  ")[0]: line for line in out.splitlines()}
    for timing in comparison.timings:
        assert f"{timing.ratio:.2f}x" in lines[timing.name]
    # 30 ms of wait against almost none: far beyond either run's spread.
    wait = comparison.timings[1]
    assert wait.beyond_spread and lines["input wait"].rstrip().endswith("yes")
    assert report_a.verdict.value in lines["verdict"] and report_b.verdict.value in lines["verdict"]
    assert f"{report_a.input_fraction * 100:.1f} %" in lines["input share"]


def test_a_run_compared_with_itself_differs_by_nothing(fits, capsys):
    log_dir, _ = fits["input_bound"]
    status, out, _ = main(capsys, "compare", str(log_dir), str(log_dir))
    assert status == 0
    for name in ("step", "input wait", "compute"):
        line = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert re.search(r"1\.00x\s+\+0\.00 ms\s+\S+ ms\s+no$", line), line


def test_compare_names_a_missing_run(fits, tmp_path, capsys):
    log_dir, _ = fits["input_bound"]
    status, out, err = main(capsys, "compare", str(log_dir), str(tmp_path / "nowhere"))
    assert status == cli.NO_REPORT and out == ""
    assert "nowhere' does not exist" in err and "report.json" in err


@pytest.mark.parametrize(
    "run_name, limit, status, word",
    [
        ("input_bound", "0.2", 1, "FAIL"),
        ("input_bound", "1", 0, "OK"),
        ("compute_bound", "0.2", 0, "OK"),
    ],
)
def test_check_gates_on_the_input_fraction(fits, capsys, run_name, limit, status, word):
    log_dir, report = fits[run_name]
    code, out, err = main(capsys, "check", str(log_dir), "--max-input-fraction", limit)
    assert code == status, err
    assert out.startswith(f"{word}: input {report.input_fraction * 100:.1f} %")
    assert f"allowed {float(limit) * 100:.1f} %" in out


@pytest.mark.parametrize("run_name", ["input_bound", "compute_bound"])
def test_check_passes_just_above_the_measured_share_and_fails_just_below(fits, capsys, run_name):
    log_dir, report = fits[run_name]
    fraction = report.input_fraction
    above, below = min(fraction + 0.01, 1.0), max(fraction - 0.01, 0.0)
    assert main(capsys, "check", str(log_dir), "--max-input-fraction", str(above))[0] == 0
    # A share of 0 (no wait beyond the fetch of a ready batch) passes any limit.
    expected = 1 if fraction > below else 0
    assert main(capsys, "check", str(log_dir), "--max-input-fraction", str(below))[0] == expected


def test_check_exit_status_from_the_console_script(fits):
    log_dir, _ = fits["input_bound"]
    done = run("check", str(log_dir), "--max-input-fraction", "0.2")
    assert done.returncode == 1, done.stderr
    assert "FAIL" in done.stdout and "more than the allowed 20.0 %" in done.stdout
    done = run("check", str(log_dir), "--max-input-fraction", "1")
    assert done.returncode == 0, done.stderr


def test_check_without_a_report(tmp_path, capsys):
    status, out, err = main(capsys, "check", str(tmp_path))
    assert status == cli.NO_REPORT and out == ""
    assert "no report in" in err and "PipelineTuner(log_dir=...)" in err


def test_check_of_a_corrupt_report(tmp_path, capsys):
    (tmp_path / "report.json").write_text('{"input_fraction": "high"}')
    status, _, err = main(capsys, "check", str(tmp_path))
    assert status == cli.UNREADABLE and "report.input_fraction" in err


def test_check_of_a_run_whose_wait_was_not_measured(tmp_path, capsys):
    (tmp_path / "report.json").write_text(kpt.Report(measurement="whole-step").to_json())
    status, _, err = main(capsys, "check", str(tmp_path))
    assert status == cli.NOTHING_MEASURED
    assert "no input fraction" in err and "whole-step" in err


@pytest.mark.parametrize("command", ["check", "report", "compare"])
@pytest.mark.parametrize(
    "field, value, said",
    [
        ("input_fraction", -0.5, "report.input_fraction is -0.5, a share"),
        ("input_fraction", 7.0, "report.input_fraction is 7.0, a share"),
        ("tuner_cost.after_training_s", -3.0, "report.tuner_cost.after_training_s is -3.0"),
        ("train.steps", -2, "report.train.steps is -2"),
    ],
)
def test_every_command_refuses_a_report_with_an_impossible_value(
    tmp_path, capsys, command, field, value, said
):
    data = json.loads(kpt.Report(input_fraction=0.1).to_json())
    data["tuner_cost"] = {"after_training_s": 1.0, "budget_s": 2.0}
    where = data
    *parents, name = field.split(".")
    for parent in parents:
        where = where[parent]
    where[name] = value
    (tmp_path / "report.json").write_text(json.dumps(data))
    paths = [str(tmp_path)] * (2 if command == "compare" else 1)
    status, out, err = main(capsys, command, *paths)
    assert status == cli.UNREADABLE and out == "", (out, err)
    assert said in err, err


def test_check_reads_every_run_of_a_folder_as_report_does(tmp_path, capsys):
    for name, fraction in (("naive", 0.5), ("tuned", 0.01)):
        (tmp_path / name).mkdir()
        report = kpt.Report(input_fraction=fraction, verdict=verdict_for(fraction))
        (tmp_path / name / "report.json").write_text(report.to_json())
    status, out, err = main(capsys, "check", str(tmp_path))
    assert status == cli.CHECK_FAILED, err
    lines = out.splitlines()
    assert len(lines) == 2, out
    assert lines[0].startswith("FAIL: naive: input 50.0 %") and lines[1].startswith(
        "OK: tuned: input 1.0 %"
    ), out
    status, out, _ = main(capsys, "check", str(tmp_path), "--max-input-fraction", "0.6")
    assert status == cli.OK and out.count("OK: ") == 2, out
    status, out, _ = main(capsys, "report", str(tmp_path))
    assert status == cli.NOTHING_MEASURED and "== naive ==" in out and "== tuned ==" in out


def test_every_exit_status_is_distinct_and_listed_in_help(capsys):
    statuses = [status for status, _ in cli.EXIT_STATUSES]
    assert len(set(statuses)) == len(statuses)
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    shown = capsys.readouterr().out
    for status, meaning in cli.EXIT_STATUSES:
        assert f"  {status}  {meaning}" in shown


@pytest.mark.parametrize("limit", ["1.5", "-0.1", "a fifth", "nan"])
def test_check_refuses_a_limit_outside_zero_to_one(tmp_path, capsys, limit):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["check", str(tmp_path), "--max-input-fraction", limit])
    assert exit_info.value.code == 2
    assert "must be a share between 0 and 1" in capsys.readouterr().err


def test_help_lists_the_commands():
    done = run("--help")
    assert done.returncode == 0
    assert "compare" in done.stdout and "check" in done.stdout


def _report_with_epochs(*epochs_ms):
    """A report whose training epochs' steps take the given (wait, compute) ms each."""
    from keras_pipeline_tuner.timing.step_clock import EpochBreakdown

    epochs, waits, computes = [], [], []
    for index, (wait_ms, compute_ms) in enumerate(epochs_ms):
        wait, compute = np.full(20, wait_ms / 1e3), np.full(20, compute_ms / 1e3)
        # A little spread within an epoch, as real steps have.
        compute = compute * np.linspace(0.98, 1.02, 20)
        waits.append(wait)
        computes.append(compute)
        stats = StepStats.from_arrays(wait, compute)
        epochs.append(EpochBreakdown(epoch=index, kind="train", setup_ms=1.0, stats=stats))
    train = StepStats.from_arrays(np.concatenate(waits), np.concatenate(computes))
    return kpt.Report(train=train, epochs=epochs)


def test_compare_reads_the_steady_state_not_the_cache_filling_epoch():
    # The tuned run's first epoch fills a cache (300 ms of wait a step), then
    # its steps take 1 ms; the naive run waits 300 ms a step throughout.
    naive = _report_with_epochs((300.0, 1.0), (300.0, 1.0), (300.0, 1.0))
    tuned = _report_with_epochs((300.0, 1.0), (0.0, 1.0), (0.0, 1.0))
    comparison = compare_reports(naive, tuned)
    step = comparison.timings[0]
    assert comparison.scope_a == comparison.scope_b == "epoch 3 of 3"
    assert step.ratio == pytest.approx(1.0 / 301.0, rel=0.05)
    assert step.beyond_spread is True
    assert "steps compared  epoch 3 of 3" in format_comparison(comparison, "naive", "tuned")


def test_a_few_stalled_steps_do_not_hide_a_difference_every_step_shows():
    # Every step of A waits 15 ms, every step of B 0.5 ms; a busy machine
    # stalled three of A's 16 steps by 40 ms, which lifts its p90 by far more
    # than the 14.5 ms between the medians.
    wait_a = np.full(16, 0.015)
    wait_a[[3, 9, 14]] += 0.040
    a = kpt.Report(train=StepStats.from_arrays(wait_a, np.full(16, 0.001)))
    b = kpt.Report(train=StepStats.from_arrays(np.full(16, 0.0005), np.full(16, 0.001)))
    assert a.train.input_wait.p90_ms - a.train.input_wait.median_ms > 14.5
    wait = compare_reports(a, b).timings[1]
    assert wait.median_difference_ms == pytest.approx(-14.5)
    assert wait.spread_ms == pytest.approx(0.0) and wait.beyond_spread is True


def test_steps_that_vary_as_much_as_they_differ_are_called_noise():
    steps = np.array([0.010, 0.020] * 8)
    a = kpt.Report(train=StepStats.from_arrays(steps * 0, steps))
    b = kpt.Report(train=StepStats.from_arrays(steps * 0, steps[::-1] + 0.002))
    step = compare_reports(a, b).timings[0]
    assert step.spread_ms == pytest.approx(10.0) and step.beyond_spread is False


def test_a_report_without_quartiles_is_spread_by_its_p90():
    # A report.json written before the quartiles were kept has no such keys.
    old = Distribution(mean_ms=20.0, median_ms=18.0, p90_ms=30.0)
    data = json.loads(kpt.Report(train=StepStats(steps=16, input_wait=old)).to_json())
    del data["train"]["input_wait"]["p25_ms"], data["train"]["input_wait"]["p75_ms"]
    a = kpt.Report.from_json(json.dumps(data))
    new = Distribution.of_seconds(np.full(16, 0.005))
    b = kpt.Report(train=StepStats(steps=16, input_wait=new))
    wait = compare_reports(a, b).timings[1]
    assert wait.spread_ms == pytest.approx(12.0) and wait.beyond_spread is True
