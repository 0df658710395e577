"""open-r1 / TRL recipes and flags: every problem reported at once, no-op keys ignored with a warning."""

from __future__ import annotations

from pathlib import Path

import pytest

import config as cfg
import phase1_prepare_data as phase1
import phase3_train_grpo as phase3
from config.compat import _WARNED as WARNED
from tests.cli_helpers import run_script

OPEN_R1_LIKE = """\
model_name_or_path: HuggingFaceTB/SmolLM2-135M-Instruct
model_revision: main
torch_dtype: bfloat16
bf16: true
attn_implementation: sdpa
learning_rate: 1.0e-05
logging_steps: 1
log_level: info
save_strategy: epoch
do_eval: false
gradient_checkpointing_kwargs:
  use_reentrant: false
hub_strategy: every_save
push_to_hub: true
hub_model_id: someone/x
num_generations: 8
reward_funcs:
- code
- format
reward_weights:
- 1.0
- 0.2
"""


def test_open_r1_style_recipe_loads_with_one_ignored_warning(tmp_path, capsys):
    path = tmp_path / "recipe.yaml"
    path.write_text(OPEN_R1_LIKE)
    WARNED.clear()
    config = cfg.build_config("cpu", path)
    assert config.student.model_name == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert config.student.torch_dtype == "bfloat16"
    assert config.training.learning_rate == 1e-5
    assert config.grpo.num_samples_per_prompt == 8
    assert config.grpo.reward_funcs == ()  # 'code' and 'format' are the built-in rewards
    assert config.grpo.format_reward_weight == 0.2
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "ignored" in line]
    assert len(warnings) == 1, err
    for key in ("logging_steps", "log_level", "save_strategy", "do_eval", "hub_strategy", "model_revision"):
        assert key in warnings[0]


