"""TRL / open-r1 names: a flat recipe (TRL's `GRPOConfig` keys, open-r1's YAML) mapped onto this project's
sections, converted where the unit differs and refused or pointed where the meaning does."""

from __future__ import annotations

import dataclasses
import difflib
import sys
from typing import Any

from config.overrides import section_class, unknown_name_error
from config.sections import SECTION_NAMES, ConfigError, normalize_api_base

# open-r1 / TRL GRPOConfig names accepted as flat top-level keys in --config files: name -> (key, converter).
TRL_LOSS_TYPES = {
    "grpo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dapo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
}


def _report_to(value: Any) -> list[str]:
    names = [value] if isinstance(value, str) else list(value or [])
    if names == ["all"]:
        return ["tensorboard", "wandb"]
    return [n for n in names if n not in ("none", "")]


def _loss_type(value: Any) -> str:
    if value not in TRL_LOSS_TYPES:
        raise ConfigError(
            f"loss_type {value!r}: tgrpo supports {', '.join(TRL_LOSS_TYPES)} (as grpo.loss_aggregation)."
        )
    return TRL_LOSS_TYPES[value]


def _lr_scheduler(value: Any) -> Any:
    # the floor comes from lr_scheduler_kwargs.min_lr_rate (training.min_lr_rate); the curve is the cosine
    return "cosine" if value == "cosine_with_min_lr" else value


def _min_lr_rate(value: Any) -> Any:
    if value is None:  # TRL's default: no kwargs
        return None
    if not isinstance(value, dict) or set(value) - {"min_lr_rate"}:
        raise ConfigError(
            f"lr_scheduler_kwargs {value!r}: only min_lr_rate (the decay's end as a share of learning_rate, "
            "training.min_lr_rate) is supported; give min_lr_rate instead of min_lr."
        )
    return value.get("min_lr_rate")


def _scale_rewards(value: Any) -> Any:
    """TRL's scale_rewards: a bool, or its current strings 'group' (= true), 'none' (= false), 'batch'."""
    forms = {"group": True, "true": True, "none": False, "false": False}
    if isinstance(value, str) and value.lower() in forms:
        return forms[value.lower()]
    if isinstance(value, str) and value.lower() == "batch":
        raise ConfigError(
            "scale_rewards 'batch' (one std over the whole batch) is not built here: 'group' (or true) divides "
            "each group's centred rewards by that group's std, 'none' (or false) does not divide (Dr. GRPO)."
        )
    return value


# TRL's vllm_importance_sampling_mode: the same correction as grpo.importance_sampling where it truncates;
# the masking modes (drop a token or sequence above the cap) are not built.
TRL_IS_MODES = {"token_truncate": "token", "sequence_truncate": "sequence"}


def _is_mode(value: Any) -> str:
    if value not in TRL_IS_MODES:
        raise ConfigError(
            f"vllm_importance_sampling_mode {value!r}: tgrpo truncates the weights (token_truncate, "
            "sequence_truncate, as grpo.importance_sampling token / sequence); the masking modes are not built."
        )
    return TRL_IS_MODES[value]


def _trl_generation_keys(data: dict[str, Any]) -> dict[str, Any]:
    """Keys TRL reads against others in the same source: GSPO's importance_sampling_level, and
    steps_per_generation against gradient_accumulation_steps. What matches tgrpo's behaviour is dropped (and
    named in the "ignored here" warning); anything else is refused, never mapped onto a look-alike key."""
    out = dict(data)
    level = out.get("importance_sampling_level")
    if level is not None and level != "token":
        raise ConfigError(
            f"importance_sampling_level {level!r}: GSPO's sequence-level policy ratio is not built here (tgrpo's "
            "policy ratio is per token, TRL's default 'token'). grpo.importance_sampling is another thing: the "
            "correction for the sampler/trainer mismatch (TRL's vllm_importance_sampling_mode)."
        )
    steps = out.get("steps_per_generation")
    accumulation = out.get("gradient_accumulation_steps", 1)
    if steps is not None and steps != accumulation:
        raise ConfigError(
            f"steps_per_generation {steps!r} (gradient_accumulation_steps {accumulation}): tgrpo samples one "
            "rollout batch per optimizer step, TRL's default steps_per_generation = gradient_accumulation_steps. "
            "To train several steps on each batch use grpo.num_iterations."
        )
    return out


