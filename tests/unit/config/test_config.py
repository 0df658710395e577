import json

import pytest

import config as cfg
from config import ConfigError, build_config
from tests.conftest import ROOT
from training.checkpointing import save_config


def test_gpu_preset_has_the_product_defaults():
    c = build_config("gpu")
    assert c.teacher.api_url == "http://localhost:8129/v1"
    assert c.teacher.model_name == "Qwen/Qwen3-32B-FP8"
    assert (c.teacher.temperature, c.teacher.top_p, c.teacher.presence_penalty) == (0.7, 0.8, 1.5)
    assert c.teacher.enable_thinking is True
    assert (c.teacher.num_samples_per_problem, c.teacher.max_concurrent_requests) == (8, 32)
    assert c.student.model_name == "Qwen/Qwen3-1.7B" and c.student.torch_dtype == "bfloat16"
    assert c.student.load_in_8bit is False
    assert (c.lora.r, c.lora.lora_alpha) == (64, 128)
    assert c.lora.target_modules == ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert (c.grpo.kl_coef, c.grpo.clip_range, c.grpo.num_samples_per_prompt) == (0.05, 0.2, 4)
    assert (c.dual_source.grpo_weight, c.dual_source.teacher_sft_weight, c.dual_source.self_sft_weight) == (
        1.0,
        0.3,
        0.2,
    )
    assert c.training.num_train_epochs == 3 and c.training.per_device_train_batch_size == 2
    assert c.training.gradient_accumulation_steps == 8 and c.training.learning_rate == 5e-5


def test_cpu_preset_uses_the_embedded_student_and_fixtures():
    c = build_config("cpu")
    assert c.preset == "cpu"
    assert c.student.model_name == cfg.EMBEDDED_STUDENT
    assert c.student.torch_dtype == "float32"
    assert c.data.offline is True
    # untouched sections keep the product defaults
    assert c.grpo.kl_coef == 0.05


def test_auto_preset_is_cpu_without_cuda(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # holds on a GPU machine too
    assert build_config("auto").preset == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert build_config("auto").preset == "gpu"


def test_every_field_has_help_text():
    import dataclasses

    for section in cfg.SECTION_NAMES:
        for f in dataclasses.fields(getattr(cfg.Config(), section)):
            assert len(f.metadata.get("help", "")) > 10, f"{section}.{f.name} lacks help"


@pytest.mark.parametrize(
    "assignment, section, key, expected",
    [
        ("grpo.kl_coef=0.02", "grpo", "kl_coef", 0.02),
        ("lora.r=16", "lora", "r", 16),
        ("teacher.enable_thinking=false", "teacher", "enable_thinking", False),
        ("teacher.enable_thinking=YES", "teacher", "enable_thinking", True),
        ("lora.target_modules=q_proj,v_proj", "lora", "target_modules", ("q_proj", "v_proj")),
        ('lora.target_modules=["q_proj"]', "lora", "target_modules", ("q_proj",)),
        ("evaluation.k_values=1,10,100", "evaluation", "k_values", (1, 10, 100)),
        ("teacher.api_url=http://h:1/v1", "teacher", "api_url", "http://h:1/v1"),
        ("training.learning_rate=1e-4", "training", "learning_rate", 1e-4),
    ],
)
def test_set_overrides_are_coerced_to_the_field_type(assignment, section, key, expected):
    c = build_config("gpu", overrides=[assignment])
    assert getattr(getattr(c, section), key) == expected


@pytest.mark.parametrize(
    "assignment, message_parts",
    [
        ("grpo.kl_cof=1", ["unknown key", "grpo.kl_cof", "Did you mean 'grpo.kl_coef'", "grpo.clip_range"]),
        ("trainig.seed=1", ["unknown section", "trainig", "Did you mean 'training'", "dual_source"]),
        ("lora.r=abc", ["lora.r expects an integer", "'abc'"]),
        ("lora.r=1.5", ["lora.r expects an integer"]),
        ("teacher.enable_thinking=maybe", ["teacher.enable_thinking expects a boolean"]),
        ("grpo.kl_coef=high", ["grpo.kl_coef expects a number"]),
        ("data.apps_difficulty=easy", ["data.apps_difficulty='easy'", "introductory, interview, competition, all"]),
        ("student.torch_dtype=fp8", ["student.torch_dtype", "float32, bfloat16"]),
        ("data.val_ratio=1.5", ["data.val_ratio must be between 0 and 1"]),
        ("grpo.num_samples_per_prompt=1", ["grpo.num_samples_per_prompt must be >= 2"]),
        ("grpo.top_k=-1", ["grpo.top_k must be >= 0 (0: off)"]),
        ("evaluation.min_p=1", ["evaluation.min_p must be in [0, 1)"]),
        ("grpo.repetition_penalty=0", ["grpo.repetition_penalty must be > 0 (1: off)"]),
        ("evaluation.top_p=0", ["evaluation.top_p must be in (0, 1]"]),
        ("novalue", ["expected section.key=value"]),
    ],
)
def test_bad_overrides_fail_with_a_message_naming_the_key(assignment, message_parts):
    with pytest.raises(ConfigError) as info:
        build_config("gpu", overrides=[assignment])
    for part in message_parts:
        assert part in str(info.value)


def test_unknown_preset_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="auto, gpu, cpu"):
        build_config("tpu")


