"""Two ordinary shapes of a practitioner's own data through phase 1's column map: APPS's `input_output` JSON
(inputs/outputs), and a folder written by `Dataset.save_to_disk`."""

from __future__ import annotations

import json

import phase1_prepare_data as phase1
from utils.dataset_loader import read_tasks


def _rows(n: int = 10) -> list[dict]:
    return [
        {
            "pid": i,
            "prompt": f"Read a number and print it plus {i}.",
            "io": json.dumps({"inputs": [f"{k}\n" for k in (1, 2)], "outputs": [f"{k + i}\n" for k in (1, 2)]}),
            "solution": f"print(int(input()) + {i})",
        }
        for i in range(1, n + 1)
    ]


def _argv(dataset: str, out, *extra: str) -> list[str]:
    return [
        "--preset", "cpu", "--dataset_name", dataset, "--output_dir", str(out), "--field_map", "task_id=pid",
        "problem=prompt", "tests=io", "reference_solutions=solution", *extra,
    ]  # fmt: skip


def test_apps_style_input_output_json_becomes_stdin_tests(tmp_path):
    folder = tmp_path / "my-ds-stdin"
    folder.mkdir()
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    assert phase1.cli(_argv(str(folder), tmp_path / "out", "--dataset_test_type", "stdin")) == 0
    tasks = read_tasks(tmp_path / "out" / "train.jsonl") + read_tasks(tmp_path / "out" / "val.jsonl")
    task = next(t for t in tasks if t.task_id == "my-ds-stdin/3")
    assert task.test_type == "stdin"
    assert task.tests == ({"input": "1\n", "output": "4\n"}, {"input": "2\n", "output": "5\n"})


def test_apps_style_input_output_with_fn_name_becomes_call_tests(tmp_path):
    def io(i: int) -> str:
        return json.dumps({"fn_name": "f", "inputs": [[1], [2]], "outputs": [1 + i, 2 + i]})

    rows = [{"pid": i, "prompt": f"Add {i}.", "io": io(i)} for i in range(1, 11)]
    folder = tmp_path / "my-ds-call"
    folder.mkdir()
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["--preset", "cpu", "--dataset_name", str(folder), "--output_dir", str(tmp_path / "out"),
            "--field_map", "task_id=pid", "problem=prompt", "tests=io"]  # fmt: skip
    assert phase1.cli(argv) == 0
    tasks = read_tasks(tmp_path / "out" / "train.jsonl") + read_tasks(tmp_path / "out" / "val.jsonl")
    task = next(t for t in tasks if t.task_id == "my-ds-call/2")
    assert task.test_type == "call" and task.fn_name == "f"
    assert task.tests == ({"input": [1], "output": 3}, {"input": [2], "output": 4})


def test_a_save_to_disk_folder_is_read_as_it_was_saved(tmp_path, capsys):
    from datasets import Dataset

    folder = tmp_path / "my-ds-saved"
    Dataset.from_list(_rows()).save_to_disk(str(folder))
    assert phase1.cli(_argv(str(folder), tmp_path / "out", "--dataset_test_type", "stdin")) == 0
    tasks = read_tasks(tmp_path / "out" / "train.jsonl") + read_tasks(tmp_path / "out" / "val.jsonl")
    assert len(tasks) == 10
    assert "hub" not in capsys.readouterr().err


def test_a_local_folder_datasets_cannot_read_is_not_blamed_on_the_hub(tmp_path, capsys):
    folder = tmp_path / "my-ds-broken"
    folder.mkdir()
    (folder / "notes.txt").write_text("nothing a dataset is made of\n")
    assert phase1.cli(_argv(str(folder), tmp_path / "out")) == 1
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert str(folder) in line and "hub" not in line and "network" not in line
