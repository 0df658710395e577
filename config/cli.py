"""Printing and the command line: the resolved config as text and as a diff from its preset, config keys as
script flags, and `run_phase`, which every phase's `cli` goes through."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import errno
import json
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from config.compat import FLAT_KEYS, TRL_IGNORED, TRL_REFUSED, normalize_config_mapping
from config.load import build_config
from config.overrides import section_class, section_types
from config.presets import PRESET_CHOICES, PRESETS
from config.sections import SECTION_NAMES, Config, ConfigError


def config_to_dict(config: Config) -> dict[str, Any]:
    return json.loads(json.dumps(dataclasses.asdict(config)))


def format_config(config: Config) -> str:
    """Human-readable resolved config, one `section.key = value` per line."""
    lines = [f"Resolved config (preset: {config.preset})"]
    for section in SECTION_NAMES:
        for key, value in dataclasses.asdict(getattr(config, section)).items():
            lines.append(f"  {section}.{key} = {value!r}")
    return "\n".join(lines)


def allowed_values(fld: dataclasses.Field) -> str:
    """' Choices: a, b.' or ' Range: >= 0 (0: off).' for a field's help text; '' when it declares neither."""
    choices, value_range = fld.metadata.get("choices"), fld.metadata.get("range")
    if choices:
        return f" Choices: {', '.join(map(str, choices))}."
    if value_range:
        note = f" ({value_range.note})" if value_range.note else ""
        each = " of each item" if isinstance(fld.default, tuple) else ""
        return f" Range{each}: {value_range.describe()}{note}."
    return ""


def config_help_text(config: Config | None = None) -> str:
    """Every section.key with its value in `config` (default: the gpu preset) and its help."""
    config = config or Config()
    lines = [
        f"Config keys (override with --set section.key=value; values shown are the {config.preset} preset's"
        + (" with your --config/--set" if config != build_config(config.preset) else "")
        + "):"
    ]
    for section in SECTION_NAMES:
        cls = section_class(section)
        for f in dataclasses.fields(cls):
            value = getattr(getattr(config, section), f.name)
            lines.append(f"  {section}.{f.name} (default {value!r}): {f.metadata['help']}{allowed_values(f)}")
    cpu = ", ".join(f"{s}.{k}={v!r}" for s, kv in PRESETS["cpu"].items() for k, v in kv.items())
    lines.append(f"The cpu preset changes: {cpu}.")
    return "\n".join(lines)


def config_diff(config: Config) -> dict[str, Any]:
    """{'section.key': value} for every key whose value differs from the config's own preset."""
    preset = build_config(config.preset)
    out = {}
    for section in SECTION_NAMES:
        ours, theirs = getattr(config, section), getattr(preset, section)
        for f in dataclasses.fields(ours):
            if getattr(ours, f.name) != getattr(theirs, f.name):
                out[f"{section}.{f.name}"] = getattr(ours, f.name)
    return out


def config_summary(config: Config) -> str:
    """One line instead of the ~90-line dump: the preset and what differs from it. Each phase saves the full config."""
    changed = config_diff(config)
    return (
        f"Config: preset {config.preset}"
        + ("; changed: " + ", ".join(f"{k}={v!r}" for k, v in changed.items()) if changed else "; no changes")
        + f" (all keys: python -m config --preset {config.preset} ...)"
    )


# --------------------------------------------------------------------------------------------
# Script flags declared as config keys (help, choices and shown defaults come from the fields)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigFlag:
    """A script flag that sets one config key, e.g. ConfigFlag("--num_samples", "evaluation.num_samples").

    Its type, choices and help text come from the field; `--help` shows the value the *resolved* config has
    (the preset picked for this machine, plus --config and --set), not the gpu preset's. `note` is added to
    the field's help where the flag needs a word of its own.
    """

    flag: str
    key: str
    note: str = ""

    def field(self) -> tuple[dataclasses.Field, Any]:
        section, _, name = self.key.partition(".")
        cls = section_class(section)
        return next(f for f in dataclasses.fields(cls) if f.name == name), section_types(cls)[name]


def _flag_type(typ: Any) -> Any:
    if typ in (int, float, str):
        return typ
    return str


