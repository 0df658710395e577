"""Reward functions written for TRL run as TRL runs them: conversational completions for a function that reads
`completion[0]["content"]`, `completion_ids`, `trainer_state`; a function that cannot run is refused in one line
before the model loads."""

from __future__ import annotations

import json

import phase1_prepare_data as phase1
import phase3_train_grpo as phase3
from config import build_config
from tests.cli_helpers import TINY_STUDENT, cpu_argv
from tests.trainer_helpers import scripted_trainer

TRL_REWARDS = '''
import re

SEEN = {"conversational": [], "ids": [], "steps": []}


def think_format_reward(completions, **kwargs):
    """trl.rewards.think_format_reward's body: TRL's own reward takes conversational completions."""
    pattern = r"^<think>(?!.*<think>)(.*?)</think>.*$"
    contents = [completion[0]["content"] for completion in completions]
    SEEN["conversational"].append(completions[0])
    return [1.0 if re.match(pattern, c, re.DOTALL) else 0.0 for c in contents]


def uses_ids(completions, completion_ids, trainer_state, **kwargs):
    SEEN["ids"].append(completion_ids)
    SEEN["steps"].append(trainer_state.global_step)
    return [-0.001 * len(ids) for ids in completion_ids]


def broken(prompts, completions, **kwargs):
    return [1.0 / 0 for _ in completions]
'''


def test_trl_reward_functions_get_what_trl_passes(tmp_path, pool):
    path = tmp_path / "rewards_trl.py"
    path.write_text(TRL_REWARDS)
    funcs = f"{path}:think_format_reward,{path}:uses_ids"
    trainer = scripted_trainer(
        tmp_path / "out", pool, **{"grpo.reward_funcs": funcs, "training.max_steps": 2, "training.save_steps": 0}
    )
    trainer.train()
    forms = {r.name.rpartition(":")[2]: r.form for r in trainer.parts.user_rewards}
    assert forms == {"think_format_reward": "conversational", "uses_ids": "standard"}
    seen = trainer.parts.user_rewards[0].function.__globals__["SEEN"]
    # the calls after the probe (one per rollout batch)
    message = seen["conversational"][-1]
    assert isinstance(message, list) and message[0]["role"] == "assistant" and isinstance(message[0]["content"], str)
    seen = trainer.parts.user_rewards[1].function.__globals__["SEEN"]  # each spec loads its own module
    ids = seen["ids"][-1]
    assert ids and all(isinstance(row, list) and row and all(isinstance(t, int) for t in row) for row in ids)
    assert seen["steps"][-2:] == [0, 1]  # optimizer steps done when each batch was scored
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert all("reward/think_format_reward_mean" in row and "reward/uses_ids_mean" in row for row in rows)


def test_a_reward_function_that_cannot_run_is_refused_before_the_model_loads(tmp_path, capsys):
    path = tmp_path / "rewards_trl.py"
    path.write_text(TRL_REWARDS)
    data = tmp_path / "data"
    phase1.main(build_config("cpu", overrides=[f"paths.data_dir={data}"]))
    argv = cpu_argv(
        "--output_dir",
        str(tmp_path / "out"),
        "--train_file",
        str(data / "train.jsonl"),
        sets=[
            TINY_STUDENT,
            f"grpo.reward_funcs={path}:broken",
            "training.max_steps=1",
            "dual_source.teacher_sft_weight=0",
        ],
    )
    code = phase3.cli(argv)
    captured = capsys.readouterr()
    assert code == 1
    [line] = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert "ZeroDivisionError" in line and "before the model loads" in line and "completion_ids" in line
    assert "Traceback" not in captured.err and "trainable params" not in captured.out
