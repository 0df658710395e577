"""utils.jsonl: the one torn-line policy (torn last line repaired, bad middle line an error), the locked
appender and the atomic writes; and that every reader of the project's JSONL files follows the policy."""

from __future__ import annotations

import json

import pytest

from evaluation.evaluate import read_cache
from synthesis.generate_traces import load_teacher_examples
from utils.dataset_loader import read_tasks
from utils.jsonl import (
    DataFormatError,
    FileBusyError,
    JsonlAppender,
    iter_jsonl,
    publish_folder,
    read_jsonl,
    replace_folder,
    write_files_atomic,
    write_jsonl_atomic,
)

GOOD = [{"task_id": "a/1", "sample_idx": 0}, {"task_id": "a/2", "sample_idx": 0}]


def lines(records) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def test_strict_reader_names_file_and_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text(lines(GOOD[:1]) + "\n{oops\n" + lines(GOOD[1:]))
    with pytest.raises(DataFormatError, match=r"x\.jsonl:3: malformed JSON"):
        read_jsonl(path)
    path.write_text(lines(GOOD) + "[1, 2]\n")
    with pytest.raises(DataFormatError, match=r"x\.jsonl:3: expected a JSON object, got list"):
        read_jsonl(path)


def test_tolerant_reader_skips_only_a_torn_last_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text(lines(GOOD) + '{"task_id": "a/3", "sam')
    assert read_jsonl(path, tolerate_torn_tail=True) == GOOD
    with pytest.raises(DataFormatError, match=":3:"):
        read_jsonl(path)  # strict: even a torn tail is an error
    # a complete last record without its newline is kept
    path.write_text(lines(GOOD).rstrip("\n"))
    assert read_jsonl(path, tolerate_torn_tail=True) == GOOD
    # a bad line that is newline-terminated is never "torn", even at the end
    path.write_text(lines(GOOD) + "{oops\n")
    with pytest.raises(DataFormatError, match=":3:"):
        read_jsonl(path, tolerate_torn_tail=True)
    # and a bad middle line is an error for the tolerant reader too
    path.write_text(lines(GOOD[:1]) + "{oops\n" + lines(GOOD[1:]) + '{"torn')
    with pytest.raises(DataFormatError, match=r"x\.jsonl:2:"):
        read_jsonl(path, tolerate_torn_tail=True)


def test_appender_repairs_the_tail_locks_and_flushes(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text(lines(GOOD[:1]) + '{"torn')
    with JsonlAppender(path) as out:
        assert out.repaired
        with pytest.raises(FileBusyError):
            JsonlAppender(path)
        out.write(GOOD[1])
        assert read_jsonl(path) == GOOD  # flushed: visible before close
    # a complete last record lacking its newline gets one before the next append
    path.write_text(json.dumps(GOOD[0]))
    with JsonlAppender(path) as out:
        assert not out.repaired
        out.write(GOOD[1])
    assert read_jsonl(path) == GOOD
    # a bad middle line: refuse to append to it rather than cut it off
    path.write_text("{oops\n" + lines(GOOD))
    with pytest.raises(DataFormatError, match=":1:"):
        JsonlAppender(path)
    assert path.read_text() == "{oops\n" + lines(GOOD)


def test_atomic_writes_leave_no_temporary_files(tmp_path):
    write_jsonl_atomic(tmp_path / "sub" / "a.jsonl", GOOD)
    assert read_jsonl(tmp_path / "sub" / "a.jsonl") == GOOD
    write_files_atomic({tmp_path / "b.txt": b"b", tmp_path / "c.txt": b"c"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.txt", "c.txt", "sub"]
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["a.jsonl"]


def _folder(path, **files):
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).write_text(text)
    return path


def _whole(folder):
    return (folder / "a").is_file() and (folder / "b").is_file()


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "fallback"])
def test_replace_folder_puts_the_new_folder_in_place(tmp_path, monkeypatch, exchange):
    from tests.fs_watch import broken_states

    if not exchange:  # a file system without RENAME_EXCHANGE: the old folder is moved aside first
        monkeypatch.setattr("utils.jsonl._exchange", lambda a, b: False)
    final = _folder(tmp_path / "model", a="old", b="old")
    with broken_states(final, _whole) as broken:
        assert replace_folder(_folder(tmp_path / ".model.tmp", a="new", b="new"), final) == final
    assert (final / "a").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    if exchange:
        assert broken == []  # at every step a reader finds a whole folder
    assert replace_folder(_folder(tmp_path / ".fresh.tmp", a="1", b="1"), tmp_path / "fresh") == tmp_path / "fresh"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh", "model"]