def test_every_unknown_key_in_one_error_with_lines(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("learning_rate: 1.0e-05\nlerning_rate: 2\nfoo_bar: 1\nnum_generationz: 4\n")
    with pytest.raises(cfg.ConfigError) as info:
        cfg.build_config("cpu", path)
    text = str(info.value)
    for key, line in (("lerning_rate", 2), ("foo_bar", 3), ("num_generationz", 4)):
        assert f"{path}:{line}: unknown key '{key}'" in text, text
    assert "learning_rate" in text and "num_generations" in text  # close matches


def test_disagreeing_dtype_still_refused(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("torch_dtype: float32\nbf16: true\n")
    with pytest.raises(cfg.ConfigError, match="a second time"):
        cfg.build_config("cpu", path)


def test_near_trl_keys_are_mapped_to_their_fields(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(
        "vllm_mode: server\n"  # before use_vllm: the mapping does not depend on the order in the file
        "use_vllm: true\n"
        "warmup_ratio: 0.1\n"
        "lr_scheduler_type: cosine_with_min_lr\n"
        "lr_scheduler_kwargs:\n  min_lr_rate: 0.1\n"
        "max_prompt_length: 512\n"
        "push_to_hub: true\n"
        "hub_model_id: someone/x\n"
    )
    config = cfg.build_config("cpu", path)
    assert config.grpo.rollout_backend == "vllm_server"
    assert config.training.warmup_ratio == 0.1
    assert config.training.lr_scheduler == "cosine"
    assert config.training.min_lr_rate == 0.1
    assert config.grpo.max_prompt_length == 512
    assert config.training.push_to_hub is True
    assert config.training.hub_model_id == "someone/x"


@pytest.mark.parametrize(
    ("recipe", "backend"),
    [
        ("use_vllm: true\nvllm_mode: colocate\n", "vllm"),
        ("use_vllm: true\nvllm_mode: server\n", "vllm_server"),
        ("vllm_mode: server\n", "kv"),  # without use_vllm TRL ignores vllm_mode too: the preset's backend stays
    ],
)
def test_vllm_mode_picks_the_backend_only_with_use_vllm(tmp_path, recipe, backend):
    path = tmp_path / "recipe.yaml"
    path.write_text(recipe)
    assert cfg.build_config("cpu", path).grpo.rollout_backend == backend


def test_warmup_steps_from_ratio_of_the_total():
    training = cfg.build_config("cpu", overrides=["training.warmup_ratio=0.1"]).training
    assert training.warmup_steps_for(25) == 3  # ceil(0.1 * 25) = ceil(2.5)
    assert cfg.build_config("cpu", overrides=["training.warmup_steps=4"]).training.warmup_steps_for(25) == 4
    with pytest.raises(cfg.ConfigError, match="set one"):
        cfg.build_config("cpu", overrides=["training.warmup_ratio=0.1", "training.warmup_steps=4"])


def test_the_trainer_schedule_uses_warmup_ratio_and_min_lr_rate():
    from types import SimpleNamespace

    from training.grpo_trainer import GRPOTrainer

    overrides = ["training.warmup_ratio=0.2", "training.min_lr_rate=0.5", "training.lr_scheduler=linear"]
    trainer = SimpleNamespace(training=cfg.build_config("cpu", overrides=overrides).training, total_steps=10)
    # warmup ceil(0.2 * 10) = 2 steps: 1/2, 2/2; then 0.5 + 0.5 * (1 - (step - 2) / 8) down to 0.5 at step 10
    factors = [GRPOTrainer._lr_factor(trainer, step) for step in (0, 1, 2, 6, 10)]
    assert factors == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5])


@pytest.mark.parametrize(
    ("recipe", "message"),
    [
        ("lr_scheduler_type: cosine\nlr_scheduler_kwargs:\n  min_lr: 1.0e-06\n", "min_lr_rate"),
        ("lr_scheduler_type: cosine_with_min_lr\n", "min_lr_rate"),
        ("push_to_hub: true\noutput_dir: outputs/run1\n", "hub_model_id"),
        ("use_vllm: true\nvllm_mode: remote\n", "colocate"),
    ],
)
def test_near_trl_keys_refused_when_they_cannot_be_mapped(tmp_path, recipe, message):
    path = tmp_path / "recipe.yaml"
    path.write_text(recipe)
    with pytest.raises(cfg.ConfigError, match=message):
        cfg.build_config("cpu", path)


def test_trl_flags_on_a_phase_command_line():
    argv = ["--preset", "cpu", "--learning_rate", "1e-4", "--num_generations=4", "--bf16", "--logging_steps", "5"]
    _, config = cfg.phase_command_line(phase3.DESCRIPTION, phase3.FLAGS, argv, phase3.add_arguments)
    assert config.training.learning_rate == 1e-4
    assert config.grpo.num_samples_per_prompt == 4
    assert config.student.torch_dtype == "bfloat16"
    _, config = cfg.phase_command_line(
        phase1.DESCRIPTION, phase1.FLAGS, ["--preset", "cpu", "--model_name_or_path", "x/m"]
    )
    assert config.student.model_name == "x/m"


def test_set_takes_flat_trl_names():
    config = cfg.build_config("cpu", overrides=["learning_rate=3e-4", "training.per_device_train_batch_size=2"])
    assert config.training.learning_rate == 3e-4
    assert config.training.per_device_train_batch_size == 2
    with pytest.raises(cfg.ConfigError, match="counts completions in TRL.*training.per_device_train_batch_size"):
        cfg.build_config("cpu", overrides=["per_device_train_batch_size=2"])


def test_trl_per_device_batch_is_converted_from_completions_to_tasks(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("per_device_train_batch_size: 16\nnum_generations: 8\n")
    config = cfg.build_config("cpu", path)
    assert config.training.per_device_train_batch_size == 2  # 16 completions = 2 tasks x 8
    assert config.grpo.num_samples_per_prompt == 8
    _, config = cfg.phase_command_line(
        phase3.DESCRIPTION,
        phase3.FLAGS,
        ["--preset", "cpu", "--per_device_train_batch_size", "8", "--num_generations", "4"],
        phase3.add_arguments,
    )
    assert config.training.per_device_train_batch_size == 2


def test_trl_per_device_batch_refused_in_one_line_without_num_generations(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("per_device_train_batch_size: 16\n")
    with pytest.raises(cfg.ConfigError) as info:
        cfg.build_config("cpu", path)
    message = str(info.value)
    assert "\n" not in message
    assert f"{path}:1" in message
    assert "counts completions in TRL" in message
    assert "training.per_device_train_batch_size" in message and "tasks" in message


def test_full_fine_tuning_rate_and_trl_vllm_placement_each_warn_once(tmp_path, capsys):
    path = tmp_path / "recipe.yaml"
    path.write_text("learning_rate: 5.0e-07\nuse_vllm: true\nvllm_device: auto\nvllm_gpu_memory_utilization: 0.9\n")
    WARNED.clear()
    config = cfg.build_config("cpu", path)
    assert config.grpo.rollout_backend == "vllm"
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    rate = [line for line in warnings if "learning_rate 5e-07" in line]
    assert len(rate) == 1 and "LoRA" in rate[0] and "training.learning_rate" in rate[0]
    placement = [line for line in warnings if "colocated" in line]
    assert len(placement) == 1 and "0.9" in placement[0] and "vllm_mode: server" in placement[0]
    WARNED.clear()
    path.write_text("learning_rate: 5.0e-05\nuse_vllm: true\nvllm_mode: colocate\n")
    cfg.build_config("cpu", path)
    assert "warning" not in capsys.readouterr().err  # a LoRA rate, an explicit colocation: nothing to say


def test_trainingarguments_keys_point_to_phase3_flags(tmp_path, capsys):
    path = tmp_path / "recipe.yaml"
    path.write_text("resume_from_checkpoint: true\nlogging_dir: runs/x\noverwrite_output_dir: true\n")
    WARNED.clear()
    cfg.build_config("cpu", path)
    err = capsys.readouterr().err
    assert "--resume_from_checkpoint latest" in err
    assert "--overwrite_output_dir" in err and "phase 3" in err
    assert "<output_dir>/tensorboard" in err


def test_accelerate_config_as_config_is_pointed_to_accelerate_launch(tmp_path):
    path = tmp_path / "accel.yaml"
    path.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nmixed_precision: bf16\n"
        "num_machines: 1\nnum_processes: 4\nmachine_rank: 0\nuse_cpu: false\n"
    )
    with pytest.raises(cfg.ConfigError) as info:
        cfg.build_config("cpu", path)
    message = str(info.value)
    assert "\n" not in message
    assert f"accelerate launch --config_file {path} phase3_train_grpo.py" in message


def test_project_recipes_load_without_warnings(capsys):
    WARNED.clear()
    for name, tasks in (("qwen3_1gpu.yaml", 2), ("qwen3_multigpu.yaml", 2)):
        config = cfg.build_config("gpu", Path(__file__).parents[3] / "recipes" / name)
        assert config.training.per_device_train_batch_size == tasks
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("typo", "meant"),
    [("--learning_rat", "--learning_rate"), ("--num_generation", "--num_generations"), ("--lr", "--learning_rate")],
)
def test_mistyped_trl_flag_gets_did_you_mean(capsys, typo, meant):
    with pytest.raises(SystemExit) as info:
        cfg.phase_command_line(
            phase3.DESCRIPTION, phase3.FLAGS, ["--preset", "cpu", typo, "1e-5"], phase3.add_arguments
        )
    assert info.value.code == 2
    assert f"{typo}: did you mean {meant}?" in capsys.readouterr().err


def test_every_phase_help_says_trl_names_are_accepted(capsys):
    import phase2_generate_teacher_traces as phase2
    import phase4_evaluate as phase4

    for phase in (phase1, phase2, phase3, phase4):
        with pytest.raises(SystemExit):
            phase.cli(["--help"])
        assert "TRL's GRPOConfig names are accepted" in capsys.readouterr().out, phase.__name__


def test_unknown_trl_flag_through_the_real_cli():
    result = run_script("-m", "config", "--preset", "cpu", "--learning_rate", "2e-4", "--beta", "0.02")
    assert result.returncode == 0, result.stderr
    assert "training.learning_rate = 0.0002" in result.stdout
    assert "grpo.kl_coef = 0.02" in result.stdout


def test_tasks_with_prompts_over_max_prompt_length_are_skipped(tiny_model_name):
    from rollouts.from_config import prompt_lengths, tasks_within_prompt_length
    from utils.dataset_loader import Task
    from utils.student_model import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_name)
    short, long = (
        Task(task_id=f"mbpp/{i}", source="mbpp", problem=text, test_type="assert", tests=("assert f() == 1",))
        for i, text in enumerate(("Return 1.", "Return 1. " + "Think it over carefully. " * 40))
    )
    short_length, long_length = prompt_lengths(tokenizer, [short, long], 1)
    assert short_length < long_length
    kept, note = tasks_within_prompt_length(tokenizer, [short, long, short], short_length, 1)
    assert kept == [short, short]
    assert note == (
        f"1 of 3 tasks have prompts longer than max_prompt_length={short_length} tokens: skipped (TRL truncates "
        "them from the left, which cuts the instructions)"
    )
    assert tasks_within_prompt_length(tokenizer, [short, long], 0, 1) == ([short, long], "")  # 0: no limit
    assert tasks_within_prompt_length(tokenizer, [long], short_length, 1)[0] == []