def add_config_flags(
    parser: argparse.ArgumentParser, flags: tuple[ConfigFlag, ...], config: Config, title: str = "settings"
) -> None:
    """Add each flag with the field's type, choices and help, showing `config`'s value as the default."""
    group = parser.add_argument_group(
        title, f"Each sets one config key; defaults are those of the resolved config (preset {config.preset})."
    )
    for flag in flags:
        fld, typ = flag.field()
        section, _, name = flag.key.partition(".")
        value = getattr(getattr(config, section), name)
        shown = " ".join(map(str, value)) if isinstance(value, tuple) else value if value != "" else "(empty)"
        bounds = allowed_values(fld) if fld.metadata.get("range") else ""  # argparse shows choices itself
        text = f"{flag.note + ' ' if flag.note else ''}{fld.metadata['help']}{bounds} [{flag.key}; default: {shown}]"
        text = text.replace("%", "%%")  # argparse formats help with %
        dest = flag.flag.lstrip("-")
        if typ is bool:
            group.add_argument(flag.flag, dest=dest, action="store_true", default=None, help=text)
        elif typing.get_origin(typ) is tuple:
            item = typing.get_args(typ)[0]
            group.add_argument(flag.flag, dest=dest, nargs="+", type=_flag_type(item), default=None, help=text)
        else:
            group.add_argument(
                flag.flag, dest=dest, type=_flag_type(typ), choices=fld.metadata.get("choices"), default=None, help=text
            )


def flag_overrides(args: argparse.Namespace, flags: tuple[ConfigFlag, ...]) -> dict[str, dict[str, Any]]:
    """{section: {key: value}} for the flags that were given."""
    out: dict[str, dict[str, Any]] = {}
    for flag in flags:
        value = getattr(args, flag.flag.lstrip("-"))
        if value is not None:
            section, _, name = flag.key.partition(".")
            out.setdefault(section, {})[name] = value
    return out


def preliminary_config(argv: list[str] | None) -> Config:
    """The config --preset/--config/--set in `argv` resolve to (for --help defaults); the preset alone if they fail."""
    pre = argparse.ArgumentParser(add_help=False)
    add_config_arguments(pre)
    known, _ = pre.parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        return build_config(known.preset, known.config, known.overrides)
    except ConfigError:
        try:
            return build_config(known.preset)
        except ConfigError:
            return Config()


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """The three config flags every phase script shares."""
    group = parser.add_argument_group(
        "configuration",
        "TRL's GRPOConfig names are accepted too, as flags and as --config keys (--learning_rate, --num_generations, "
        "--beta, --max_completion_length, --use_vllm, ...): docs/configuration.md lists each and the key it sets.",
    )
    group.add_argument(
        "--preset",
        default="auto",
        choices=PRESET_CHOICES,
        help="Starting values: 'gpu' (the product's design values: Qwen3 student, vLLM teacher, "
        "hub data), 'cpu' (embedded SmolLM2-135M student, local teacher, shipped task fixtures), "
        "or 'auto' (gpu if CUDA is available, else cpu). Default: auto.",
    )
    group.add_argument(
        "--config",
        metavar="FILE",
        help="YAML or JSON file of {section: {key: value}} applied on top of the preset.",
    )
    group.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="Override one config value (repeatable), e.g. --set grpo.kl_coef=0.02 "
        "--set lora.target_modules=q_proj,v_proj. Applied last.",
    )


def parse_phase_args(
    parser: argparse.ArgumentParser, flags: tuple[ConfigFlag, ...], argv: list[str] | None
) -> tuple[argparse.Namespace, dict[str, dict[str, Any]]]:
    """A phase's command line: its own arguments (already on `parser`), its config flags (their help shows the
    values that `argv`'s --preset/--config/--set resolve to) and the three config arguments. Returns the parsed
    arguments and {section: {key: value}} for the flags that were given."""
    add_config_flags(parser, flags, preliminary_config(argv))
    add_config_arguments(parser)
    argv, trl = split_trl_flags(parser, sys.argv[1:] if argv is None else argv)
    args = parse_args_suggesting(parser, argv)
    try:
        trl_overrides = normalize_config_mapping(trl, "command-line flag") if trl else {}
    except ConfigError as error:
        exit_on_config_error(error)
    merged: dict[str, dict[str, Any]] = {k: dict(v) for k, v in trl_overrides.items()}
    for section, values in flag_overrides(args, flags).items():
        merged.setdefault(section, {}).update(values)
    return args, merged


def phase_command_line(
    description: str,
    flags: tuple[ConfigFlag, ...],
    argv: list[str] | None,
    add_arguments: Callable[[argparse.ArgumentParser], Any] | None = None,
) -> tuple[argparse.Namespace, Config]:
    """What every phase's `cli` does first: its command line (`description`, the arguments `add_arguments` puts
    on the parser, its config flags and the three config arguments; `--help` exits here), then the config those
    resolve to (exit 2 with the message on a mistake; its summary printed). Returns the arguments and the config."""
    parser = argparse.ArgumentParser(description=description)
    if add_arguments is not None:
        add_arguments(parser)
    args, overrides = parse_phase_args(parser, flags, argv)
    return args, config_from_args_or_exit(args, overrides)


