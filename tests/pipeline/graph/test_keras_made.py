"""Stages Keras builds itself are named, and advised, as the call the user wrote.

`keras.utils.image_dataset_from_directory(...)` loads its files in a map of a
lambda inside Keras. Fit with the tuner and a profiler window over a tiny
directory of generated images, and `kpt.inspect`, must name that stage
`image_dataset_from_directory(...)` everywhere, and its advice must be code the
user can run in place of their call.
"""

import wave

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline
from tests.helpers import advising

IMAGES = 32
SIZE = 128
IMAGE_SIZE = (64, 64)
BATCH = 8
LABEL = "image_dataset_from_directory(...)"


@pytest.fixture(scope="module")
def image_directory(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for index in range(IMAGES):
        folder = root / ("circles" if index % 2 else "squares")
        folder.mkdir(exist_ok=True)
        # Noise does not compress: decoding each file costs real work.
        pixels = rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
        keras.utils.save_img(str(folder / f"{index}.png"), pixels)
    return root


def _images(directory, **kwargs):
    arguments = dict(image_size=IMAGE_SIZE, batch_size=BATCH, seed=1, verbose=False)
    arguments.update(kwargs)
    return keras.utils.image_dataset_from_directory(str(directory), **arguments)


def _texts(report):
    """Every stage name, title, reason, fix and evidence the report shows."""
    texts = []
    for finding in report.findings:
        texts += [finding.stage, finding.function or "", finding.reason, finding.fix]
    for recommendation in report.recommendations:
        texts += [recommendation.stage or "", recommendation.title, recommendation.reason]
        texts += [recommendation.fix] + [evidence.detail for evidence in recommendation.evidence]
    if report.profile is not None:
        texts += [iterator.stage for iterator in report.profile.iterators]
        texts.append(report.profile.bottleneck or "")
    return texts


def test_fit_names_keras_loader_as_the_users_call(image_directory, tmp_path):
    model = keras.Sequential(
        [keras.Input(IMAGE_SIZE + (3,)), keras.layers.Flatten(), keras.layers.Dense(1)]
    )
    model.compile(optimizer="sgd", loss="mse")
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(1, 4))
    model.fit(_images(image_directory), epochs=2, callbacks=[tuner], verbose=0)
    report = tuner.wait_for_profile()
    assert report.profile is not None, report.notes
    texts = _texts(report)
    assert not [text for text in texts if "<lambda>" in text]
    # The profiler timed the loader, named as the call.
    assert LABEL in [iterator.stage for iterator in report.profile.iterators]
    assert LABEL in [finding.stage for finding in report.findings]
    # Its advice is about the call: the utility's arguments and a cache. (Only
    # moderately input-bound, on a busy machine, a cache over two epochs may
    # bring under 1.05x, and a change that cannot help is no advice.)
    advised = [r for r in report.recommendations if r.stage == LABEL]
    if report.verdict == kpt.Verdict.HIGHLY_INPUT_BOUND:
        assert advised, report.recommendations
    if advised:
        assert "keras.utils.image_dataset_from_directory(" in advised[0].fix


def test_inspect_advises_a_cache_the_user_can_write(image_directory):
    findings = kpt.inspect(_images(image_directory))
    assert not [f for f in findings if "<lambda>" in f.stage + f.reason + f.fix]
    (cache,) = [f for f in findings if f.id == "cache-missing"]
    assert cache.stage == LABEL and cache.function == "image_dataset_from_directory"
    assert "keras.utils.image_dataset_from_directory(" in cache.fix
    # Run as written, with the user's directory (and their other arguments).
    namespace = {"keras": keras, "tf": tf, "directory": str(image_directory)}
    code = cache.fix.replace(
        "directory, shuffle=False", f"directory, image_size={IMAGE_SIZE}, shuffle=False"
    )
    exec(code, namespace)  # noqa: S102 - the advice is code, to be run
    fixed = namespace["ds"]
    images, labels = next(iter(fixed))
    assert images.shape == (BATCH,) + IMAGE_SIZE + (3,) and labels.shape == (BATCH,)
    assert sum(int(batch[1].shape[0]) for batch in fixed) == IMAGES
    # Fixed: no missing cache, and no new finding (no cache after a shuffle).
    again = kpt.inspect(fixed)
    assert "cache-missing" not in again.ids
    assert set(again.ids) <= set(findings.ids) - {"cache-missing"}


