"""TRL's current GRPOConfig names and open-r1's code recipes, through `python -m config` as a user runs it:
each name is mapped to the key with the same meaning, ignored with a note, or refused saying why — a
close-match hint never leads to a key with another meaning."""

from __future__ import annotations

import pytest

import config as cfg
from tests.cli_helpers import run_script

# open-r1's code recipe (recipes/Qwen2.5-1.5B-Instruct/grpo/config_demo_code.yaml), in the two versions
# users have: with callbacks / wandb_entity / dataset_configs, and the later one with dataset_prompt_column.
OPEN_R1_CODE_OLD = """\
model_name_or_path: Qwen/Qwen2.5-1.5B-Instruct
model_revision: main
torch_dtype: bfloat16
attn_implementation: flash_attention_2
dataset_name: open-r1/verifiable-coding-problems-python-10k
dataset_configs:
- default
system_prompt: "You are a helpful AI Assistant."
callbacks:
- push_to_hub_revision
beta: 0.001
bf16: true
use_vllm: true
vllm_device: auto
vllm_gpu_memory_utilization: 0.9
do_eval: false
gradient_accumulation_steps: 4
gradient_checkpointing: true
gradient_checkpointing_kwargs:
  use_reentrant: false
hub_model_id: lewtun/Qwen2.5-1.5B-Open-R1-Code-GRPO
hub_strategy: every_save
learning_rate: 5.0e-06
log_completions: true
log_level: info
logging_first_step: true
logging_steps: 1
logging_strategy: steps
lr_scheduler_type: cosine_with_min_lr
lr_scheduler_kwargs:
  min_lr_rate: 0.1
max_prompt_length: 512
max_completion_length: 2048
max_steps: 500
num_generations: 14
num_train_epochs: 1
output_dir: data/Qwen2.5-1.5B-Open-R1-Code-GRPO
overwrite_output_dir: true
per_device_train_batch_size: 16
push_to_hub: true
report_to:
- wandb
reward_funcs:
- code
- format
reward_weights:
- 1.0
- 0.1
save_strategy: "steps"
save_steps: 10
save_total_limit: 1
seed: 42
temperature: 1.0
warmup_ratio: 0.03
wandb_entity: huggingface
wandb_project: open-r1
"""

OPEN_R1_CODE_NEW_EXTRA = "dataset_prompt_column: problem_statement\n"


def config_cli(tmp_path, text: str, *flags: str):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return run_script("-m", "config", "--preset", "gpu", "--config", str(path), *flags)


@pytest.mark.parametrize("extra", ["", OPEN_R1_CODE_NEW_EXTRA], ids=["callbacks-wandb_entity", "prompt-column"])
def test_open_r1_code_recipe_loads(tmp_path, extra):
    result = config_cli(tmp_path, OPEN_R1_CODE_OLD + extra)
    assert result.returncode == 0, result.stderr
    out, err = result.stdout, result.stderr
    assert "training.tracker_entity = 'huggingface'" in out
    assert "training.tracker_project = 'open-r1'" in out
    # 16 completions x 4 micro-batches = 64 per process is not whole groups of 14: 4 groups (56) per process
    assert "training.per_device_train_batch_size = 1" in out
    assert "training.gradient_accumulation_steps = 4" in out
    batch = [line for line in err.splitlines() if "per_device_train_batch_size 16" in line]
    assert len(batch) == 1 and "global batch" in batch[0] and "56" in batch[0], err
    ignored = [line for line in err.splitlines() if "ignored here" in line]
    assert len(ignored) == 1 and "callbacks" in ignored[0], err
    if extra:
        assert "dataset_prompt_column" in ignored[0] and "--field_map problem=" in ignored[0]


@pytest.mark.parametrize(
    ("recipe", "tasks", "accumulation"),
    [
        ("per_device_train_batch_size: 12\nnum_generations: 8\ngradient_accumulation_steps: 2\n", 1, 3),
        ("per_device_train_batch_size: 16\nnum_generations: 8\ngradient_accumulation_steps: 2\n", 2, 2),
    ],
    ids=["24-per-process-as-3-groups", "whole-groups-per-micro-batch"],
)
def test_trl_batch_rule_is_the_step_batch_not_the_micro_batch(tmp_path, recipe, tasks, accumulation):
    result = config_cli(tmp_path, recipe)
    assert result.returncode == 0, result.stderr
    assert f"training.per_device_train_batch_size = {tasks}" in result.stdout
    assert f"training.gradient_accumulation_steps = {accumulation}" in result.stdout