def test_phase3_refuses_when_every_prompt_is_over_max_prompt_length(tmp_path, capsys):
    import json

    import phase3_train_grpo as phase3
    from utils.dataset_loader import DataFormatError, Task

    train = tmp_path / "train.jsonl"
    task = Task(task_id="mbpp/1", source="mbpp", problem="Return 1.", test_type="assert", tests=("assert f() == 1",))
    train.write_text(json.dumps(task.to_dict()) + "\n")
    config = cfg.build_config(
        "cpu",
        overrides=[
            f"paths.output_dir={tmp_path / 'out'}",
            "student.model_name=embedded:tiny-random",
            "grpo.rollout_backend=hf",
            "grpo.max_prompt_length=1",
            "dual_source.teacher_sft_weight=0",
        ],
    )
    with pytest.raises(DataFormatError, match=r"train.jsonl: all 1 training tasks .*max_prompt_length=1 tokens"):
        phase3.main(config, teacher_traces=tmp_path / "none.jsonl", train_file=train)
    assert "1 of 1 tasks have prompts longer than max_prompt_length=1 tokens: skipped" in capsys.readouterr().out


class FakeHfApi:
    """Stands in for huggingface_hub.HfApi (no internet in tests): records calls, or fails the upload."""

    calls: list[tuple[str, dict]] = []
    upload_error: Exception | None = None

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))

    def upload_folder(self, **kwargs):
        if self.upload_error is not None:
            raise self.upload_error
        self.calls.append(("upload_folder", kwargs))


