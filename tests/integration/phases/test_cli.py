"""The phase scripts as a user meets them: one-line errors instead of tracebacks, guards against silent
surprises, and `--help` that shows the resolved preset's values."""

from __future__ import annotations

import json
import socket
import sys

import pytest

import phase1_prepare_data as phase1
import phase2_generate_teacher_traces as phase2
import phase3_train_grpo as phase3
import phase4_evaluate as phase4
from config import build_config
from tests.cli_helpers import TINY_STUDENT, cpu_argv, run_script
from tests.trainer_helpers import small_tasks
from training.checkpointing import save_config
from utils.dataset_loader import write_tasks
from utils.student_model import ModelLoadError, attach_lora, load_student, resolve_model_path


def one_line_error(proc) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


# ---------------------------------------------------------------- one-line errors


@pytest.mark.parametrize("phase", [phase1, phase3, phase4])
def test_ctrl_c_in_a_phase_exits_130_with_one_line_saying_what_was_kept(phase, monkeypatch, capsys, tmp_path):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(phase, "main", interrupted)
    monkeypatch.setattr(phase4, "load_eval_set", lambda *a, **k: None)
    assert phase.cli(["--preset", "cpu", "--set", f"paths.output_dir={tmp_path}"]) == 130
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert line.startswith("interrupted: ") and any(w in line for w in ("written", "checkpoint", "cached")), line


def test_run_phase_turns_the_outcome_into_the_exit_code(capsys):
    from config import run_phase

    class RefusedError(Exception):
        pass

    def refuse():
        raise RefusedError("the file is busy; wait for the other run")

    assert run_phase(lambda: {"done": 1}, (RefusedError,), "kept") == 0
    assert run_phase(lambda: 3, (RefusedError,), "kept", status=lambda result: result) == 3
    assert run_phase(refuse, (RefusedError,), "kept") == 1
    assert capsys.readouterr().err == "error: the file is busy; wait for the other run\n"
    with pytest.raises(ValueError):  # anything else is a bug: its traceback is shown
        run_phase(lambda: int("x"), (RefusedError,), "kept")


def test_phase1_without_hub_access_is_one_line(tmp_path):
    proc = run_script(
        "phase1_prepare_data.py", "--preset", "gpu", "--output_dir", str(tmp_path), env={"HF_HUB_OFFLINE": "1"}
    )
    assert proc.returncode == 1
    line = one_line_error(proc)
    assert line.startswith("error: could not load google-research-datasets/mbpp (full) from the Hugging Face hub")
    assert "--mbpp_path" in line and "--offline" in line


def test_standard_split_on_the_cpu_preset_names_the_preset_not_a_flag_never_given(tmp_path):
    proc = run_script(
        "phase1_prepare_data.py", "--preset", "cpu", "--split_mode", "standard", "--output_dir", str(tmp_path)
    )
    assert proc.returncode == 1
    line = one_line_error(proc)
    assert "data.offline is true (the cpu preset's value" in line and "--set data.offline=false" in line


def _interrupt(*_args, **_kwargs):
    raise KeyboardInterrupt