def test_file_then_set_order(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("grpo:\n  kl_coef: 0.1\n  clip_range: 0.3\nlora:\n  target_modules: [q_proj, v_proj]\n")
    c = build_config("cpu", config_file=path, overrides=["grpo.kl_coef=0.2"])
    assert c.grpo.kl_coef == 0.2  # --set wins over the file
    assert c.grpo.clip_range == 0.3  # the file wins over the preset
    assert c.lora.target_modules == ("q_proj", "v_proj")
    assert c.student.model_name == cfg.EMBEDDED_STUDENT  # the preset wins over defaults


def test_json_config_file_and_its_errors(tmp_path):
    good = tmp_path / "c.json"
    good.write_text(json.dumps({"training": {"seed": 7}}))
    assert build_config("gpu", config_file=good).training.seed == 7
    bad = tmp_path / "bad.json"
    bad.write_text('{"training": {"seed": 7,}}')
    with pytest.raises(ConfigError, match=r"bad.json: invalid JSON at line 1"):
        build_config("gpu", config_file=bad)
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({"training": {"sed": 7}}))
    with pytest.raises(ConfigError, match=r"--config .*typo.json: unknown key 'training.sed'"):
        build_config("gpu", config_file=typo)
    with pytest.raises(ConfigError, match="file not found"):
        build_config("gpu", config_file=tmp_path / "missing.yaml")


def test_script_flags_apply_before_set():
    c = build_config("gpu", overrides=["data.seed=3"], extra={"data": {"seed": 2, "val_ratio": 0.1}})
    assert c.data.seed == 3 and c.data.val_ratio == 0.1


def test_saved_config_round_trips(tmp_path):
    c = build_config("cpu", overrides=["grpo.kl_coef=0.01"])
    path = save_config(c, tmp_path / "sub" / "config.json")
    data = json.loads(path.read_text())
    assert data["grpo"]["kl_coef"] == 0.01 and data["preset"] == "cpu"
    # the saved file is itself a valid --config file that reproduces the same config
    import dataclasses

    assert build_config("gpu", config_file=path) == dataclasses.replace(c, preset="gpu")


def test_cli_parsing_and_help():
    import argparse

    parser = argparse.ArgumentParser()
    cfg.add_config_arguments(parser)
    args = parser.parse_args(["--preset", "cpu", "--set", "lora.r=4", "--set", "lora.lora_alpha=8"])
    c = cfg.config_from_args(args)
    assert (c.lora.r, c.lora.lora_alpha) == (4, 8)
    text = cfg.config_help_text()
    assert "grpo.kl_coef (default 0.05)" in text and "The cpu preset changes" in text