def test_the_other_keras_utilities_are_named_too(tmp_path):
    for name in ("a", "b"):
        (tmp_path / "text" / name).mkdir(parents=True)
        (tmp_path / "audio" / name).mkdir(parents=True)
        for index in range(2):
            (tmp_path / "text" / name / f"{index}.txt").write_text(f"words {index}")
            with wave.open(str(tmp_path / "audio" / name / f"{index}.wav"), "wb") as sound:
                sound.setnchannels(1)
                sound.setsampwidth(2)
                sound.setframerate(8000)
                sound.writeframes(np.zeros(400, np.int16).tobytes())
    made = {
        "text_dataset_from_directory(...)": keras.utils.text_dataset_from_directory(
            str(tmp_path / "text"), batch_size=2, verbose=False
        ),
        "audio_dataset_from_directory(...)": keras.utils.audio_dataset_from_directory(
            str(tmp_path / "audio"), batch_size=2, verbose=False
        ),
        "timeseries_dataset_from_array(...)": keras.utils.timeseries_dataset_from_array(
            np.arange(50, dtype=np.float32), None, sequence_length=5, batch_size=4
        ),
    }
    for label, dataset in made.items():
        labels = [stage.label for stage in read_pipeline(dataset).stages]
        assert label in labels and not [text for text in labels if "<lambda>" in text]


def test_a_lambda_the_user_wrote_keeps_its_name():
    paths = tf.data.Dataset.from_tensor_slices(["a.png", "b.png"])
    pipeline = read_pipeline(paths.map(lambda p: tf.strings.length(p)))
    labels = [stage.label for stage in pipeline.stages]
    assert labels == ["from_tensor_slices()", "map(<lambda>)"]


def test_a_profiled_keras_loader_gets_the_utilitys_advice(image_directory):
    # The profiler names the loader the bottleneck and no finding explains it:
    # the advice is about the user's call, not Keras' lambda.
    import numpy as np_

    from keras_pipeline_tuner.advice import advisor
    from keras_pipeline_tuner.pipeline.lint.findings import Findings
    from keras_pipeline_tuner.profiling.evidence import IteratorTime
    from keras_pipeline_tuner.profiling.evidence import ProfileEvidence
    from keras_pipeline_tuner.timing.step_stats import StepStats

    pipeline = read_pipeline(_images(image_directory))
    (loader,) = [stage for stage in pipeline.stages if stage.made_by]
    profile = ProfileEvidence(
        first_step=2,
        stop_step=10,
        input_fraction=0.8,
        iterators=[
            IteratorTime(
                iterator="Iterator::Root::Prefetch::Batch::ParallelMapV2",
                stage=loader.label,
                stage_node=loader.node,
                dataset_op="ParallelMapDatasetV2:11",
                calls=32,
                self_ms=80.0,
                total_ms=90.0,
                self_share=0.9,
                waiting=False,
            )
        ],
        bottleneck=loader.label,
        bottleneck_iterator="Iterator::Root::Prefetch::Batch::ParallelMapV2",
        bottleneck_node=loader.node,
    )
    stats = StepStats.from_arrays(np_.full(20, 0.03), np_.full(20, 0.005))
    (top,) = advising.advise(stats, profile, Findings([], pipeline))
    assert top.id == advisor.BOTTLENECK_STAGE and top.stage == LABEL
    assert "keras.utils.image_dataset_from_directory(" in top.fix
    assert "shuffle=False, batch_size=None" in top.fix
    assert "<lambda>" not in top.title + top.reason + top.fix


def test_shuffling_the_utilitys_batches_is_fixed_with_its_batch_size(image_directory):
    # The pattern of TensorFlow's image loading tutorial: cache, shuffle, prefetch.
    dataset = _images(image_directory).cache().shuffle(100).prefetch(tf.data.AUTOTUNE)
    findings = kpt.inspect(dataset)
    (shuffled,) = [f for f in findings if f.id == "shuffle-after-batch"]
    assert "image_dataset_from_directory(...)'s own" in shuffled.reason
    assert "batch_size=None" in shuffled.fix and "ds = ds.cache()" in shuffled.fix
    namespace = {"keras": keras, "tf": tf, "directory": str(image_directory)}
    code = shuffled.fix.replace(
        "directory, batch_size=None", f"directory, image_size={IMAGE_SIZE}, batch_size=None"
    )
    exec(code + "\nds = ds.prefetch(tf.data.AUTOTUNE)", namespace)  # noqa: S102
    fixed = namespace["ds"]
    images, _ = next(iter(fixed))
    assert images.shape == (BATCH,) + IMAGE_SIZE + (3,)
    again = kpt.inspect(fixed)
    assert "shuffle-after-batch" not in again.ids
    assert set(again.ids) <= set(findings.ids), again
