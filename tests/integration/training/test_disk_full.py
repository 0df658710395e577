"""A full disk while saving a checkpoint or writing phase 2's traces is one line naming the folder and what
is intact; no temp folder stays.

ENOSPC is injected at the write call with a monkeypatch (no tmpfs is mounted by the tests)."""

from __future__ import annotations

import errno
import json
from types import SimpleNamespace

import pytest

import config as cfg
from training.checkpointing import DiskFullError, save_final
from utils.disk import out_of_space
from utils.student_model import attach_lora, load_student


def test_final_model_on_a_full_disk(tmp_path, tiny_model_name, monkeypatch):
    model, tokenizer = load_student(tiny_model_name, "float32", device="cpu")
    model = attach_lora(model, 8, 16, 0.0, ("q_proj", "v_proj"))
    (tmp_path / "checkpoint-3").mkdir()

    def full(path, *args, **kwargs):
        (tmp_path / "partial").write_text("x")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(type(model), "save_pretrained", full)
    accel = SimpleNamespace(wait_for_everyone=lambda: None, is_main_process=True, unwrap_model=lambda m: m)
    with pytest.raises(DiskFullError) as info:
        save_final(tmp_path, accel, model, tokenizer, cfg.build_config("cpu"))
    text = str(info.value)
    assert "no space left" in text and str(tmp_path) in text and "checkpoint-3" in text
    assert "\n" not in text
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".final_model.tmp")]


def test_checkpoint_on_a_full_disk(tmp_path):
    from training.checkpointing import save_checkpoint

    (tmp_path / "checkpoint-1").mkdir()

    class Model:
        def save_pretrained(self, path, **kwargs):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 73216 vs 73108")

    accel = SimpleNamespace(
        wait_for_everyone=lambda: None,
        is_main_process=True,
        unwrap_model=lambda m: m,
        process_index=0,
        num_processes=1,
    )
    state = SimpleNamespace(global_step=2, rollout_batches=0)
    with pytest.raises(DiskFullError) as info:
        save_checkpoint(
            tmp_path,
            accelerator=accel,
            model=Model(),
            optimizer=None,
            scheduler=None,
            config=cfg.build_config("cpu"),
            state=state,
            total_steps=4,
            rank_state={},
        )
    text = str(info.value)
    assert "while saving checkpoint-2" in text and "checkpoint-1 is intact" in text
    assert not (tmp_path / ".checkpoint-2.tmp").exists()


def test_stale_temp_folders_are_swept(tmp_path):
    from training.checkpointing import sweep_temp_folders

    for name in (".checkpoint-2.tmp", ".final_model.tmp1234", "checkpoint-1", ".other"):
        (tmp_path / name).mkdir()
    removed = sweep_temp_folders(tmp_path)
    assert sorted(p.name for p in removed) == [".checkpoint-2.tmp", ".final_model.tmp1234"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other", "checkpoint-1"]


def test_the_tokenizers_writer_error_counts_as_disk_full():
    assert out_of_space(Exception("No space left on device (os error 28)"))
    assert not out_of_space(Exception("something else"))


def test_a_full_disk_during_phase2_exits_nonzero_with_one_line(tmp_path, monkeypatch, capsys):
    """The third trace write finds the disk full: one `error:` line naming the trace file and the two traces
    that are intact, exit 1, and the two lines on disk."""
    import phase2_generate_teacher_traces as phase2
    from tests.cli_helpers import fake_teacher_argv
    from tests.fake_openai_server import FakeTeacher, RunningServer
    from utils.dataset_loader import EMBEDDED_MBPP, load_mbpp
    from utils.jsonl import JsonlAppender

    tasks = load_mbpp(EMBEDDED_MBPP)[0][:3]
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in tasks))
    out = tmp_path / "traces.jsonl"
    written: list = []
    real_write = JsonlAppender.write

    def write_until_full(self, row):
        if len(written) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(row)
        return real_write(self, row)

    monkeypatch.setattr(JsonlAppender, "write", write_until_full)
    teacher = FakeTeacher(answers={t.problem.strip(): t.reference_solutions[0] for t in tasks})
    with RunningServer(teacher) as server:
        rc = phase2.cli(fake_teacher_argv(server.url, task_file, out, "--num_samples", "1", "--concurrency", "1"))
    assert rc == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and str(out) in lines[0] and "2 traces" in lines[0], err
    assert "Traceback" not in err
    assert len(out.read_text().splitlines()) == 2