def test_trl_batch_smaller_than_one_group_is_refused(tmp_path):
    result = config_cli(tmp_path, "per_device_train_batch_size: 4\nnum_generations: 8\n")
    assert result.returncode == 2
    assert "one group" in result.stderr and "training.per_device_train_batch_size" in result.stderr


@pytest.mark.parametrize(
    ("value", "expected"), [("group", "True"), ("none", "False"), ("true", "True"), ("false", "False")]
)
def test_scale_rewards_string_forms(tmp_path, value, expected):
    result = config_cli(tmp_path, f"scale_rewards: {value}\n")
    assert result.returncode == 0, result.stderr
    assert f"grpo.scale_rewards = {expected}" in result.stdout
    flag = run_script("-m", "config", "--preset", "gpu", "--scale_rewards", value)
    assert flag.returncode == 0 and f"grpo.scale_rewards = {expected}" in flag.stdout, flag.stderr
    via_set = run_script("-m", "config", "--preset", "gpu", "--set", f"scale_rewards={value}")
    assert via_set.returncode == 0 and f"grpo.scale_rewards = {expected}" in via_set.stdout, via_set.stderr


def test_scale_rewards_batch_refused_saying_why(tmp_path):
    result = config_cli(tmp_path, "scale_rewards: batch\n")
    assert result.returncode == 2
    [line] = [line for line in result.stderr.splitlines() if "scale_rewards" in line]
    assert "'batch'" in line and "group" in line and "none" in line


def test_gspo_sequence_level_is_refused_never_mapped_to_the_mismatch_correction(tmp_path):
    result = config_cli(tmp_path, "importance_sampling_level: sequence\n")
    assert result.returncode == 2
    assert "GSPO" in result.stderr
    assert "Did you mean 'importance_sampling'" not in result.stderr
    token = config_cli(tmp_path, "importance_sampling_level: token\n")  # TRL's default: what tgrpo does
    assert token.returncode == 0, token.stderr
    assert "grpo.importance_sampling = 'token'" in token.stdout  # the mismatch correction is untouched


@pytest.mark.parametrize(
    ("recipe", "wrong_hint"),
    [
        ("steps_per_generation: 2\ngradient_accumulation_steps: 4\n", "num_generations"),
        ("num_completions_to_print: 2\n", "max_completion_length"),
        ("entropy_coef: 0.01\n", None),
    ],
)
def test_trl_names_never_get_a_hint_with_another_meaning(tmp_path, recipe, wrong_hint):
    result = config_cli(tmp_path, recipe)
    if wrong_hint:
        assert f"Did you mean '{wrong_hint}'" not in result.stderr
    name = recipe.split(":")[0]
    assert name in result.stderr


def test_num_completions_to_print_is_ignored_and_steps_per_generation_equal_to_accumulation_accepted(tmp_path):
    result = config_cli(
        tmp_path, "num_completions_to_print: 2\nsteps_per_generation: 4\ngradient_accumulation_steps: 4\n"
    )
    assert result.returncode == 0, result.stderr
    assert "num_completions_to_print" in result.stderr and "ignored here" in result.stderr


def test_steps_per_generation_other_than_accumulation_refused(tmp_path):
    result = config_cli(tmp_path, "steps_per_generation: 2\ngradient_accumulation_steps: 4\n")
    assert result.returncode == 2
    assert "steps_per_generation" in result.stderr and "one rollout batch per optimizer step" in result.stderr


def test_typo_of_a_trl_name_is_pointed_at_that_name(tmp_path):
    result = config_cli(tmp_path, "importance_sampling_levl: sequence\n")
    assert result.returncode == 2
    assert "Did you mean 'importance_sampling_level'" in result.stderr


def test_vllm_importance_sampling_names_map_to_the_mismatch_correction():
    nested = cfg.normalize_config_mapping(
        {"vllm_importance_sampling_mode": "sequence_truncate", "vllm_importance_sampling_cap": 2.0}, "test"
    )
    assert nested == {"grpo": {"importance_sampling": "sequence", "importance_sampling_cap": 2.0}}
    assert cfg.normalize_config_mapping({"vllm_importance_sampling_correction": False}, "test") == {
        "grpo": {"importance_sampling": "off"}
    }
    with pytest.raises(cfg.ConfigError, match="token_mask"):
        cfg.normalize_config_mapping({"vllm_importance_sampling_mode": "token_mask"}, "test")
