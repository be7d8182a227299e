"""Step rows downsampled on the server: few marks for a long run, every step when zoomed."""

import numpy as np
import pytest

from keras_pipeline_tuner.outputs.dashboard import summaries
from keras_pipeline_tuner.outputs.dashboard.step_series import MAX_POINTS
from keras_pipeline_tuner.outputs.dashboard.step_series import downsample


def rows(count: int, epochs: int = 1) -> np.ndarray:
    numbers = np.arange(1, count + 1, dtype=np.float64)
    epoch = (numbers - 1) // (count // epochs)
    wait = (numbers % 10) * 1e-3
    compute = np.full(count, 2e-3)
    start = np.cumsum(wait + compute) - (wait + compute)
    return summaries.widened(np.stack([numbers, epoch, start, wait, compute], axis=1))


def test_few_steps_are_sent_one_mark_each():
    series = downsample(rows(50), points=100)
    assert series.bucket_steps == 1
    assert series.step == series.last == list(range(1, 51))
    assert series.wait_ms == pytest.approx([(n % 10) * 1.0 for n in range(1, 51)])
    assert series.compute_ms == pytest.approx([2.0] * 50)


def test_many_steps_become_buckets_holding_their_means_and_maxima():
    data = rows(100_000, epochs=4)
    series = downsample(data, points=2000)
    assert len(series.step) == 2000 and series.bucket_steps == 50
    assert series.step[1] == 51 and series.last[0] == 50 and series.last[-1] == 100_000
    # Steps 1-50 wait 1..9, 0 ms in turn: mean 4.5 ms (step 50 waits 0), max 9 ms.
    assert series.wait_ms[0] == pytest.approx(np.mean([(n % 10) for n in range(1, 51)]))
    assert series.wait_max_ms[0] == pytest.approx(9.0)
    assert series.end_s[0] == pytest.approx(data[49, 2] + data[49, 3] + data[49, 4])
    assert [epoch["step"] for epoch in series.epochs] == [1, 25_001, 50_001, 75_001]
    assert series.total_steps == 100_000


def test_a_zoomed_range_comes_back_in_full_detail():
    series = downsample(rows(100_000), first=40_001, last=41_000, points=2000)
    assert series.bucket_steps == 1
    assert series.step == list(range(40_001, 41_001))
    # The whole run's extent is still said, for the "show all" view.
    assert (series.first_step, series.last_step) == (1, 100_000)


def test_unmeasured_waits_are_null_not_zero():
    data = rows(10)
    data[:, [3, 6]] = np.nan  # the wait and the largest wait
    series = downsample(data, points=5)
    assert series.wait_ms == [None] * 5 and series.wait_max_ms == [None] * 5
    assert series.compute_ms == pytest.approx([2.0] * 5)


def test_empty_runs_and_empty_ranges():
    assert downsample(np.zeros((0, len(summaries.STEP_COLUMNS)))).step == []
    series = downsample(rows(10), first=50, last=60)
    assert series.step == [] and series.total_steps == 10


@pytest.mark.parametrize("points", [0, MAX_POINTS + 1])
def test_points_out_of_range_are_refused(points):
    with pytest.raises(ValueError, match="`points` must be between 1 and"):
        downsample(rows(10), points=points)


def test_rows_of_blocks_of_steps_say_which_steps_and_keep_a_stall_visible():
    # As the tuner stores a long run: steps 1-1000 a row each, then rows of
    # blocks of 10 steps; step 2506 stalled for 1 s inside the block 2501-2510.
    single = rows(1000)
    blocks = []
    for last in range(1010, 3001, 10):
        stalled = last == 2510
        blocks.append(
            [
                last,
                0,
                single[-1, 2] + (last - 1000) * 0.01,
                0.0035 if not stalled else 0.1035,
                0.002,
                last - 9,
                1.0 if stalled else 0.009,
                0.002,
                1.002 if stalled else 0.011,
            ]
        )
    data = np.concatenate([single, np.array(blocks)])
    series = downsample(data, first=2401, last=2600, points=2000)
    assert not series.single_steps
    mark = series.last.index(2510)
    assert series.step[mark] == 2501
    # The mean hides the stall; the largest wait and step show it.
    assert series.wait_ms[mark] == pytest.approx(103.5)
    assert series.wait_max_ms[mark] == pytest.approx(1000.0)
    assert series.step_max_ms[mark] == pytest.approx(1002.0)
    assert downsample(rows(50), points=100).single_steps
