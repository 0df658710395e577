"""All hyperparameters of tgrpo, one frozen dataclass per section.

What this package knows: the sections, their defaults (the `gpu` preset, i.e. the product's design values), the
`cpu` preset (the embedded default that runs on a laptop with no network), how to layer a YAML/JSON file and
`--set section.key=value` overrides on top of a preset, and how to validate, print and save the result.
One module each: `sections`, `presets`, `overrides`, `compat` (TRL and open-r1 names), `load`, `cli`.
Every public name is re-exported here, so `import config` is the one import; private helpers stay in their module.
It knows nothing about models, data or training: library code receives its sections, never this whole object.

Resolution order, later wins:  preset  ->  --config FILE  ->  --set section.key=value (repeatable).

Every field carries `metadata["help"]`, which explains the trade-off; `python -m config --help`
prints every key with its help and its value in the resolved preset, and each phase script's flags
are declared as `ConfigFlag`s (flag -> key), so their `--help` text, type, choices and shown
default come from the field and the resolved config, not from hand-written copies.
"""

from __future__ import annotations

from config.cli import (
    TRL_FLAG_ALIASES,
    ConfigFlag,
    add_config_arguments,
    add_config_flags,
    allowed_values,
    check_command_line,
    config_diff,
    config_from_args,
    config_from_args_or_exit,
    config_help_text,
    config_summary,
    config_to_dict,
    exit_on_config_error,
    flag_overrides,
    format_config,
    parse_args_suggesting,
    parse_phase_args,
    phase_command_line,
    preliminary_config,
    run_phase,
    split_trl_flags,
)
from config.compat import (
    ACCELERATE_KEYS,
    BUILTIN_REWARD_NAMES,
    FLAT_KEYS,
    FULL_FINE_TUNING_LR,
    TRL_IGNORED,
    TRL_LOSS_TYPES,
    TRL_REFUSED,
    VLLM_MODES,
    normalize_config_mapping,
)
from config.load import build_config, load_config_file, parse_set_arguments, validate
from config.overrides import (
    apply_overrides,
    section_class,
    section_types,
    unknown_name_error,
)
from config.presets import PRESET_CHOICES, PRESETS, resolve_preset_name
from config.sections import (
    EMBEDDED_STUDENT,
    SECTION_NAMES,
    Config,
    ConfigError,
    CurriculumConfig,
    DataConfig,
    DualSourceConfig,
    EvaluationConfig,
    GRPOConfig,
    GuidanceConfig,
    LoraConfig,
    MultiTurnConfig,
    PathsConfig,
    PromptConfig,
    Range,
    SandboxConfig,
    StudentConfig,
    TeacherConfig,
    TrainingConfig,
    normalize_api_base,
    option,
    vllm_installed,
)

__all__ = [
    "ACCELERATE_KEYS",
    "BUILTIN_REWARD_NAMES",
    "Config",
    "ConfigError",
    "ConfigFlag",
    "CurriculumConfig",
    "DataConfig",
    "DualSourceConfig",
    "EMBEDDED_STUDENT",
    "EvaluationConfig",
    "FLAT_KEYS",
    "FULL_FINE_TUNING_LR",
    "GRPOConfig",
    "GuidanceConfig",
    "LoraConfig",
    "MultiTurnConfig",
    "PRESETS",
    "PRESET_CHOICES",
    "PathsConfig",
    "PromptConfig",
    "Range",
    "SECTION_NAMES",
    "SandboxConfig",
    "StudentConfig",
    "TRL_FLAG_ALIASES",
    "TRL_IGNORED",
    "TRL_LOSS_TYPES",
    "TRL_REFUSED",
    "TeacherConfig",
    "TrainingConfig",
    "VLLM_MODES",
    "section_class",
    "section_types",
    "unknown_name_error",
    "add_config_arguments",
    "add_config_flags",
    "allowed_values",
    "apply_overrides",
    "build_config",
    "config_diff",
    "config_from_args",
    "config_from_args_or_exit",
    "config_help_text",
    "config_summary",
    "config_to_dict",
    "exit_on_config_error",
    "flag_overrides",
    "format_config",
    "load_config_file",
    "normalize_api_base",
    "normalize_config_mapping",
    "option",
    "parse_args_suggesting",
    "parse_phase_args",
    "parse_set_arguments",
    "check_command_line",
    "phase_command_line",
    "preliminary_config",
    "resolve_preset_name",
    "run_phase",
    "split_trl_flags",
    "validate",
    "vllm_installed",
]
