"""Loading and validation: `--set` assignments, a YAML/JSON file with its line numbers, the checks across
sections, and `build_config` (preset -> file -> overrides)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from config.compat import FLAT_KEYS, normalize_config_mapping
from config.overrides import apply_overrides
from config.presets import PRESET_CHOICES, PRESETS, resolve_preset_name
from config.sections import SECTION_NAMES, Config, ConfigError


def parse_set_arguments(assignments: list[str]) -> dict[str, dict[str, str]]:
    """['teacher.temperature=0.5', ...] -> {'teacher': {'temperature': '0.5'}}."""
    out: dict[str, dict[str, str]] = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        if sep and key.strip() == "per_device_train_batch_size":
            raise ConfigError(
                f"--set {item!r}: per_device_train_batch_size counts completions in TRL; here give "
                "training.per_device_train_batch_size in tasks (or the flags --per_device_train_batch_size "
                "and --num_generations)."
            )
        if sep and key.strip() in FLAT_KEYS:  # a TRL name: --set learning_rate=1e-4, converted as in a file
            key, convert = FLAT_KEYS[key.strip()]
            if convert is not None:
                import yaml

                try:
                    parsed = yaml.safe_load(value)
                except yaml.YAMLError:
                    parsed = value
                try:
                    converted = convert(parsed)
                except ConfigError as error:
                    raise ConfigError(f"--set {item!r}: {error}") from None
                if converted is None:
                    continue
                value = converted if isinstance(converted, str) else json.dumps(converted)
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not section or not name:
            raise ConfigError(f"--set {item!r}: expected section.key=value, e.g. --set grpo.kl_coef=0.02.")
        out.setdefault(section, {})[name] = value
    return out


def _yaml_key_lines(text: str) -> dict[str, int]:
    """Top-level key -> 1-based line in a YAML document ({} when it is not a mapping or does not parse)."""
    import yaml

    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return {}
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {str(k.value): k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode)}


def load_config_file(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read a YAML (.yaml/.yml) or JSON config file: {section: {key: value}}, or flat open-r1/TRL-style keys."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config {path}: file not found.")
    text = path.read_text(encoding="utf-8")
    lines: dict[str, int] = {}
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
            lines = _yaml_key_lines(text)
        else:
            data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--config {path}: invalid JSON at line {exc.lineno}: {exc.msg}.") from None
    except Exception as exc:  # noqa: BLE001 - yaml.YAMLError; yaml is imported lazily
        raise ConfigError(f"--config {path}: invalid YAML: {exc}.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: top level must be a mapping of sections or keys.")
    return normalize_config_mapping(data, f"--config {path}", lines)


def validate(config: Config) -> None:
    """Check closed choices and value ranges (both declared on the fields), then the rules that involve
    more than one key; raise ConfigError naming the key, the value and what is allowed."""
    for section in SECTION_NAMES:
        obj = getattr(config, section)
        for f in dataclasses.fields(obj):
            choices = f.metadata.get("choices")
            value = getattr(obj, f.name)
            if choices and value not in choices:
                raise ConfigError(
                    f"{section}.{f.name}={value!r} is not a valid choice. "
                    f"Valid choices: {', '.join(map(str, choices))}."
                )
            value_range = f.metadata.get("range")
            items = value if isinstance(value, tuple) else (value,)
            if value_range and not all(value_range.contains(item) for item in items):
                note = f" ({value_range.note})" if value_range.note else ""
                every = "all be" if isinstance(value, tuple) else "be"
                raise ConfigError(f"{section}.{f.name} must {every} {value_range.describe()}{note}; got {value!r}.")

    def need(ok: bool, key: str, what: str) -> None:
        if not ok:
            raise ConfigError(f"{key} {what}.")

    need(len(config.lora.target_modules) > 0, "lora.target_modules", "must name at least one module")
    need(
        not config.grpo.reward_weights or len(config.grpo.reward_weights) == len(config.grpo.reward_funcs),
        "grpo.reward_weights",
        "must have one weight per grpo.reward_funcs entry (or be empty for 1.0 each)",
    )
    for spec in config.grpo.reward_funcs:
        need(":" in spec, "grpo.reward_funcs", f"entries are 'module:function' or 'file.py:function', got {spec!r}")
    need(
        not (config.student.load_in_8bit and "kv" in (config.rollout_backend, config.evaluation_backend)),
        "student.load_in_8bit",
        "cannot be combined with the kv sampler (grpo.rollout_backend or evaluation.backend): it samples on "
        "CPU from float weights, 8-bit loading is CUDA only. Use the hf backend or load_in_8bit=false",
    )
    need(
        not (config.student.load_in_8bit and config.rollout_backend in ("vllm", "vllm_server")),
        "student.load_in_8bit",
        f"cannot be combined with grpo.rollout_backend={config.rollout_backend}: vLLM would sample from the "
        "bf16 base while the 8-bit one is trained (off-policy rollouts). Use the hf backend or load_in_8bit=false",
    )
    need(
        not (config.grpo.correctness_reward == "fraction" and config.grpo.scale_rewards),
        "grpo.correctness_reward=fraction",
        "needs grpo.scale_rewards=false: divided by the group's std, a group's partial credit (0, 1/3, 0, 0) "
        "gets the advantages of a full solve (0, 1, 0, 0). Set grpo.scale_rewards=false (mean-centred "
        "advantages, Dr. GRPO) or use grpo.correctness_reward=binary",
    )
    grpo = config.grpo
    if grpo.async_rollouts:
        need(
            config.rollout_backend == "vllm_server",
            "grpo.async_rollouts",
            f"needs grpo.rollout_backend=vllm_server (got {config.rollout_backend}): only a server samples while "
            "the trainer updates the weights it would otherwise sample from",
        )
        need(
            grpo.importance_sampling != "off",
            "grpo.async_rollouts",
            "needs grpo.importance_sampling token or sequence: stale rollouts are corrected by it",
        )
        need(
            grpo.gen_update_steps == 1,
            "grpo.async_rollouts",
            "cannot be combined with grpo.gen_update_steps > 1 (max_staleness bounds the lag instead); turn one of "
            "them off",
        )
    training = config.training
    need(
        not (training.warmup_steps > 0 and training.warmup_ratio > 0),
        "training.warmup_steps and training.warmup_ratio",
        f"are both set ({training.warmup_steps} steps, ratio {training.warmup_ratio}); set one, the other to 0",
    )
    output_name = Path(config.paths.output_dir).name
    need(
        not (training.push_to_hub and not training.hub_model_id),
        "training.push_to_hub",
        f"needs training.hub_model_id (TRL would use the output folder's name; give e.g. hub_model_id: "
        f"YOUR_USER/{output_name})",
    )
    for backend in config.training.logging_backends:
        need(backend in ("tensorboard", "wandb"), "training.logging_backends", "may contain only tensorboard, wandb")
    check_guidance(config)


def check_guidance(config: Config) -> None:
    """The teacher-guided rollouts' rules across keys: the prefix shares in order, at most a whole group guided,
    single-turn only (a prefix of the first turn has no place in an episode's turns yet)."""
    g, group = config.guidance, config.grpo.num_samples_per_prompt
    if not g.enabled:
        return
    if not g.min_fraction <= g.initial_fraction <= g.max_fraction:
        raise ConfigError(
            f"guidance.initial_fraction={g.initial_fraction} must lie between guidance.min_fraction="
            f"{g.min_fraction} and guidance.max_fraction={g.max_fraction}."
        )
    if g.guided_samples > group:
        raise ConfigError(
            f"guidance.guided_samples={g.guided_samples} is more than a group holds "
            f"(grpo.num_samples_per_prompt={group}); use at most {group}, or 0 for half the group."
        )
    if config.multi_turn.mode != "single":
        raise ConfigError(
            f"guidance.enabled cannot be combined with multi_turn.mode={config.multi_turn.mode}: guided samples "
            "continue a teacher prefix in one turn; set multi_turn.mode=single or guidance.enabled=false."
        )


def build_config(
    preset: str = "auto",
    config_file: str | Path | None = None,
    overrides: list[str] | dict[str, dict[str, Any]] | None = None,
    extra: dict[str, dict[str, Any]] | None = None,
) -> Config:
    """Preset -> file -> `extra` (a script's own flags) -> overrides, then validate.

    Raises ConfigError naming the offending key on any mistake.
    """
    name = resolve_preset_name(preset)
    if name not in PRESETS:
        raise ConfigError(f"--preset {preset!r}: unknown preset. Valid presets: {', '.join(PRESET_CHOICES)}.")
    config = apply_overrides(Config(preset=name), PRESETS[name], where=f"preset {name}")
    if config_file:
        config = apply_overrides(config, load_config_file(config_file), where=f"--config {config_file}")
    if extra:
        config = apply_overrides(config, extra, where="command-line flag")
    if overrides:
        if isinstance(overrides, list):
            overrides = parse_set_arguments(overrides)
        config = apply_overrides(config, overrides, where="--set")
    validate(config)
    return config