def test_replace_folder_that_fails_keeps_the_old_folder(tmp_path, monkeypatch):
    import os

    monkeypatch.setattr("utils.jsonl._exchange", lambda a, b: False)
    real_rename = os.rename

    def rename(src, dst):
        if str(src).endswith(".tmp"):
            raise OSError("no room")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    final = _folder(tmp_path / "model", a="old", b="old")
    with pytest.raises(OSError, match="no room"):
        replace_folder(_folder(tmp_path / ".model.tmp", a="new", b="new"), final)
    assert (final / "a").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_publish_folder_lets_the_first_writer_win(tmp_path):
    first = _folder(tmp_path / ".m.tmp1", a="first")
    assert publish_folder(first, tmp_path / "m")
    assert not publish_folder(_folder(tmp_path / ".m.tmp2", a="second"), tmp_path / "m")
    assert (tmp_path / "m" / "a").read_text() == "first" and sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_every_project_reader_rejects_a_bad_middle_line(tmp_path):
    """The trainer's trace reader, the phase-4 cache and task files: no silent skip of a damaged line."""
    traces = tmp_path / "traces.jsonl"
    rows = [
        {"task_id": "a/1", "sample_idx": i, "prompt": "p", "thinking": "", "code": "x = 1", "passed": True}
        for i in range(3)
    ]
    traces.write_text(lines(rows[:1]) + '{"task_id": "a/1", "sample_idx": 1, "pro\n' + lines(rows[2:]))
    with pytest.raises(DataFormatError, match=r"traces\.jsonl:2:"):
        load_teacher_examples(traces, {"a/1"}, True)
    cache = tmp_path / "cache.jsonl"
    cache.write_text(
        '{"task_id": "a/1", "sample_idx": 0, "completion": "x", "num_tokens": 1, "finish_reason": "stop"}\n{bad\n'
        '{"task_id": "a/1", "sample_idx": 1, "completion": "y", "num_tokens": 1, "finish_reason": "stop"}\n'
    )
    with pytest.raises(DataFormatError, match=r"cache\.jsonl:2:"):
        read_cache(cache)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"task_id": "t/1"\n')
    with pytest.raises(DataFormatError, match=r"tasks\.jsonl:1:"):
        read_tasks(tasks)


def test_trace_reader_takes_the_newest_record_of_a_retried_sample(tmp_path):
    traces = tmp_path / "traces.jsonl"
    error = {
        "task_id": "a/1",
        "sample_idx": 0,
        "prompt": "p",
        "code": None,
        "passed": False,
        "status": "api_error",
        "error": "HTTP 500",
    }
    answer = {
        "task_id": "a/1",
        "sample_idx": 0,
        "prompt": "p",
        "thinking": "t",
        "code": "x = 1",
        "passed": True,
        "status": "passed",
        "previous_errors": ["HTTP 500"],
    }
    traces.write_text(lines([error, answer]))
    assert [
        (e.task_id, e.prompt, e.thinking, e.code, e.passed, e.previous_errors)
        for e in load_teacher_examples(traces, {"a/1"}, True)
    ] == [("a/1", "p", "t", "x = 1", True, ("HTTP 500",))]
    assert [n for n, _ in iter_jsonl(traces)] == [1, 2]


def test_a_record_file_names_the_file_and_line_of_a_row_that_is_not_a_record(tmp_path):
    from synthesis.generate_traces import latest_records
    from utils.jsonl import iter_records

    path = tmp_path / "records.jsonl"
    path.write_text('{"n": 1}\n{"m": 2}\n{"n": 3}\n{"n": 4')  # a bad second line, a torn last one
    with pytest.raises(DataFormatError, match=r"records\.jsonl:2: not a counter; fix it"):
        list(iter_records(path, lambda row: row["n"], "not a counter; fix it"))
    path.write_text('{"n": 1}\n{"n": 3}\n{"n": 4')
    assert list(iter_records(path, lambda row: row["n"], "not a counter")) == [1, 3]  # the torn tail is skipped
    path.write_text('{"task_id": "t/1", "sample_idx": 0, "prompt": "p"}\n{"sample_idx": 1}\n')
    with pytest.raises(DataFormatError, match=r"records\.jsonl:2: not a trace record .*--overwrite"):
        latest_records(path)
    with pytest.raises(DataFormatError, match=r"records\.jsonl:1: not a completion-cache record; delete"):
        read_cache(path)
