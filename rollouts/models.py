"""Model resolution: what a `--model_path` (an adapter folder, a `checkpoint-*` folder or a base model)
means to load, for phase 4, `evaluation.solve` and `training.export` alike.
"""

from __future__ import annotations

import json
from pathlib import Path

from config import Config
from utils.student_model import ModelLoadError


def default_model_path(config: Config) -> Path:
    """What phase 3 wrote for this config: `final_model` in the resolved paths.output_dir."""
    return Path(config.paths.output_dir) / "final_model"


def resolve_model(model_path: str, config: Config) -> tuple[str, Path | None]:
    """(base model name, adapter folder or None) for an adapter, a checkpoint-* folder or a base model."""
    path = Path(model_path)
    adapter = (
        path
        if (path / "adapter_config.json").is_file()
        else path / "adapter"
        if (path / "adapter" / "adapter_config.json").is_file()
        else None
    )
    if adapter is None:
        if path.exists() and not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is neither a LoRA adapter, a checkpoint-* folder, nor a model folder.")
        if not path.exists() and (
            path == default_model_path(config)
            or path.name == "final_model"
            or path.name.startswith("checkpoint-")
            or path.parent.name == "outputs"
        ):
            raise ModelLoadError(
                f"no trained adapter at {path}: run phase 3 first (with the same paths.output_dir), "
                "or pass --model_path <base model>."
            )
        return model_path, None
    for saved in (adapter / "tgrpo_config.json", adapter.parent / "config.json"):
        if saved.is_file():
            try:
                return json.loads(saved.read_text())["student"]["model_name"], adapter
            except (KeyError, json.JSONDecodeError):
                pass
    return config.student.model_name, adapter


def adapter_rank(adapter_dir: str | Path) -> int:
    """The largest LoRA rank in a saved adapter (`r`, or a larger per-module `rank_pattern` entry)."""
    path = Path(adapter_dir) / "adapter_config.json"
    try:
        saved = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the adapter's rank ({exc}).") from None
    return max([int(saved["r"]), *map(int, (saved.get("rank_pattern") or {}).values())])