@pytest.mark.parametrize("fails", [False, True])
def test_phase3_pushes_the_final_adapter_when_push_to_hub(tmp_path, monkeypatch, capsys, fails):
    import huggingface_hub

    import phase3_train_grpo as phase3

    monkeypatch.setattr(FakeHfApi, "calls", [])
    monkeypatch.setattr(FakeHfApi, "upload_error", ConnectionError("offline\nmore detail") if fails else None)
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHfApi)
    final = tmp_path / "out" / "final_model"
    final.mkdir(parents=True)
    overrides = [f"paths.output_dir={tmp_path / 'out'}", "training.push_to_hub=true", "training.hub_model_id=someone/x"]
    phase3.push_final_adapter(cfg.build_config("cpu", overrides=overrides), final)  # a failed push does not raise
    captured = capsys.readouterr()
    if fails:
        [line] = captured.err.strip().splitlines()
        assert f"could not push {final} to someone/x (ConnectionError: offline)" in line
        assert "the adapter folder is complete" in line
        assert f"python -m training.export --no_merge --model_path {final} --push_to_hub someone/x" in line
    else:
        assert [name for name, _ in FakeHfApi.calls] == ["create_repo", "upload_folder"]
        assert FakeHfApi.calls[1][1] == {"folder_path": str(final), "repo_id": "someone/x"}
        assert "pushed to https://huggingface.co/someone/x" in captured.out


def test_config_py_prints_each_warning_and_error_once(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("logging_steps: 1\nlog_level: info\nnum_generations: 4\n")
    for argv in (["--config", str(recipe)], ["--push_to_hub"]):
        result = run_script("-m", "config", "--preset", "cpu", *argv)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert lines and len(lines) == len(set(lines)), result.stderr
