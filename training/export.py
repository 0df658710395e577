"""Export a trained adapter for serving: merge it into a standalone model folder and print the `vllm serve` lines.

    python -m training.export                                        # outputs/final_model -> outputs/merged_model
    python -m training.export --model_path outputs/checkpoint-100 --output_dir my-coder
    python -m training.export --push_to_hub my-org/my-coder          # also upload the merged folder
    python -m training.export --no_merge --push_to_hub my-org/my-lora  # upload the adapter folder instead

The exported folder (the merged one, or with --no_merge the adapter) gets a model card (README.md) and
provenance.json: base model hub id, data, config, commit, package versions, command line, and the pass@k
with 95% intervals of evaluation_results.json in paths.output_dir when that evaluated this adapter.

The merged folder (weights with the LoRA update folded in, tokenizer with its chat template,
generation config) loads with plain `AutoModelForCausalLM.from_pretrained` and serves with
`vllm serve FOLDER`. Serving base + adapter instead needs `--enable-lora` and a `--max-lora-rank` at
least the adapter's rank: vLLM accepts only a few values and defaults to 16, which rejects the gpu
preset's r=64, so the printed line carries the right one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollouts.models import adapter_rank
from rollouts.vllm_engine import VLLM_LORA_RANKS, vllm_lora_rank
from utils.provenance import build_provenance, write_model_card

if TYPE_CHECKING:
    from config import Config


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds an adapter of this rank (vLLM's default is 16)."""
    try:
        return vllm_lora_rank(rank)
    except ValueError:
        raise ValueError(
            f"LoRA rank {rank} is above vLLM's largest --max-lora-rank ({VLLM_LORA_RANKS[-1]}); serve the "
            "merged model instead."
        ) from None


def serve_commands(base_model: str, adapter: Path | None, merged: Path | None, name: str = "tgrpo") -> list[str]:
    """The `vllm serve` lines for the merged folder and for base + adapter (phase 2/4's reasoning parser added)."""
    lines = []
    if merged is not None:
        lines.append(f"vllm serve {merged} --served-model-name {name}")
    if adapter is not None:
        lines.append(
            f"vllm serve {base_model} --enable-lora --lora-modules {name}={adapter} "
            f"--max-lora-rank {vllm_max_lora_rank(adapter_rank(adapter))}"
        )
    return lines


def merge_adapter(
    base_model: str, adapter: Path, output_dir: Path, torch_dtype: str = "bfloat16", cache_dir: str = ""
) -> Path:
    """Fold the adapter into the base weights and save a standalone model folder (atomically: temp, then rename)."""
    import shutil

    from utils.jsonl import replace_folder
    from utils.student_model import load_adapter, load_student

    model, tokenizer = load_student(base_model, torch_dtype, False, cache_dir, device="cpu")
    merged: Any = load_adapter(model, adapter).merge_and_unload()
    output_dir = Path(output_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = output_dir.with_name(f".{output_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    merged.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    return replace_folder(tmp, output_dir)


def evaluation_results(output_dir: Path, adapter: Path) -> dict[str, Any] | None:
    """`evaluation_results.json` in `output_dir` when it evaluated this adapter (its pass@k go in the card)."""
    path = output_dir / "evaluation_results.json"
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    evaluated = (results.get("model") or {}).get("adapter") if isinstance(results, dict) else None
    if not evaluated or Path(evaluated).resolve() != Path(adapter).resolve():
        return None
    return results


def push_folder(folder: Path, repo_id: str) -> str:
    """Upload `folder` to the hub repository `repo_id` (created when missing) and say where it went. Returns ""
    on success, else the error's type and first line: the caller says what the folder is and how to retry."""
    from huggingface_hub import HfApi

    try:
        api = HfApi()
        api.create_repo(repo_id, exist_ok=True)
        api.upload_folder(folder_path=str(folder), repo_id=repo_id)
    except Exception as error:  # noqa: BLE001 - network, auth, offline mode: many unrelated types
        first = (str(error).strip().splitlines() or [""])[0][:200]
        return f"{type(error).__name__}: {first}"
    print(f"pushed to https://huggingface.co/{repo_id}")
    return ""


def main(
    config: Config,
    model_path: str | None = None,
    output_dir: str | None = None,
    dtype: str | None = None,
    no_merge: bool = False,
    push_to_hub: str | None = None,
) -> int:
    """Merge an adapter into its base (unless `no_merge`), write the model card, optionally push, and print the
    `vllm serve` lines. 0 on success, 1 with one line on stderr otherwise."""
    from rollouts.models import default_model_path, resolve_model
    from utils.student_model import ModelLoadError, resolve_model_path

    try:
        base, adapter = resolve_model(model_path or str(default_model_path(config)), config)
        if adapter is None:
            raise ModelLoadError(f"{model_path} is a base model, not an adapter: there is nothing to export.")
        rank = adapter_rank(adapter)
        vllm_max_lora_rank(rank)  # fails early for a rank vLLM cannot serve
        merged = None
        if not no_merge:
            target = Path(output_dir) if output_dir else Path(config.paths.output_dir) / "merged_model"
            merged = merge_adapter(
                base, adapter, target, dtype or config.student.torch_dtype, config.paths.model_cache_dir
            )
            print(f"merged {adapter} (LoRA r={rank}) into {base}: {merged}")
    except (ModelLoadError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    card_folder = merged if merged is not None else adapter
    write_model_card(
        card_folder,
        build_provenance(config),
        config,
        "merged" if merged is not None else "adapter",
        evaluation_results(Path(config.paths.output_dir), adapter),
    )
    if push_to_hub:
        folder, what = (merged, "merged") if merged is not None else (adapter, "adapter")
        failure = push_folder(folder, push_to_hub)
        if failure:
            print(
                f"error: could not push {folder} to {push_to_hub} ({failure}); the {what} folder is complete, "
                "retry the push later.",
                file=sys.stderr,
            )
            return 1
    print("serve it with one of:")
    for line in serve_commands(resolve_model_path(base, config.paths.model_cache_dir), adapter, merged):
        print(f"  {line}")
    return 0


def cli(argv: list[str] | None = None) -> int:
    from config import ConfigError, add_config_arguments, config_from_args, config_summary, exit_on_config_error

    parser = argparse.ArgumentParser(
        prog="python -m training.export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model_path", help="Adapter or checkpoint-* folder (default: final_model in paths.output_dir)."
    )
    parser.add_argument("--output_dir", help="Where the merged model goes (default: merged_model in paths.output_dir).")
    parser.add_argument(
        "--dtype",
        default=None,
        choices=("float32", "bfloat16", "float16"),
        help="dtype of the merged weights (default: student.torch_dtype).",
    )
    parser.add_argument("--no_merge", action="store_true", help="Only print the `vllm serve` line for base + adapter.")
    parser.add_argument(
        "--push_to_hub",
        metavar="REPO_ID",
        help="Also upload the merged folder (with --no_merge: the adapter folder) to this hub repository "
        "(needs a token: `huggingface-cli login` or HF_TOKEN).",
    )
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as error:
        exit_on_config_error(error)
    print(config_summary(config))
    return main(config, args.model_path, args.output_dir, args.dtype, args.no_merge, args.push_to_hub)


if __name__ == "__main__":
    sys.exit(cli())
