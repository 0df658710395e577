"""Typed overrides: a `section.key=value` mapping coerced to each field's type and applied to a `Config`."""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from typing import Any

from config.sections import SECTION_NAMES, Config, ConfigError


def section_class(section: str) -> type:
    # Field types are strings under `from __future__ import annotations`; resolve them.
    return typing.get_type_hints(Config)[section]


def section_types(section_cls: type) -> dict[str, Any]:
    return typing.get_type_hints(section_cls)


def unknown_name_error(kind: str, name: str, valid: list[str], where: str) -> ConfigError:
    hint = difflib.get_close_matches(name, valid, n=1)
    suggestion = f" Did you mean '{hint[0]}'?" if hint else ""
    return ConfigError(f"{where}: unknown {kind} '{name}'.{suggestion} Valid {kind}s: {', '.join(valid)}.")


def _coerce(value: Any, typ: Any, key: str, where: str) -> Any:
    """Convert a value from a string (--set), YAML or JSON into the field's declared type."""

    def fail(expected: str) -> ConfigError:
        return ConfigError(f"{where}: {key} expects {expected}, got {value!r}.")

    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):  # Optional[X]
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        return _coerce(value, args[0], key, where)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        raise fail("a boolean (true/false)")
    if typ is int:
        if isinstance(value, bool):
            raise fail("an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        try:
            return int(str(value))
        except ValueError:
            raise fail("an integer") from None
    if typ is float:
        if isinstance(value, bool):
            raise fail("a number")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise fail("a number") from None
    if typ is str:
        if isinstance(value, (dict, list)):
            raise fail("a string")
        return str(value)
    if origin is tuple:
        (item_type, _ellipsis) = typing.get_args(typ)
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                try:
                    value = json.loads(text)
                except json.JSONDecodeError:
                    raise fail('a list, e.g. a,b,c or ["a","b"]') from None
            else:
                value = [v.strip() for v in text.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise fail("a list")
        return tuple(_coerce(v, item_type, key, where) for v in value)
    raise ConfigError(f"{where}: {key} has unsupported type {typ!r} (a bug in config.py).")


def _apply_section_overrides(section_obj: Any, section: str, values: dict, where: str) -> Any:
    cls = type(section_obj)
    types_ = section_types(cls)
    valid = list(types_)
    changes = {}
    for key, raw in values.items():
        if key not in types_:
            raise unknown_name_error("key", f"{section}.{key}", [f"{section}.{k}" for k in valid], where)
        changes[key] = _coerce(raw, types_[key], f"{section}.{key}", where)
    return dataclasses.replace(section_obj, **changes)


def apply_overrides(config: Config, overrides: dict[str, dict[str, Any]], where: str) -> Config:
    """Layer a {section: {key: value}} mapping onto a config. `where` names the source in errors."""
    changes: dict[str, Any] = {}
    for section, values in overrides.items():
        if section == "preset":
            continue
        if section not in SECTION_NAMES:
            raise unknown_name_error("section", section, list(SECTION_NAMES), where)
        if not isinstance(values, dict):
            raise ConfigError(f"{where}: section '{section}' must be a mapping of key: value.")
        current = changes.get(section, getattr(config, section))
        changes[section] = _apply_section_overrides(current, section, values, where)
    return dataclasses.replace(config, **changes)