@pytest.mark.parametrize(
    "url",
    ["http://x:8129/v1", "http://x:8129/v1/", "http://x:8129/v1/chat/completions", " http://x:8129/v1/completions "],
)
def test_teacher_base_url_accepts_a_full_chat_completions_url(url):
    c = build_config("gpu", overrides=[f"teacher.api_url={url}"])
    assert c.teacher.base_url == "http://x:8129/v1"


def test_open_r1_style_flat_keys_are_accepted_in_config_files(tmp_path):
    path = tmp_path / "r1.yaml"
    path.write_text(
        "model_name_or_path: Qwen/Qwen3-0.6B\nlearning_rate: 1.0e-5\nnum_generations: 8\nbeta: 0.0\n"
        "max_completion_length: 512\nloss_type: dr_grpo\nuse_vllm: true\nreport_to: [wandb]\n"
        "lora_target_modules: all-linear\nreward_funcs: [my_rewards:brevity]\nreward_weights: [0.5]\n"
        "kl_coef_is_not_needed_here: null\n"
    )
    with pytest.raises(cfg.ConfigError, match="unknown key 'kl_coef_is_not_needed_here'"):
        build_config("gpu", config_file=path)
    path.write_text(
        path.read_text().replace(
            "kl_coef_is_not_needed_here: null\n", "grpo.clip_range: 0.1\ntraining:\n  save_steps: 7\n"
        )
    )
    c = build_config("gpu", config_file=path)
    assert c.student.model_name == "Qwen/Qwen3-0.6B" and c.training.learning_rate == 1e-5
    assert (c.grpo.num_samples_per_prompt, c.grpo.kl_coef, c.grpo.max_new_tokens) == (8, 0.0, 512)
    assert c.grpo.loss_aggregation == "seq-mean-token-sum-norm" and c.grpo.rollout_backend == "vllm"
    assert c.training.logging_backends == ("wandb",) and c.lora.target_modules == ("all-linear",)
    assert c.grpo.reward_funcs == ("my_rewards:brevity",) and c.grpo.reward_weights == (0.5,)
    assert c.grpo.clip_range == 0.1 and c.training.save_steps == 7
    path.write_text("learning_rat: 1.0e-5\n")
    with pytest.raises(cfg.ConfigError, match="Did you mean 'learning_rate'"):
        build_config("gpu", config_file=path)
    path.write_text("max_new_tokens: 64\n")  # grpo.max_new_tokens or evaluation.max_new_tokens?
    with pytest.raises(cfg.ConfigError, match="'max_new_tokens' is ambiguous"):
        build_config("gpu", config_file=path)


def test_every_recipe_resolves():
    recipes = sorted((ROOT / "recipes").glob("*.yaml"))
    assert {p.name for p in recipes} >= {"cpu_demo.yaml", "qwen3_1gpu.yaml", "qwen3_multigpu.yaml"}
    for recipe in recipes:
        build_config("gpu", config_file=recipe)
    assert build_config("cpu", config_file=ROOT / "recipes" / "cpu_demo.yaml") == build_config("cpu")
    one = build_config("gpu", config_file=ROOT / "recipes" / "qwen3_1gpu.yaml")
    assert one.student.model_name == "Qwen/Qwen3-1.7B" and one.lora.r == 64 and one.grpo.rollout_backend == "vllm"


def test_multi_turn_section_mode_choices_and_limits():
    config = cfg.build_config("cpu", overrides=["multi_turn.mode=feedback", "multi_turn.max_turns=2"])
    assert config.multi_turn.mode == "feedback" and config.multi_turn.max_turns == 2
    assert cfg.build_config("gpu").multi_turn.mode == "single"  # off by default: single-turn as before
    with pytest.raises(cfg.ConfigError, match="multi_turn.mode"):
        cfg.build_config("cpu", overrides=["multi_turn.mode=tools"])
    with pytest.raises(cfg.ConfigError, match="multi_turn.max_total_tokens"):
        cfg.build_config("cpu", overrides=["multi_turn.max_total_tokens=0"])
    with pytest.raises(cfg.ConfigError, match="multi_turn.turn_cost"):
        cfg.build_config("cpu", overrides=["multi_turn.turn_cost=-0.1"])