def test_ctrl_c_in_phases_3_and_4_is_one_line_and_exit_130(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(phase4, "main", _interrupt)
    monkeypatch.setattr(phase3, "main", _interrupt)
    codes = []
    # Its own eval file: data/val.jsonl only exists after phase 1, never on a fresh clone.
    eval_file = tmp_path / "val.jsonl"
    eval_file.write_text(
        json.dumps(
            {
                "task_id": "mbpp/1",
                "source": "mbpp",
                "problem": "Add a and b.",
                "test_type": "assert",
                "tests": ["assert add(1, 2) == 3"],
                "fn_name": "add",
            }
        )
        + "\n"
    )
    for call in (
        lambda: phase4.cli(["--preset", "cpu", "--output_dir", str(tmp_path), "--eval_file", str(eval_file)]),
        lambda: phase3.cli(["--preset", "cpu", "--output_dir", str(tmp_path)]),
    ):
        try:
            codes.append(call())
        except KeyboardInterrupt:
            codes.append("traceback")
    assert codes == [130, 130]
    err = capsys.readouterr().err
    assert "rerun the same command to continue" in err
    assert "no checkpoint was saved yet (the first is saved at step" in err  # nothing to resume from
    (tmp_path / "checkpoint-3").mkdir()
    assert phase3.cli(["--preset", "cpu", "--output_dir", str(tmp_path)]) == 130
    assert f"checkpoints saved so far are in {tmp_path}; continue with --resume_from_checkpoint latest" in (
        capsys.readouterr().err
    )


def test_a_missing_local_model_path_says_so():
    with pytest.raises(ModelLoadError, match="no model folder at ./models/my-student"):
        resolve_model_path("./models/my-student")
    with pytest.raises(ModelLoadError, match="no model folder at /nowhere/model"):
        load_student("/nowhere/model")
    assert resolve_model_path("Qwen/Qwen3-1.7B") == "Qwen/Qwen3-1.7B"  # a hub id is left to the hub


def test_the_local_teacher_on_a_busy_port_fails_before_announcing_itself():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run_script("-m", "scripts.serve_local_teacher", "--port", str(port), timeout=60)
    assert proc.returncode == 1 and "serving" not in proc.stdout
    assert f"port {port} on 127.0.0.1 is already in use" in one_line_error(proc)


# ---------------------------------------------------------------- phase 3 guards (all before the model loads)


@pytest.fixture
def train_file(tmp_path):
    return write_tasks(tmp_path / "train.jsonl", small_tasks(4))


NO_TEACHER_SFT = "dual_source.teacher_sft_weight=0"


def phase3_args(tmp_path, train_file, *extra, sets=()):
    flags = ("--output_dir", str(tmp_path / "out"), "--train_file", str(train_file), "--max_steps", "1", *extra)
    return cpu_argv(*flags, sets=[TINY_STUDENT, "grpo.max_new_tokens=4", *sets])


def test_missing_teacher_traces_are_an_error_unless_teacher_sft_is_off(tmp_path, train_file, capsys):
    missing = tmp_path / "none.jsonl"
    assert phase3.cli(phase3_args(tmp_path, train_file, "--teacher_traces", str(missing))) == 1
    err = capsys.readouterr().err
    assert f"no teacher traces at {missing}" in err and "dual_source.teacher_sft_weight=0" in err


def test_logging_backend_without_its_package_fails_at_start(tmp_path, train_file, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    monkeypatch.setitem(sys.modules, "wandb", None)  # and `import wandb` fails, as without the package
    assert phase3.cli(phase3_args(tmp_path, train_file, sets=[NO_TEACHER_SFT, "training.logging_backends=wandb"])) == 1
    err = capsys.readouterr().err
    assert "the wandb package is not installed: pip install -r requirements-wandb.txt" in err
    assert not (tmp_path / "out").exists()  # nothing loaded, nothing written


def test_a_fresh_run_refuses_a_used_output_folder(tmp_path, train_file, capsys):
    (tmp_path / "out" / "checkpoint-3").mkdir(parents=True)
    args = phase3_args(tmp_path, train_file, sets=[NO_TEACHER_SFT])
    assert phase3.cli(args) == 1
    err = capsys.readouterr().err
    assert "already holds a run (checkpoint-3)" in err and "--overwrite_output_dir" in err
    assert phase3.cli([*args, "--overwrite_output_dir", "--set", "training.save_steps=0"]) == 0
    assert not (tmp_path / "out" / "checkpoint-3").exists() and (tmp_path / "out" / "final_model").is_dir()


def test_resuming_with_another_lora_rank_is_one_line(tmp_path, train_file, capsys):
    checkpoint = tmp_path / "out" / "checkpoint-2"
    save_config(
        build_config("cpu", overrides=["lora.r=8", "student.model_name=embedded:tiny-random"]),
        checkpoint / "config.json",
    )
    args = phase3_args(tmp_path, train_file, "--resume_from_checkpoint", "latest", sets=[NO_TEACHER_SFT, "lora.r=16"])
    assert phase3.cli(args) == 1
    assert (
        f"cannot resume from {checkpoint}: it was trained with other settings (lora.r=8 there, 16 here)"
        in capsys.readouterr().err
    )


def test_lora_target_module_typos_are_errors_and_all_linear_works(tiny_model_name):
    model, _ = load_student(tiny_model_name, "float32")
    with pytest.raises(ModelLoadError, match=r"'k_prj' \(did you mean 'k_proj'\?\) match no linear layer"):
        attach_lora(model, 2, 4, 0.0, ("q_proj", "k_prj"))
    model, _ = load_student(tiny_model_name, "float32")
    wrapped = attach_lora(model, 2, 4, 0.0, ("all-linear",))
    adapted = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in wrapped.named_parameters() if "lora_A" in n}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


# ---------------------------------------------------------------- --help and what is printed first


def _help(module, argv):
    with pytest.raises(SystemExit):
        module.cli(argv)


def test_help_shows_the_resolved_presets_defaults(capsys):
    _help(phase2, ["--preset", "cpu", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "[teacher.num_samples_per_problem; default: 1]" in text
    assert "[teacher.max_concurrent_requests; default: 2]" in text
    _help(phase4, ["--preset", "cpu", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "[evaluation.k_values; default: 1 2 4 8]" in text and "[evaluation.num_samples; default: 8]" in text
    _help(phase4, ["--preset", "gpu", "--set", "evaluation.num_samples=7", "--help"])
    assert "[evaluation.num_samples; default: 7]" in " ".join(capsys.readouterr().out.split())
    _help(phase1, ["--preset", "cpu", "--help"])
    assert "(default: None)" not in capsys.readouterr().out


def test_phases_print_a_one_line_config_summary_not_the_whole_config(tmp_path, capsys):
    assert phase1.cli(["--preset", "cpu", "--output_dir", str(tmp_path), "--seed", "7"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (
        f"Config: preset cpu; changed: paths.data_dir='{tmp_path}', data.seed=7 "
        "(all keys: python -m config --preset cpu ...)"
    )
    assert "Resolved config" not in out and "lora.r" not in out


def test_help_shows_each_flags_declared_range(capsys):
    _help(phase4, ["--preset", "cpu", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Range: >= 1. [evaluation.num_samples; default: 8]" in text
    assert "Range of each item: >= 1. [evaluation.k_values; default: 1 2 4 8]" in text
    assert "Range: >= 0. [evaluation.temperature;" in text


@pytest.mark.parametrize(
    ("script", "flag"),
    [
        ("phase2_generate_teacher_traces.py", "--input"),
        ("phase3_train_grpo.py", "--train_file"),
        ("phase4_evaluate.py", "--eval_file"),
    ],
)
def test_an_empty_task_file_is_refused_in_one_line_naming_it(tmp_path, script, flag):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    extra = ["--model_path", "embedded:tiny-random"] if script == "phase4_evaluate.py" else []
    sets = [f"paths.output_dir={tmp_path / 'out'}", f"paths.data_dir={tmp_path / 'data'}"]
    proc = run_script(script, *cpu_argv(flag, str(empty), *extra, sets=sets), timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error:") and f"{empty}: no task records" in lines[-1]
    assert "Traceback" not in proc.stderr
