"""A full disk in phases 1, 2 and 4 is one line naming where it was writing and what to do, as in phase 3."""

from __future__ import annotations

import errno
import os

import phase1_prepare_data as phase1
import phase2_generate_teacher_traces as phase2
import phase4_evaluate as phase4
import utils.jsonl
from tests.task_factory import assert_task
from utils.dataset_loader import write_tasks


def disk_full(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a write or fsync on a full disk: no file name


def error_lines(capsys) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("error:")]


def test_phase1_on_a_full_disk_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(utils.jsonl.os, "fsync", disk_full)  # write_files_atomic's fsync of the first file
    data_dir = tmp_path / "data"
    assert phase1.cli(["--preset", "cpu", "--set", f"paths.data_dir={data_dir}"]) == 1
    [line] = error_lines(capsys)
    assert f"no space left on device while writing {data_dir}; free space and rerun the same command" in line
    assert "nothing was written" in line
    assert not (data_dir / "train.jsonl").exists()


def test_phase2_references_on_a_full_disk_is_one_line_and_leaves_no_empty_trace_file(tmp_path, monkeypatch, capsys):
    task = assert_task(
        "mbpp/1", "add", "assert add(1, 2) == 3", reference_solutions=("def add(a, b):\n    return a + b\n",)
    )
    task_file = write_tasks(tmp_path / "tasks.jsonl", [task])
    traces = tmp_path / "traces.jsonl"
    monkeypatch.setattr(utils.jsonl.JsonlAppender, "write", lambda self, record: disk_full())
    argv = ["--preset", "cpu", "--teacher", "references", "--input", str(task_file), "--output", str(traces)]
    assert phase2.cli(argv) == 1
    [line] = error_lines(capsys)
    assert f"no space left on device while writing {traces}" in line and "rerun the same command" in line
    assert not traces.exists()  # not a 0-byte trace file


def test_phase4_on_a_full_disk_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(phase4, "load_eval_set", lambda *a, **k: None)
    monkeypatch.setattr(phase4, "main", disk_full)
    assert phase4.cli(["--preset", "cpu", "--output_dir", str(tmp_path)]) == 1
    [line] = error_lines(capsys)
    assert f"no space left on device while writing {tmp_path}; free space and rerun the same command" in line
    assert "cached in" in line
