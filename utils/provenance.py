"""Where a trained adapter or a result came from: base model, data, config, commit, package versions and
command line (`build_provenance`), and the model card written beside an adapter or a merged model
(`write_model_card`), filled from it instead of PEFT's blank template."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("torch", "transformers", "peft", "accelerate", "trl", "vllm", "huggingface_hub")
# embedded students (utils/student_model.py) and the hub repository their weights come from
EMBEDDED_HUB_IDS = {"embedded:SmolLM2-135M-Instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}


def base_model_hub_id(model_name: str) -> str | None:
    """The hub id of the student's base model: the name itself for a hub name, the source repository for an
    embedded model that has one, None for a local folder or a random test model."""
    if model_name in EMBEDDED_HUB_IDS:
        return EMBEDDED_HUB_IDS[model_name]
    if model_name.startswith("embedded:") or Path(model_name).exists() or model_name.count("/") != 1:
        return None
    return model_name


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def package_versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def training_tasks(train_file: Path) -> dict[str, Any]:
    """The task file phase 3 read and, from phase 1's `split_manifest.json` beside it, the sources it was split
    from ([] when there is no manifest: a task file of the user's own)."""
    sources: list[str] = []
    try:
        manifest = json.loads((train_file.parent / "split_manifest.json").read_text(encoding="utf-8"))
        sources = [f"{s['source']} ({Path(str(s['origin'])).name})" for s in manifest.get("sources", [])]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return {"train_file": str(train_file), "sources": sources}


def _flag_value(argv: list[str], flag: str) -> str | None:
    for i, token in enumerate(argv):
        if token == flag and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith(flag + "="):
            return token.partition("=")[2]
    return None


def build_provenance(config: Any, argv: list[str] | None = None) -> dict[str, Any]:
    """A JSON-able record of what produced an output. `config` is the resolved Config."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    data = config.data
    train_file = _flag_value(sys.argv[1:] if argv is None else argv, "--train_file") or config.paths.train_file
    return {
        "base_model": config.student.model_name,
        "base_model_hub_id": base_model_hub_id(config.student.model_name),
        "data": {
            "dataset_name": data.dataset_name,
            "dataset_config": data.dataset_config,
            "dataset_split": data.dataset_split,
            "data_dir": config.paths.data_dir,
            **training_tasks(Path(train_file)),
        },
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
        "packages": package_versions(),
        "command_line": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]] if argv is None else argv),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def write_provenance(folder: str | Path, provenance: dict[str, Any]) -> Path:
    path = Path(folder) / "provenance.json"
    path.write_text(json.dumps(provenance, indent=2) + "\n", encoding="utf-8")
    return path


def _results_lines(results: dict[str, Any] | None) -> list[str]:
    if not results or not results.get("pass_at_k"):
        return [
            "Not evaluated when this card was written: run `python phase4_evaluate.py` (its results go to "
            "`evaluation_results.json`), then `python -m training.export` to put them here."
        ]
    eval_set = results.get("eval_set") or {}
    lines = [
        f"On {eval_set.get('name', results.get('eval_file', '?'))} ({results.get('num_tasks', '?')} tasks, "
        f"{results.get('decoding', '')}):",
        "",
        "| k | pass@k | 95% interval |",
        "|---|---|---|",
    ]
    intervals = results.get("pass_at_k_ci95") or {}
    for k, value in results["pass_at_k"].items():
        ci = intervals.get(str(k)) or intervals.get(k)
        shown = f"{value:.3f}" if isinstance(value, (int, float)) else "n/a"
        band = f"{ci[0]:.3f} – {ci[1]:.3f}" if isinstance(ci, (list, tuple)) and len(ci) == 2 else "n/a"
        lines.append(f"| {k} | {shown} | {band} |")
    return lines


def _data_line(data: dict[str, Any]) -> str:
    """What the adapter was trained on: the hub dataset when one is configured, else phase 3's task file and the
    sources phase 1 split it from."""
    if data.get("dataset_name"):
        return (
            f"- dataset: `{data['dataset_name']}`"
            + (f" (config `{data['dataset_config']}`)" if data.get("dataset_config") else "")
            + f", split `{data.get('dataset_split')}`"
        )
    sources = data.get("sources") or []
    line = f"- training tasks: `{data.get('train_file', '?')}`"
    return line + (f", phase 1's training split of {', '.join(sources)}" if sources else "")


def model_card(
    provenance: dict[str, Any], config: Any, kind: str = "adapter", results: dict[str, Any] | None = None
) -> str:
    """README.md for an adapter (`kind='adapter'`) or a merged model folder."""
    hub_id = provenance.get("base_model_hub_id")
    front = ["---", "library_name: " + ("peft" if kind == "adapter" else "transformers")]
    if hub_id:
        front.append(f"base_model: {hub_id}")
    front += ["tags:", "- tgrpo", "- grpo", "- code", "---", ""]
    lora = config.lora
    training = config.training
    body = [
        f"# {'LoRA adapter' if kind == 'adapter' else 'Merged model'} trained with tgrpo",
        "",
        "Teacher-guided GRPO on Python programming tasks, rewarded by running the tests in a sandbox.",
        "",
        "## Base model",
        "",
        f"`{hub_id or provenance.get('base_model')}`" + ("" if hub_id else " (no hub id: a local or test model)"),
        "",
        "## Data",
        "",
        _data_line(provenance["data"]),
        "",
        "## Training",
        "",
        f"- LoRA r={lora.r}, alpha={lora.lora_alpha}, dropout={lora.lora_dropout}, "
        f"modules {', '.join(lora.target_modules)}",
        f"- learning rate {training.learning_rate}, {training.lr_scheduler} schedule, "
        f"{config.grpo.num_samples_per_prompt} samples per prompt, KL coefficient {config.grpo.kl_coef}",
        "- the full resolved config: `tgrpo_config.json` (adapter) or `config.json` in the run's output folder",
        "",
        "## Results (pass@k)",
        "",
        *_results_lines(results),
        "",
        "## Provenance",
        "",
        f"- commit: `{provenance.get('git_commit')}`"
        + (" (with uncommitted changes)" if provenance.get("git_dirty") else ""),
        "- packages: " + ", ".join(f"{k} {v}" for k, v in provenance.get("packages", {}).items()),
        f"- command line: `{provenance.get('command_line')}`",
        f"- written: {provenance.get('created')}",
        "",
        "```json",
        json.dumps(provenance, indent=2),
        "```",
        "",
    ]
    return "\n".join(front + body)


def write_model_card(
    folder: str | Path,
    provenance: dict[str, Any],
    config: Any,
    kind: str = "adapter",
    results: dict[str, Any] | None = None,
) -> Path:
    """Write README.md (replacing PEFT's template) and provenance.json into `folder`."""
    path = Path(folder) / "README.md"
    path.write_text(model_card(provenance, config, kind, results), encoding="utf-8")
    write_provenance(folder, provenance)
    return path