def test_choice_lists_equal_the_library_constants():
    # config.py imports nothing from the library (the library imports config), so each closed set is
    # written twice; this keeps the two copies equal
    import dataclasses

    from rollouts.kv_sampler import SAMPLER_DTYPES
    from rollouts.vllm_colocated import WEIGHT_SYNCS
    from synthesis.reference_traces import TEACHER_SOURCES, THINKING_MODES
    from training.batching import AUTOCAST_DTYPES
    from training.losses import AGGREGATIONS, IMPORTANCE_LEVELS
    from training.rewards import CORRECTNESS_REWARDS
    from training.schedules import SCHEDULES
    from training.teacher_logprobs import LOGPROB_SOURCES
    from utils.dataset_loader import APPS_DIFFICULTIES, TEST_TYPES
    from utils.prompts import MODES

    library = {
        ("data", "apps_difficulty"): (*APPS_DIFFICULTIES, "all"),
        ("data", "dataset_test_type"): TEST_TYPES,
        ("grpo", "correctness_reward"): CORRECTNESS_REWARDS,
        ("grpo", "loss_aggregation"): AGGREGATIONS,
        ("grpo", "importance_sampling"): IMPORTANCE_LEVELS,
        ("dual_source", "sft_weight_schedule"): SCHEDULES,
        ("training", "lr_scheduler"): SCHEDULES,
        ("multi_turn", "mode"): MODES,
        ("grpo", "sampler_dtype"): tuple(SAMPLER_DTYPES),
        ("training", "autocast"): ("off", "auto", *AUTOCAST_DTYPES),
        ("teacher", "logprob_source"): LOGPROB_SOURCES,
        ("teacher", "source"): TEACHER_SOURCES,
        ("teacher", "reference_thinking"): THINKING_MODES,
        ("grpo", "vllm_weight_sync"): ("auto", *WEIGHT_SYNCS),
    }
    config = cfg.Config()
    declared = {
        (section, f.name): f.metadata["choices"]
        for section in cfg.SECTION_NAMES
        for f in dataclasses.fields(getattr(config, section))
        if f.metadata.get("choices")
    }
    for key, constant in library.items():
        assert tuple(declared[key]) == tuple(constant), key
    # the closed sets without a library constant: the loaders' and the samplers' own literals
    assert set(declared) - set(library) == {
        ("data", "mbpp_config"),
        ("data", "split_mode"),
        ("student", "torch_dtype"),
        ("grpo", "rollout_backend"),
        ("evaluation", "backend"),
    }


