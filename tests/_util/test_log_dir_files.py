"""Files in a log dir: whole for every reader, whatever the writers and the file system."""

import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner._util import files
from keras_pipeline_tuner.outputs.report import REPORT_FILENAME
from tests.helpers.paths import REPO_ROOT

WRITES = 400

WRITER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    from keras_pipeline_tuner._util.files import write_atomically
    from keras_pipeline_tuner.outputs.report import Report, REPORT_FILENAME

    report = Report(notes=[sys.argv[3] * 2000])
    text = report.to_json()
    print("READY", flush=True)
    sys.stdin.readline()
    for _ in range(int(sys.argv[4])):
        write_atomically(sys.argv[2], REPORT_FILENAME, text)
    print("DONE", flush=True)
    """
)


def test_two_processes_writing_one_log_dir_never_tear_a_report(tmp_path):
    log_dir = str(tmp_path)
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(REPO_ROOT), log_dir, mark, str(WRITES)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mark in "ab"
    ]
    for writer in writers:
        assert writer.stdout.readline().strip() == "READY"
    for writer in writers:  # both start together
        writer.stdin.write("go\n")
        writer.stdin.flush()
    path = os.path.join(log_dir, REPORT_FILENAME)
    seen = set()
    while any(writer.poll() is None for writer in writers):
        if os.path.exists(path):
            report = kpt.Report.from_json(files.read_text(path))  # never torn
            seen.add(report.notes[0][0])
    for writer in writers:
        out, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err[-2000:]
        assert out.strip() == "DONE"
    seen.add(kpt.Report.from_json(files.read_text(path)).notes[0][0])
    assert seen <= {"a", "b"} and seen
    assert os.listdir(log_dir) == [REPORT_FILENAME]  # no temporary file left behind


def test_temporary_names_are_never_shared():
    names = {files.temporary_name("logs/report.json") for _ in range(1000)}
    assert len(names) == 1000
    assert all(name.endswith(files.PARTIAL_SUFFIX) for name in names)


def test_remote_paths_go_through_tensorflow_and_fail_as_os_errors():
    directory = "ram://files_test/a/b"
    path = files.write_atomically(directory, "x.json", '{"é": 1}')
    assert path == f"{directory}/x.json"
    assert tf.io.gfile.GFile(path, "rb").read().decode("utf-8") == '{"é": 1}'
    assert files.read_text(path) == '{"é": 1}'
    assert files.is_file(path) and not files.is_file(directory)
    assert files.size(path) == len('{"é": 1}'.encode("utf-8"))
    assert files.list_dir(directory) == ["x.json"]
    with files.local_copy(path) as local:
        assert not files.is_remote(local)
        with open(local, encoding="utf-8") as file:
            assert file.read() == '{"é": 1}'
    assert not os.path.exists(local)
    files.remove(path)
    files.remove(path)  # already gone: nothing to do
    with pytest.raises(FileNotFoundError, match="x.json"):
        files.read_text(path)