VLLM_MODES = {"colocate": "vllm", "server": "vllm_server"}


def _vllm_and_scheduler_keys(data: dict[str, Any]) -> dict[str, Any]:
    """Keys TRL reads together: use_vllm with vllm_mode (whichever comes first in the file), and
    cosine_with_min_lr, which TRL refuses without lr_scheduler_kwargs.min_lr_rate."""
    if data.get("lr_scheduler_type") == "cosine_with_min_lr":
        kwargs = data.get("lr_scheduler_kwargs")
        if not (isinstance(kwargs, dict) and "min_lr_rate" in kwargs):
            raise ConfigError(
                "lr_scheduler_type cosine_with_min_lr needs lr_scheduler_kwargs: {min_lr_rate: r} (the decay ends "
                "at r x learning_rate); or use cosine, which decays to 0."
            )
    if "vllm_mode" not in data or data.get("use_vllm") is not True:
        return data  # without use_vllm, TRL ignores vllm_mode: it stays in the "ignored here" warning
    out = dict(data)
    mode = out.pop("vllm_mode")
    if mode not in VLLM_MODES:
        raise ConfigError(f"vllm_mode {mode!r}: tgrpo supports {', '.join(VLLM_MODES)}.")
    out["use_vllm"] = VLLM_MODES[mode]
    return out


# Below this a learning rate is one for full fine-tuning (open-r1's recipes use 5e-7 to 1e-6); the student here
# trains a LoRA adapter, whose rates are 10-1000x higher (the presets use 5e-5 and 5e-4).
FULL_FINE_TUNING_LR = 1e-5

# Keys of an accelerate config file (`accelerate config`): such a file goes to `accelerate launch --config_file`.
ACCELERATE_KEYS = ("compute_environment", "distributed_type", "num_processes", "mixed_precision", "machine_rank")


def _accelerate_config(data: dict[str, Any], where: str) -> None:
    """Refuse an accelerate config passed as a tgrpo --config, in one line that says where it goes."""
    found = [key for key in ACCELERATE_KEYS if key in data]
    if len(found) >= 2:
        path = where.removeprefix("--config ")
        raise ConfigError(
            f"{where} looks like an accelerate config ({', '.join(found)}), not a tgrpo one: pass it to accelerate, "
            f"as in accelerate launch --config_file {path} phase3_train_grpo.py --preset gpu [--config RECIPE]."
        )