# Numeric keys with no declared range, each on purpose: what the value means at every sign, or why no
# bound is checked; the keys marked "not checked yet" are candidates for a range of their own.
UNBOUNDED_ON_PURPOSE = {
    "data.seed": "a seed: any integer",
    "training.seed": "a seed: any integer",
    "evaluation.bootstrap_seed": "a seed: any integer",
    "data.max_apps": "0 or negative: no cap",
    "teacher.max_tasks": "0: all tasks (a negative value also means all)",
    "training.max_steps": "0 or negative: the epochs decide",
    "grpo.clip_range_high": "negative: equal to grpo.clip_range",
    "sandbox.max_workers": "0: one per CPU core",
    "dual_source.sft_decay_steps": "0: the whole run",
    "grpo.format_reward_weight": "a weight of the shaping part; any sign is a valid objective",
    "grpo.reward_weights": "a user reward may be weighted negatively (a penalty)",
    "teacher.presence_penalty": "the teacher server checks its own range (OpenAI: -2 to 2)",
    "teacher.request_timeout": "not checked yet (candidate: > 0)",
    "teacher.max_retries": "not checked yet (candidate: >= 0)",
    "lora.lora_alpha": "not checked yet (candidate: > 0)",
    "lora.lora_dropout": "not checked yet (candidate: in [0, 1))",
    "grpo.max_new_tokens": "not checked yet (candidate: >= 1)",
    "grpo.gen_update_steps": "not checked yet (candidate: >= 1)",
    "grpo.vllm_gpu_memory_utilization": "not checked yet (candidate: in (0, 1])",
    "dual_source.teacher_sft_batch_size": "not checked yet (candidate: >= 0; 0 disables the term)",
    "dual_source.sft_max_length": "not checked yet (candidate: >= 1)",
    "dual_source.self_sft_buffer_size": "not checked yet (candidate: >= 0)",
    "training.num_train_epochs": "not checked yet (candidate: >= 1)",
    "training.warmup_steps": "not checked yet (candidate: >= 0)",
    "training.max_grad_norm": "not checked yet (candidate: >= 0; 0 disables clipping)",
    "training.weight_decay": "not checked yet (candidate: >= 0)",
    "training.save_steps": "not checked yet (candidate: >= 0; 0: only the final model)",
    "training.save_total_limit": "not checked yet (candidate: >= 1)",
    "sandbox.memory_limit_mb": "not checked yet (candidate: >= 1)",
    "evaluation.max_new_tokens": "not checked yet (candidate: >= 1)",
}


def _numeric_fields():
    import dataclasses
    import typing

    for section in cfg.SECTION_NAMES:
        cls = cfg.section_class(section)
        types = cfg.section_types(cls)
        for f in dataclasses.fields(cls):
            typ = types[f.name]
            item = typing.get_args(typ)[0] if typing.get_origin(typ) is tuple else typ
            if item in (int, float):
                yield f"{section}.{f.name}", f


def test_every_numeric_field_declares_a_range_or_is_unbounded_on_purpose():
    fields = dict(_numeric_fields())
    ranged = {key for key, f in fields.items() if f.metadata.get("range")}
    assert not ranged & set(UNBOUNDED_ON_PURPOSE), "a key with a range is listed as unbounded"
    assert set(UNBOUNDED_ON_PURPOSE) <= set(fields), "an unbounded entry names no numeric key"
    missing = set(fields) - ranged - set(UNBOUNDED_ON_PURPOSE)
    assert not missing, f"numeric keys with no range: declare one (option(..., ge=...)) or list it: {sorted(missing)}"
    for key in ranged:  # every declared range is met by both presets' values
        section, _, name = key.partition(".")
        for preset in ("gpu", "cpu"):
            value = getattr(getattr(build_config(preset), section), name)
            assert all(
                fields[key].metadata["range"].contains(v) for v in (value if isinstance(value, tuple) else (value,))
            )


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("data.val_ratio=0", "data.val_ratio must be between 0 and 1, exclusive (e.g. 0.2); got 0.0."),
        ("grpo.clip_range=1", "grpo.clip_range must be in [0, 1); got 1.0."),
        ("grpo.clip_range=-0.1", "grpo.clip_range must be in [0, 1); got -0.1."),
        ("teacher.top_p=1.01", "teacher.top_p must be in (0, 1]; got 1.01."),
        ("training.learning_rate=0", "training.learning_rate must be > 0; got 0.0."),
        ("multi_turn.max_tool_calls=-1", "multi_turn.max_tool_calls must be >= 0 (0 = off); got -1."),
        ("evaluation.k_values=1,0", "evaluation.k_values must all be >= 1; got (1, 0)."),
    ],
)
def test_range_errors_name_the_key_the_value_and_what_is_allowed(assignment, message):
    with pytest.raises(ConfigError) as info:
        build_config("gpu", overrides=[assignment])
    assert str(info.value) == message


