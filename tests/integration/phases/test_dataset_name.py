"""A dataset named in a training config (TRL's and open-r1's habit: there the dataset is the training set) is used
only when phase 1 made the task file from it; otherwise phase 3 says so in one line before any model loads."""

from __future__ import annotations

import phase1_prepare_data as phase1
import phase3_train_grpo as phase3
from config import build_config
from tests.cli_helpers import TINY_STUDENT, cpu_argv


def test_phase3_refuses_a_dataset_name_its_task_file_was_not_made_from(tmp_path, capsys):
    data = tmp_path / "data"
    phase1.main(build_config("cpu", overrides=[f"paths.data_dir={data}"]))  # the fixtures, not the recipe's dataset
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("dataset_name: open-r1/verifiable-coding-problems-python-10k\nmax_steps: 1\n")
    capsys.readouterr()
    argv = cpu_argv(
        "--config",
        str(recipe),
        "--train_file",
        str(data / "train.jsonl"),
        "--output_dir",
        str(tmp_path / "out"),
        sets=[TINY_STUDENT, "dual_source.teacher_sft_weight=0"],
    )
    code = phase3.cli(argv)
    captured = capsys.readouterr()
    assert code == 1
    [line] = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert "'open-r1/verifiable-coding-problems-python-10k'" in line and "MBPP/APPS" in line
    assert "phase1_prepare_data.py" in line
    assert "trainable params" not in captured.out  # refused before the model loaded


def test_phase4_refuses_a_dataset_name_its_split_was_not_made_from(tmp_path, capsys):
    import phase4_evaluate as phase4

    data = tmp_path / "data"
    phase1.main(build_config("cpu", overrides=[f"paths.data_dir={data}"]))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("dataset_name: my-org/my-tasks\n")
    capsys.readouterr()
    argv = cpu_argv(
        "--config", str(recipe), "--model_path", "embedded:tiny-random", "--output_dir", str(tmp_path / "out"),
        sets=[f"paths.data_dir={data}"],
    )  # fmt: skip
    assert phase4.cli(argv) == 1
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "'my-org/my-tasks'" in line and "val.jsonl" in line
