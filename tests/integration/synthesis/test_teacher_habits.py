"""Phase 2 as a practitioner runs it against their own teacher: the served model's name is the one recorded (or the
run is refused before the first request), the statistics are written before the student's tokenizer loads (and it
does not load when no trace is usable), and a dataset named in the config is not silently replaced by the task file."""

from __future__ import annotations

import json

import phase1_prepare_data as phase1
import phase2_generate_teacher_traces as phase2
from config import build_config
from tests.cli_helpers import cpu_argv, fake_teacher_argv
from tests.fake_openai_server import FakeTeacher, RunningServer


def _train_file(tmp_path):
    data = tmp_path / "data"
    phase1.main(build_config("cpu", overrides=[f"paths.data_dir={data}"]))
    return data / "train.jsonl"


def test_a_server_serving_another_model_is_refused_before_the_first_request(tmp_path, capsys):
    train = _train_file(tmp_path)
    out = tmp_path / "traces.jsonl"
    with RunningServer(FakeTeacher(model="my-teacher")) as server:  # answers whatever name it is sent
        argv = cpu_argv("--api_url", server.url, "--input", str(train), "--output", str(out), "--max_tasks", "2")
        code = phase2.cli(argv)
        sent = len(server.state.requests)
    err = capsys.readouterr().err
    assert code == 1, err
    assert sent == 0 and not out.exists()
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert "serves only 'my-teacher'" in line and "--model my-teacher" in line
    # the fix it names works, and the traces record the teacher that answered them
    with RunningServer(FakeTeacher(model="my-teacher")) as server:
        argv = cpu_argv("--api_url", server.url, "--model", "my-teacher", "--input", str(train), "--output", str(out))
        assert phase2.cli([*argv, "--max_tasks", "2"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and {row["teacher_model"] for row in rows} == {"my-teacher"}


def test_stats_are_written_before_the_tokenizer_and_no_tokenizer_without_usable_traces(tmp_path, capsys, monkeypatch):
    train = _train_file(tmp_path)
    out = tmp_path / "traces.jsonl"

    def no_tokenizer(*args, **kwargs):
        assert out.with_suffix(".stats.json").is_file(), "the statistics must be on disk before the tokenizer loads"
        raise AssertionError("no trace is usable: the tokenizer must not load")

    monkeypatch.setattr(phase2, "load_tokenizer", no_tokenizer)
    # every answer fails its tests: no usable trace
    with RunningServer(FakeTeacher(default_code="def solution():\n    return None")) as server:
        assert phase2.cli(fake_teacher_argv(server.url, train, out, "--max_tasks", "2")) == 0
    stats = json.loads(out.with_suffix(".stats.json").read_text())
    assert stats["teacher_sft_fit"]["usable"] == 0
    assert "loading the student's tokenizer" not in capsys.readouterr().out


def test_the_tokenizer_count_says_what_it_loads_first(tmp_path, capsys, monkeypatch):
    train = _train_file(tmp_path)
    tasks = [json.loads(line) for line in train.read_text().splitlines()][:2]
    out = tmp_path / "traces.jsonl"
    seen: list[str] = []
    real = phase2.load_tokenizer

    def spy(*args, **kwargs):
        seen.append(capsys.readouterr().out)  # what the screen showed before the load started
        assert out.with_suffix(".stats.json").is_file()
        return real(*args, **kwargs)

    monkeypatch.setattr(phase2, "load_tokenizer", spy)
    answers = {t["problem"].strip(): t["reference_solutions"][0] for t in tasks}
    with RunningServer(FakeTeacher(answers=answers)) as server:
        assert phase2.cli(fake_teacher_argv(server.url, train, out, "--max_tasks", "2")) == 0
    assert seen and "loading the student's tokenizer" in seen[0]


def test_dataset_name_in_the_config_is_not_silently_replaced_by_the_task_file(tmp_path, capsys):
    train = _train_file(tmp_path)  # made from the fixtures (MBPP/APPS)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("dataset_name: open-r1/verifiable-coding-problems-python\n")
    code = phase2.cli(cpu_argv("--config", str(recipe), "--input", str(train), "--teacher", "references"))
    err = capsys.readouterr().err
    assert code == 1
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert "open-r1/verifiable-coding-problems-python" in line and "phase1_prepare_data.py" in line