def _whole_groups(completions: int, group: int, accumulation: int | None, where: str) -> dict[str, int]:
    """TRL's per-device batch (completions per micro-batch) as tgrpo's units: tasks per micro-batch, and the
    accumulation when it has to change. TRL requires only the global batch (processes x completions x
    accumulation) to be whole groups, since its groups may straddle processes; here each process samples and
    scores whole groups (advantages need no communication) and its micro-batches mix them, so the unit is a
    process's step: completions x accumulation. Not whole groups: rounded down to whole groups, with a warning."""
    if completions % group == 0:  # whole groups in every micro-batch: the accumulation stays as it is
        return {"training.per_device_train_batch_size": completions // group}
    slots = accumulation or 1  # without the recipe's accumulation: per micro-batch (the preset's accumulation)
    per_step = completions * slots
    groups = per_step // group
    batch = (
        f"per_device_train_batch_size {completions} x gradient_accumulation_steps {slots} = {per_step} "
        "completions per process and step"
        if accumulation
        else f"per_device_train_batch_size {completions} (completions per micro-batch)"
    )
    if groups == 0:
        raise ConfigError(
            f"{batch} is less than one group of num_generations {group}: here every process samples whole "
            f"groups; write training.per_device_train_batch_size: 1 (one task, {group} completions)."
        )
    # the fewest micro-batches, at least the recipe's, that split the groups evenly: none larger than TRL's
    micro = next(d for d in range(min(slots, groups), groups + 1) if groups % d == 0)
    tasks = groups // micro
    arrangement = f"training.per_device_train_batch_size {tasks}" + (
        f", gradient_accumulation_steps {micro}" if accumulation else ""
    )
    if groups * group == per_step:
        _warn_once(
            f"{where}: {batch} = {groups} groups of num_generations {group}: the same step as {arrangement} "
            "(tasks per micro-batch x micro-batches)."
        )
    else:
        _warn_once(
            f"{where}: {batch} is not whole groups of num_generations {group}. TRL asks that only of the global "
            "batch (its groups may straddle processes); here each process samples and scores whole groups, so "
            f"advantages need no communication: trained as {groups} groups ({groups * group} completions) "
            f"{'per process and step' if accumulation else 'per micro-batch'} ({arrangement}). Set "
            f"{'those keys' if accumulation else 'it'} to choose."
        )
    tasks_key = {"training.per_device_train_batch_size": tasks}
    return tasks_key if accumulation is None else {**tasks_key, "gradient_accumulation_steps": micro}


def _trl_batch_and_placement(data: dict[str, Any], where: str) -> dict[str, Any]:
    """TRL names whose unit or scope differs here: per_device_train_batch_size counts completions in TRL and
    tasks here (converted with num_generations from the same source, refused without it; see _whole_groups);
    a full fine-tuning learning rate and TRL's vLLM server placement that becomes a colocated engine here each
    get a warning."""
    out = dict(data)
    if "per_device_train_batch_size" in out:
        completions = out.pop("per_device_train_batch_size")
        group = out.get("num_generations")
        unit = "training.per_device_train_batch_size counts tasks (each sampled grpo.num_samples_per_prompt times)"
        if not isinstance(completions, int) or isinstance(completions, bool) or completions < 1:
            raise ConfigError(f"per_device_train_batch_size {completions!r}: a whole number of completions, >= 1.")
        if not isinstance(group, int) or isinstance(group, bool) or group < 1:
            raise ConfigError(
                f"per_device_train_batch_size {completions} counts completions in TRL, but {unit} here: give "
                "num_generations beside it (converted to per_device_train_batch_size / num_generations tasks), or "
                "write training.per_device_train_batch_size in tasks."
            )
        accumulation = out.get("gradient_accumulation_steps")
        if not isinstance(accumulation, int) or isinstance(accumulation, bool) or accumulation < 1:
            accumulation = None  # absent or malformed: the key's own check reports the latter
        out.update(_whole_groups(completions, group, accumulation, where))
    rate = out.get("learning_rate")
    if isinstance(rate, int | float) and not isinstance(rate, bool) and 0 < rate < FULL_FINE_TUNING_LR:
        _warn_once(
            f"{where}: learning_rate {rate:g} is a full fine-tuning rate; here it drives a LoRA adapter, which "
            "learns little at it (the presets use 5e-5 on a GPU, 5e-4 on a CPU): set training.learning_rate."
        )
    if out.get("use_vllm") is True and "vllm_mode" not in out:
        memory = out.get("vllm_gpu_memory_utilization")
        share = f" ({memory} of it, vllm_gpu_memory_utilization)" if memory is not None else ""
        device = " vllm_device is not used here." if "vllm_device" in out else ""
        _warn_once(
            f"{where}: use_vllm: true without vllm_mode is a vLLM server on its own GPU in TRL; here it is a vLLM "
            f"engine colocated on the training GPU{share}.{device} For a server give vllm_mode: server and "
            "vllm_server_base_url (a `vllm serve` URL ending in /v1); else vllm_mode: colocate to silence this."
        )
    return out


def _with_v1(url: str) -> str:
    """TRL's vllm_server_base_url ('http://host:8000') as the OpenAI base tgrpo talks to ('http://host:8000/v1')."""
    base = normalize_api_base(url)
    return base if base.endswith("/v1") else f"{base}/v1"


FLAT_KEYS: dict[str, tuple[str, Any]] = {
    "model_name_or_path": ("student.model_name", None),
    "torch_dtype": ("student.torch_dtype", None),
    "dtype": ("student.torch_dtype", None),
    "bf16": ("student.torch_dtype", lambda v: "bfloat16" if v else None),
    "load_in_8bit": ("student.load_in_8bit", None),
    "lora_r": ("lora.r", None),
    "lora_alpha": ("lora.lora_alpha", None),
    "lora_dropout": ("lora.lora_dropout", None),
    "lora_target_modules": ("lora.target_modules", None),
    "learning_rate": ("training.learning_rate", None),
    "num_train_epochs": ("training.num_train_epochs", None),
    "max_steps": ("training.max_steps", None),
    # counts completions in TRL, tasks here: converted by _trl_batch_and_placement before this table is read
    "per_device_train_batch_size": ("training.per_device_train_batch_size", None),
    "gradient_accumulation_steps": ("training.gradient_accumulation_steps", None),
    "gradient_checkpointing": ("training.gradient_checkpointing", None),
    "warmup_steps": ("training.warmup_steps", None),
    "warmup_ratio": ("training.warmup_ratio", None),
    "lr_scheduler_type": ("training.lr_scheduler", _lr_scheduler),
    "lr_scheduler_kwargs": ("training.min_lr_rate", _min_lr_rate),
    "push_to_hub": ("training.push_to_hub", None),
    "hub_model_id": ("training.hub_model_id", None),
    "max_prompt_length": ("grpo.max_prompt_length", None),
    "max_grad_norm": ("training.max_grad_norm", None),
    "weight_decay": ("training.weight_decay", None),
    "save_steps": ("training.save_steps", None),
    "save_total_limit": ("training.save_total_limit", None),
    "seed": ("training.seed", None),
    "report_to": ("training.logging_backends", _report_to),
    "wandb_project": ("training.tracker_project", None),
    "wandb_entity": ("training.tracker_entity", None),
    "run_name": ("training.run_name", None),
    "output_dir": ("paths.output_dir", None),
    "num_generations": ("grpo.num_samples_per_prompt", None),
    "max_completion_length": ("grpo.max_new_tokens", None),
    "temperature": ("grpo.temperature", None),
    "top_p": ("grpo.top_p", None),
    "top_k": ("grpo.top_k", lambda v: 0 if v is None else v),  # TRL: None or 0 = off
    "min_p": ("grpo.min_p", lambda v: 0.0 if v is None else v),
    "repetition_penalty": ("grpo.repetition_penalty", None),
    "beta": ("grpo.kl_coef", None),
    "epsilon": ("grpo.clip_range", None),
    "epsilon_high": ("grpo.clip_range_high", None),
    "num_iterations": ("grpo.num_iterations", None),
    "scale_rewards": ("grpo.scale_rewards", _scale_rewards),
    "vllm_importance_sampling_mode": ("grpo.importance_sampling", _is_mode),
    "vllm_importance_sampling_correction": ("grpo.importance_sampling", lambda v: None if v else "off"),
    "vllm_importance_sampling_cap": ("grpo.importance_sampling_cap", None),
    "vllm_importance_sampling_clip_max": ("grpo.importance_sampling_cap", None),
    "vllm_enable_sleep_mode": ("grpo.vllm_sleep_mode", None),
    "loss_type": ("grpo.loss_aggregation", _loss_type),
    # a string is the backend vllm_mode picked (_vllm_and_scheduler_keys)
    "use_vllm": ("grpo.rollout_backend", lambda v: v if isinstance(v, str) else "vllm" if v else "hf"),
    "vllm_gpu_memory_utilization": ("grpo.vllm_gpu_memory_utilization", None),
    # TRL writes its server's root (http://host:8000); an OpenAI-compatible `vllm serve` answers under /v1
    "vllm_server_base_url": ("grpo.vllm_server_url", lambda v: _with_v1(v) if isinstance(v, str) else v),
    "reward_funcs": ("grpo.reward_funcs", None),
    "log_completions": ("training.log_completions", None),
    "reward_weights": ("grpo.reward_weights", None),
    "dataset_name": ("data.dataset_name", None),
    "dataset_config": ("data.dataset_config", None),
    "dataset_train_split": ("data.dataset_split", None),
}


# TRL / open-r1 keys that change nothing here: accepted, and named once in one "ignored here" warning.
TRL_IGNORED: dict[str, str] = {
    name: ""
    for name in (
        "model_revision",
        "attn_implementation",
        "vllm_device",
        "do_eval",
        "eval_strategy",
        "eval_steps",
        "per_device_eval_batch_size",
        "gradient_checkpointing_kwargs",
        "hub_strategy",
        "log_level",
        "logging_first_step",
        "logging_steps",
        "logging_strategy",
        "save_strategy",
        "save_only_model",
        "ddp_find_unused_parameters",
        "use_liger_kernel",
        "trust_remote_code",
        "num_completions_to_print",
        "log_unique_prompts",
        "log_completions_hub_repo",
        "ds3_gather_for_generation",
        "bf16_full_eval",
        "tf32",
        "dataloader_num_workers",
        "remove_unused_columns",
    )
} | {
    "callbacks": "TRL trainer callbacks; none run here (training.push_to_hub pushes the final adapter)",
    "dataset_prompt_column": "phase 1 reads your columns: --field_map problem=COLUMN",
    "importance_sampling_level": "token: tgrpo's policy ratio is per token",
    "steps_per_generation": "equal to gradient_accumulation_steps: one rollout batch per optimizer step, as here",
    "vllm_mode": "no effect without use_vllm: true",
    "system_prompt": "tgrpo builds its own prompts (prompt.* keys)",
    "dataset_configs": "use dataset_config",
    "overwrite_output_dir": "give phase 3 --overwrite_output_dir on its command line to start over",
    "resume_from_checkpoint": "give phase 3 --resume_from_checkpoint latest (or a checkpoint folder) to continue",
    "logging_dir": "tensorboard files go to <output_dir>/tensorboard",
}

# TRL / open-r1 keys that would change training in a way tgrpo cannot: refused with what to use instead.
TRL_REFUSED: dict[str, str] = {
    name: "a TRL GRPOConfig option tgrpo does not build"
    for name in (
        "model_init_kwargs",
        "router_aux_loss_coef",
        "cast_lm_head_to_fp32",
        "pad_to_multiple_of",
        "cache_implementation",
        "vllm_model_impl",
        "vllm_structured_outputs_regex",
        "vllm_server_host",
        "vllm_server_port",
        "vllm_server_timeout",
        "vllm_group_port",
        "sapo_temperature_neg",
        "sapo_temperature_pos",
        "vespo_k_pos",
        "vespo_lambda_pos",
        "vespo_k_neg",
        "vespo_lambda_neg",
        "ref_model_mixup_alpha",
        "ref_model_sync_steps",
        "top_entropy_quantile",
        "entropy_coef",
        "use_adaptive_entropy",
        "entropy_coef_min",
        "entropy_coef_max",
        "entropy_coef_delta",
        "entropy_target",
        "vllm_importance_sampling_clip_min",
        "off_policy_mask_threshold",
        "use_bias_correction_kl",
        "log_multimodal",
        "use_transformers_continuous_batching",
        "transformers_continuous_batching_config",
        "use_transformers_paged",
    )
} | {
    "generation_batch_size": "tgrpo samples training.per_device_train_batch_size x gradient_accumulation_steps "
    "tasks per process for each optimizer step; set those",
    "delta": "two-sided clipping is not built; grpo.clip_range and clip_range_high are the PPO clips",
    "sync_ref_model": "the reference policy is the base model (the adapter disabled), never synced",
    "disable_dropout": "dropout is off while log-probs are compared; LoRA's dropout is lora.lora_dropout",
    "num_generations_eval": "phase 4 samples evaluation.num_samples per task",
    "generation_kwargs": "the sampling keys are grpo.temperature, top_p, top_k, min_p, repetition_penalty",
    "chat_template_kwargs": "the prompt is built by prompt.* keys (thinking: prompt.enable_thinking)",
    "vllm_max_model_length": "the sequence budget is grpo.max_prompt_length + grpo.max_new_tokens",
    "vllm_tensor_parallel_size": "a colocated engine here is one per training process; give a `vllm serve "
    "--tensor-parallel-size N` server with grpo.rollout_backend vllm_server instead",
    "multi_objective_aggregation": "tgrpo z-scores correctness within each group and adds the other rewards "
    "centred (see grpo.reward_funcs)",
    "max_tool_calling_iterations": "tool use is multi_turn.mode tool with multi_turn.max_tool_calls",
    "shuffle_dataset": "phase 1 shuffles once with training.seed; phase 3 keeps that order (curriculum.* reorders it)",
}

# open-r1's reward names that are tgrpo's built-in rewards: 'code' is the execution (correctness) reward,
# always on; 'format' is the format bonus, weighted by grpo.format_reward_weight.
BUILTIN_REWARD_NAMES = ("code", "format")

_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        print(f"warning: {message}", file=sys.stderr, flush=True)


def _field_owners() -> dict[str, list[str]]:
    owners: dict[str, list[str]] = {}
    for section in SECTION_NAMES:
        for f in dataclasses.fields(section_class(section)):
            owners.setdefault(f.name, []).append(section)
    return owners


def _builtin_rewards(data: dict[str, Any], where: str) -> dict[str, Any]:
    """Drop open-r1's 'code'/'format' from reward_funcs (tgrpo always computes them); a weight given for
    'format' becomes grpo.format_reward_weight, one for 'code' must be 1 (correctness is z-scored)."""
    funcs = data.get("reward_funcs")
    if not isinstance(funcs, list) or not any(f in BUILTIN_REWARD_NAMES for f in funcs):
        return data
    weights = data.get("reward_weights")
    out = dict(data)
    if isinstance(weights, list) and len(weights) == len(funcs):
        for name, weight in zip(funcs, weights, strict=True):
            if name == "format":
                out["format_reward_weight"] = weight
            elif name == "code" and float(weight) != 1.0:
                raise ConfigError(
                    f"{where}: reward_weights gives 'code' {weight}; the execution reward is z-scored within "
                    "each group, so its weight is 1. Scale the others (format_reward_weight, reward_weights)."
                )
        out["reward_weights"] = [w for n, w in zip(funcs, weights, strict=True) if n not in BUILTIN_REWARD_NAMES]
    out["reward_funcs"] = [f for f in funcs if f not in BUILTIN_REWARD_NAMES]
    return out


def _close_match(key: str, owners: dict[str, list[str]]) -> str:
    """' Did you mean X?' for an unknown key, over tgrpo's keys and every TRL name this module knows, so a
    mistyped TRL name is pointed at that name (and what becomes of it here), never at a tgrpo key that only
    looks like it (importance_sampling_level is not importance_sampling)."""
    own = [k for k, v in owners.items() if len(v) == 1] + list(SECTION_NAMES)
    names = list(FLAT_KEYS) + list(TRL_IGNORED) + list(TRL_REFUSED) + own
    hint = difflib.get_close_matches(key, names, n=1, cutoff=0.75)
    if not hint:
        return ""
    name = hint[0]
    if name in TRL_REFUSED:
        return f" Did you mean '{name}'? (TRL's; not supported here: {TRL_REFUSED[name]}.)"
    if name in TRL_IGNORED and name not in FLAT_KEYS:
        return f" Did you mean '{name}'? (TRL's; no effect here.)"
    return f" Did you mean '{name}'?"


def normalize_config_mapping(data: dict[str, Any], where: str, lines: dict[str, int] | None = None) -> dict[str, Any]:
    """Nested sections, 'section.key' keys, open-r1/TRL flat names and unambiguous field names -> nested sections.

    So an open-r1 recipe (`learning_rate: 1e-5`, `num_generations: 8`, `beta: 0.04`, ...) works as a --config
    file as it is. TRL keys with no effect here (TRL_IGNORED) are named in one warning; every other key that
    means nothing here is reported, all of them in one error (with the file's line when `lines` has it).
    """
    nested: dict[str, Any] = {}
    owners = _field_owners()
    problems: list[str] = []
    ignored: list[str] = []
    unknown_seen = False

    def loc(key: str) -> str:
        line = (lines or {}).get(key)
        return f"{where.removeprefix('--config ')}:{line}" if line else where

    def put(key: str, value: Any, origin: str) -> None:
        section, _, name = key.partition(".")
        if section not in SECTION_NAMES:
            raise unknown_name_error("section", section, list(SECTION_NAMES), loc(origin.partition(".")[0]))
        current = nested.setdefault(section, {})
        if name in current and current[name] != value:
            raise ConfigError(f"{loc(origin)}: {origin} sets {key} a second time.")
        current[name] = value

    try:
        data = _builtin_rewards(data, where)
    except ConfigError as error:
        problems.append(str(error))
    _accelerate_config(data, where)
    try:
        data = _trl_batch_and_placement(data, where)
    except ConfigError as error:
        problems.append(f"{loc('per_device_train_batch_size')}: {error}")
    try:
        data = _vllm_and_scheduler_keys(data)
    except ConfigError as error:
        problems.append(f"{where}: {error}")
    try:
        data = _trl_generation_keys(data)
    except ConfigError as error:
        text = str(error)
        problems.append(f"{loc(text.split(' ')[0])}: {text}")
    for key, value in data.items():
        try:
            if key == "preset":
                nested["preset"] = value
            elif key in SECTION_NAMES and isinstance(value, dict):
                for name, inner in value.items():
                    put(f"{key}.{name}", inner, f"{key}.{name}")
            elif "." in key:
                put(key, value, key)
            elif key in FLAT_KEYS:
                target, convert = FLAT_KEYS[key]
                converted = convert(value) if convert else value
                if converted is not None:
                    put(target, converted, key)
            elif key in TRL_IGNORED:
                note = TRL_IGNORED[key]
                ignored.append(f"{key} ({note})" if note else key)
            elif key in TRL_REFUSED:
                problems.append(f"{loc(key)}: {key} is not supported: {TRL_REFUSED[key]}.")
            elif len(owners.get(key, [])) == 1:
                put(f"{owners[key][0]}.{key}", value, key)
            elif key in owners:
                problems.append(
                    f"{loc(key)}: '{key}' is ambiguous ({', '.join(f'{s}.{key}' for s in owners[key])}); "
                    "write it as section.key."
                )
            else:
                problems.append(f"{loc(key)}: unknown key '{key}'.{_close_match(key, owners)}")
                unknown_seen = True
        except ConfigError as error:
            text = str(error)
            problems.append(text if text.startswith(loc(key)) else f"{loc(key)}: {key}: {text}")
    if ignored:
        _warn_once(f"{where}: ignored here (no effect in tgrpo): {', '.join(ignored)}.")
    if problems:
        valid = sorted(set(FLAT_KEYS) | {k for k, v in owners.items() if len(v) == 1} | set(SECTION_NAMES))
        tail = f" Valid keys: {', '.join(valid)}." if unknown_seen else ""
        if len(problems) == 1:
            raise ConfigError(problems[0] + tail)
        raise ConfigError(
            f"{where}: {len(problems)} problems:\n  " + "\n  ".join(problems) + ("\n" + tail if tail else "")
        )
    return nested