@pytest.mark.parametrize("key, value", [("grpo.clip_range", 0.0), ("teacher.top_p", 1.0), ("grpo.top_k", 0)])
def test_range_bounds_that_are_inclusive_are_accepted(key, value):
    section, _, name = key.partition(".")
    assert getattr(getattr(build_config("gpu", overrides=[f"{key}={value}"]), section), name) == value


def test_help_shows_each_declared_range():
    text = cfg.config_help_text(build_config("cpu"))
    assert "grpo.top_k (default 0): " in text and "Range: >= 0 (0: off)." in text
    assert "Range of each item: >= 1." in text  # evaluation.k_values
    for key, f in _numeric_fields():
        if f.metadata.get("range"):
            line = next(line for line in text.splitlines() if line.startswith(f"  {key} "))
            assert (
                f"Range{' of each item' if isinstance(f.default, tuple) else ''}: {f.metadata['range'].describe()}"
                in line
            )


def test_the_gpu_preset_samples_with_vllm_when_it_is_installed(monkeypatch):
    """Phases 3 and 4 of the gpu preset sample with vLLM when the package is there; without it they fall back to hf
    and say so in one line that names the install, how to keep hf, and the expected sampling time."""
    import config as config_module
    from rollouts.from_config import auto_backend_note

    monkeypatch.setattr(config_module.sections, "vllm_installed", lambda: True)
    config = build_config("gpu")
    assert (config.rollout_backend, config.evaluation_backend) == ("vllm", "vllm")
    assert auto_backend_note(config, "train", calls=1, tokens=1024) == ""
    monkeypatch.setattr(config_module.sections, "vllm_installed", lambda: False)
    assert (config.rollout_backend, config.evaluation_backend) == ("hf", "hf")
    train = auto_backend_note(config, "train", calls=1, tokens=1024)
    assert "vllm is not installed" in train and "pip install -r requirements-gpu.txt" in train
    assert "~2 min per step" in train and "--set grpo.rollout_backend=hf" in train  # 1,024 x 0.1 s
    evaluation = auto_backend_note(config, "eval", calls=150, tokens=1024)
    assert "~256 min per model" in evaluation and "--set evaluation.backend=hf" in evaluation
    chosen = build_config("gpu", overrides=["grpo.rollout_backend=hf"])
    assert chosen.rollout_backend == "hf" and auto_backend_note(chosen, "train", calls=1, tokens=1024) == ""
    assert build_config("cpu").rollout_backend == "kv"  # the cpu preset keeps its sampler


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["grpo.rollout_backend=hf"], "needs grpo.rollout_backend=vllm_server"),
        (["grpo.importance_sampling=off"], "importance_sampling"),
        (["grpo.gen_update_steps=2"], "gen_update_steps"),
    ],
)
def test_async_rollouts_refuse_what_they_cannot_run_with_one_error(overrides, named):
    base = ["grpo.async_rollouts=true", "grpo.rollout_backend=vllm_server"]
    with pytest.raises(cfg.ConfigError, match=named):
        cfg.build_config("cpu", overrides=base + overrides)


def test_async_rollouts_on_the_server_with_a_staleness_bound_are_accepted():
    grpo = cfg.build_config(
        "cpu", overrides=["grpo.async_rollouts=true", "grpo.rollout_backend=vllm_server", "grpo.max_staleness=2"]
    ).grpo
    assert grpo.async_rollouts and grpo.max_staleness == 2
    base = ["grpo.async_rollouts=true", "grpo.rollout_backend=vllm_server"]
    for mode in ("tool", "feedback"):  # the producer runs whole episodes
        assert cfg.build_config("cpu", overrides=[*base, f"multi_turn.mode={mode}"]).multi_turn.mode == mode
    assert cfg.build_config("cpu", overrides=[*base, "grpo.dynamic_sampling=true"]).grpo.dynamic_sampling
    assert cfg.build_config("cpu", overrides=[*base, "curriculum.enabled=true"]).curriculum.enabled
    with pytest.raises(cfg.ConfigError, match="max_staleness"):
        cfg.build_config("cpu", overrides=["grpo.max_staleness=-1"])
