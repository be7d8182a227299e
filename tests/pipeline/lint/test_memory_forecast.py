"""The memory forecast: caches and buffers against the job's memory, before any element is read."""

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline
from keras_pipeline_tuner.pipeline.lint import memory_forecast
from keras_pipeline_tuner.pipeline.lint.tf_data_rules import lint
from keras_pipeline_tuner.timing.memory_budget import CGROUP_V1
from keras_pipeline_tuner.timing.memory_budget import CGROUP_V2
from keras_pipeline_tuner.timing.memory_budget import MemoryBudget
from tests.helpers.paths import REPO_ROOT

GIB = 2**30


def big(i):
    return tf.zeros([1024 * 1024], tf.float32)  # 4 MiB an element


def cached(elements=768):
    return tf.data.Dataset.range(elements).map(big).cache().shuffle(64).batch(4)


@pytest.mark.parametrize(
    "budget, severity", [(1 * GIB, "error"), (5 * GIB, "warning"), (16 * GIB, None)]
)
def test_a_cache_is_set_against_the_jobs_memory(budget, severity):
    dataset = cached()
    found = memory_forecast.forecast(
        dataset, read_pipeline(dataset), MemoryBudget(budget, CGROUP_V2, "/job")
    )
    cache, shuffle = found.buffers
    assert (cache.kind, cache.bytes, cache.how) == ("cache", 3 * GIB, "768 elements of 4.0 MiB")
    assert (shuffle.kind, shuffle.bytes) == ("shuffle", 64 * 4 * 2**20)
    findings = memory_forecast.memory_findings(found)
    if severity is None:
        assert not findings
        return
    (finding,) = findings
    assert finding.id == "cache-memory" and finding.severity == severity
    assert finding.stage == "cache()"
    # Both sizes, and what sets the limit.
    assert "3.0 GiB" in finding.reason and f"{budget / GIB:.1f} GiB" in finding.reason
    assert "memory.max" in finding.reason
    assert found.cache_fits(finding.node) is (severity != "error")


def test_a_cache_of_unknown_size_is_said_unknown():
    def endless():
        while True:
            yield 1.0

    dataset = tf.data.Dataset.from_generator(endless, output_types=tf.float32).cache()
    found = memory_forecast.forecast(dataset, None, MemoryBudget(GIB, CGROUP_V1))
    (cache,) = found.buffers
    assert cache.bytes is None and not memory_forecast.memory_findings(found)


def _in_cgroup(cgroup, what):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "tests.helpers.memory_fit", cgroup, what],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.multiprocess
def test_a_3_gib_cache_in_a_1_gib_cgroup_is_reported_before_any_element_is_read(memory_cgroup):
    cgroup = memory_cgroup(GIB)
    inspected = _in_cgroup(cgroup, "inspect")
    assert inspected["budget"] == GIB, inspected
    assert inspected["budget_source"] == "cgroup memory.limit_in_bytes" or (
        inspected["budget_source"] == "cgroup memory.max"
    )
    (error,) = [f for f in inspected["findings"] if f["id"] == "cache-memory"]
    assert error["severity"] == "error" and error["stage"] == "cache()"
    assert "3.0 GiB" in error["reason"] and "1.0 GiB" in error["reason"]
    # From the graph alone: the pipeline made no element.
    assert inspected["elements_read"] == 0, inspected
    # A fit on it says so before its first step (and stops after it: the cache never fills).
    fitted = _in_cgroup(cgroup, "fit")
    said = " ".join(fitted["before_first_step"])
    assert "error cache-memory" in said and "3.0 GiB" in said and "1.0 GiB" in said, fitted


def test_cache_advice_never_recommends_a_cache_that_will_not_fit():
    def expensive(i):
        small = tf.fill([32, 32, 1], tf.cast(i, tf.float32))
        return tf.image.resize(small, [1024, 1024])  # 4 MiB an element, a resize: expensive

    dataset = tf.data.Dataset.range(768).map(expensive, num_parallel_calls=tf.data.AUTOTUNE)
    findings = memory_forecast.forecast(dataset, read_pipeline(dataset), None)

    linted = lint(read_pipeline(dataset))
    (cache_missing,) = [f for f in linted if f.id == "cache-missing"]
    roomy = dataclasses_replace(findings, MemoryBudget(64 * GIB, CGROUP_V2))
    tight = dataclasses_replace(findings, MemoryBudget(GIB, CGROUP_V2))
    assert memory_forecast.fits(roomy, cache_missing)
    assert not memory_forecast.fits(tight, cache_missing)
    assert memory_forecast.fits(None, cache_missing)


def dataclasses_replace(found, budget):
    import dataclasses

    return dataclasses.replace(found, budget=budget)