def check_command_line(
    description: str,
    flags: tuple[ConfigFlag, ...],
    add_arguments: Callable[[argparse.ArgumentParser], Any] | None = None,
    argv: list[str] | None = None,
) -> None:
    """A phase script's command line checked before its heavy imports (torch, transformers: seconds, minutes on a
    busy machine): `--help` (exit 0), an argument or config mistake (exit 2) are answered here, as `cli` would;
    a good command line returns, printing nothing, and `cli` parses it again."""
    parser = argparse.ArgumentParser(description=description)
    if add_arguments is not None:
        add_arguments(parser)
    args, overrides = parse_phase_args(parser, flags, argv)
    config_from_args_or_exit(args, overrides, show=False)


def split_trl_flags(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], dict[str, Any]]:
    """Take TRL-style flags (`--learning_rate 1e-4`, `--num_generations=8`, `--bf16`: the FLAT_KEYS and
    TRL_IGNORED names) that `parser` does not define itself out of `argv`. Returns the rest and {name: value},
    values read as YAML scalars; a flag with no value is true."""
    import yaml

    own = set(parser._option_string_actions)
    trl_names = set(FLAT_KEYS) | set(TRL_IGNORED) | set(TRL_REFUSED)
    rest: list[str] = []
    found: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        name, eq, value = token.partition("=")
        if token.startswith("--") and name not in own and name[2:] in trl_names:
            if not eq:
                if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                    value, i = argv[i + 1], i + 1
                else:
                    value = "true"
            try:
                found[name[2:]] = yaml.safe_load(value)
            except yaml.YAMLError:
                found[name[2:]] = value
        else:
            rest.append(token)
        i += 1
    return rest, found


# Short names TRL users type that are not TRL's own flags.
TRL_FLAG_ALIASES = {"lr": "learning_rate", "bs": "per_device_train_batch_size", "G": "num_generations"}


def parse_args_suggesting(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`parser.parse_args(argv)`, but an unrecognized flag close to one of the parser's flags or to a TRL name
    (FLAT_KEYS, TRL_IGNORED) is refused with "did you mean --name?" (exit 2, as argparse does)."""
    args, unknown = parser.parse_known_args(argv)
    if not unknown:
        return args
    names = sorted(
        {option[2:] for option in parser._option_string_actions if option.startswith("--")}
        | set(FLAT_KEYS)
        | set(TRL_IGNORED)
    )
    hints = []
    for token in unknown:
        if not token.startswith("--"):
            continue
        name = token[2:].partition("=")[0]
        match = TRL_FLAG_ALIASES.get(name) or next(iter(difflib.get_close_matches(name, names, n=1)), None)
        if match:
            hints.append(f"{token.partition('=')[0]}: did you mean --{match}?")
    parser.error(
        f"unrecognized arguments: {' '.join(unknown)}"
        + (f" ({'; '.join(hints)})" if hints else "")
        + ". TRL's GRPOConfig names (--learning_rate, --num_generations, ...) are accepted; see --help."
    )


def config_from_args(args: argparse.Namespace, extra: dict[str, dict[str, Any]] | None = None) -> Config:
    """Build the config from the shared flags plus a script's own flags mapped to keys.

    `extra` holds script flags that were given (e.g. {'data': {'seed': 7}}); they apply after
    --config but before --set, so an explicit --set always wins.
    """
    return build_config(args.preset, args.config, args.overrides, extra)


def exit_on_config_error(exc: ConfigError) -> typing.NoReturn:
    print(f"Configuration error: {exc}", file=sys.stderr)
    raise SystemExit(2)


def config_from_args_or_exit(
    args: argparse.Namespace, extra: dict[str, dict[str, Any]] | None = None, show: bool = True
) -> Config:
    """What every script does first: resolve the config, exit 2 with the message on a mistake, print a summary."""
    try:
        config = config_from_args(args, extra)
    except ConfigError as error:
        exit_on_config_error(error)
    if show:
        print(config_summary(config), flush=True)
    return config


def run_phase(
    work: Callable[[], Any],
    errors: tuple[type[BaseException], ...],
    interrupted: str | Callable[[], str],
    status: Callable[[Any], int] = lambda _result: 0,
    writes: str = "",
) -> int:
    """What every phase's `cli` does with its work: `status(work())`; 1 with `error: …` on stderr for one of
    `errors` (a refusal whose message says what to do) and for a full disk (naming the file, or `writes`: where the
    phase writes, and what `interrupted` says was kept); 130 with `interrupted: …` (what was kept, how to go on)
    on Ctrl-C (`interrupted` may be a function, asked then: what was kept depends on when)."""
    try:
        result = work()
    except errors as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        if callable(interrupted):
            interrupted = interrupted()
        target = error.filename or writes or "an output"
        print(
            f"error: [Errno {error.errno}] no space left on device while writing {target}; free space and rerun the "
            f"same command ({interrupted.split(';')[0].rstrip('.')}).",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        print(f"\ninterrupted: {interrupted() if callable(interrupted) else interrupted}", file=sys.stderr)
        return 130
    return status(result)
