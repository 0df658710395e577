"""Phase 4's run as a whole: the key each role's completion cache is filed under, the results record
(`outputs/evaluation_results.json`, its keys in ARCHITECTURE.md) and the report printed from it.

It reads the whole `Config`: a cache key depends on the student, the backend, the evaluation and multi-turn
settings, and the record carries the resolved config.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from config import Config, config_to_dict
from evaluation.eval_sets import EvalSet
from evaluation.evaluate import (
    EvalSample,
    content_digest,
    decoding_label,
    delta,
    delta_intervals,
    fingerprint,
    format_delta,
    format_multi_turn,
    format_table,
)
from rollouts.sampling import SamplingSettings
from sandbox.executor import untrusted_task_ids
from utils.dataset_loader import Task
from utils.shown_tests import no_hidden_test_ids
from utils.student_model import resolve_model_path


def base_model_key(name: str, model_cache_dir: str, memo: Path) -> str:
    """What a cache key names a base model by: the content digest (`content_digest`, per-file hashes memoized in
    `memo`) of the folder its files are in (a local path, an embedded model's materialized folder, or the hub
    cache's snapshot: after loading, it is there), else its name."""
    local = Path(resolve_model_path(name, model_cache_dir))
    if not local.is_dir():
        try:
            from huggingface_hub import snapshot_download

            local = Path(snapshot_download(name, local_files_only=True))
        except Exception:  # noqa: BLE001 - not a hub id, or not cached: the key falls back to the name
            return name
    return content_digest(local, memo)


def completion_cache_key(config: Config, *, visible_tests: int, base: str, adapter: str | None) -> str:
    """The name of one role's completion cache (`eval_cache/<key>.jsonl`): the base model's content digest (or
    its name when no folder holds it), the adapter's (None: no adapter), and every setting that changes what is
    sampled. Knobs that truncate enter only when set, and the multi-turn section only outside single mode, so
    caches written before those settings existed keep their key."""
    ev = config.evaluation
    kv = config.evaluation_backend == "kv"
    settings: dict[str, Any] = {
        **SamplingSettings.from_section(ev).truncating(),
        "temperature": ev.temperature,
        "top_p": ev.top_p,
        "max_new_tokens": ev.max_new_tokens,
        "visible_tests": visible_tests,
        "thinking": config.student.enable_thinking,
        "backend": config.evaluation_backend,
        **({"sampler_dtype": config.grpo.sampler_dtype} if kv else {}),
        "dtype": config.student.torch_dtype,
        "load_in_8bit": config.student.load_in_8bit,
    }
    if config.multi_turn.mode != "single":
        settings["multi_turn"] = config_to_dict(config)["multi_turn"]
    return fingerprint(base=base, adapter=adapter, **settings)


def results_record(
    config: Config,
    *,
    model_path: str,
    base_name: str,
    adapter: Path | None,
    eval_set: EvalSet,
    tasks: Sequence[Task],
    summaries: dict[str, dict],
    rows: Sequence[EvalSample],
    timestamp: str,
    provenance: dict,
) -> dict:
    """The results record. `summaries`: each evaluated role's `summarize`, the reported role first ("trained" or
    "model"), then "baseline" when it ran; `rows`: every judged sample, its `model` field naming its role."""
    ev = config.evaluation
    main_role = next(iter(summaries))
    main, baseline = summaries[main_role], summaries.get("baseline")
    rows_of = {role: [r for r in rows if r.model == role] for role in summaries}
    return {
        "model": {"path": model_path, "base_model": base_name, "adapter": str(adapter) if adapter else None},
        "timestamp": timestamp,
        "eval_file": eval_set.origin,
        "eval_set": {**eval_set.label(), "num_tasks": len(tasks), "complete": len(tasks) == len(eval_set.tasks)},
        "decoding": decoding_label(ev.temperature, ev.top_p, ev.num_samples),
        "samples": {"per_task": ev.num_samples, "total": len(tasks) * ev.num_samples},
        # tasks with a test only the program's own process can judge (a forgeable verdict, counted as
        # judged there; the training rewards give such results no signal)
        "untrusted_tasks": untrusted_task_ids(list(tasks), config.sandbox.include_challenge_tests),
        # tasks whose prompt shows every test: a pass there may be the printed examples, not a solution
        "no_hidden_test_tasks": no_hidden_test_ids(tasks, eval_set.visible_tests),
        "config": config_to_dict(config),
        "provenance": provenance,
        **main,
        "baseline": baseline,
        "delta": delta(main, baseline) if baseline is not None else None,
        "delta_ci95": delta_intervals(
            rows_of[main_role], rows_of["baseline"], ev.k_values, ev.bootstrap_resamples, ev.bootstrap_seed
        )
        if baseline is not None
        else None,
    }


def format_report(result: dict) -> str:
    """What phase 4 prints from its results record: the pass@k table (with the multi-turn lines), the baseline's
    table and the paired delta when it ran, format statistics, strict against lenient pass@1, and the tasks whose
    verdicts are weak evidence."""
    where = f"{result['eval_set']['name']}, {result['eval_set']['num_tasks']} tasks, {result['decoding']}"
    lines = [format_table(result, f"Pass@k Results ({where})")]
    if result.get("multi_turn"):
        lines.append(format_multi_turn(result))
    if result["baseline"] is not None:
        lines.append(format_table(result["baseline"], f"Baseline (adapter disabled): {where}"))
        lines.append(format_delta(result["delta"], result["delta_ci95"]))
    fmt = result["format"]
    lines.append(
        f"format: closed thinking {fmt['closed_thinking']:.1%}, code {fmt['extractable_code']:.1%} (no code "
        f"{fmt['no_code']:.1%}), valid Python {fmt['valid_python']:.1%}; mean completion tokens "
        f"{result['mean_completion_tokens']:.0f}"
        + (f"; ended by the token budget {fmt['truncated']:.1%}" if "truncated" in fmt else "")
    )
    strict_1, lenient_1 = result["pass_at_k"].get("1"), result["pass_at_k_lenient"].get("1")
    if strict_1 is not None and lenient_1 is not None:
        lines.append(f"pass@1 strict {strict_1:.4f}, lenient {lenient_1:.4f} (code inside an unclosed <think> counted)")
    sanitized_1 = result.get("pass_at_k_sanitized", {}).get("1")
    if strict_1 is not None and sanitized_1 is not None:
        lines.append(
            f"pass@1 strict {strict_1:.4f}, sanitized {sanitized_1:.4f} (EvalPlus-style: the entry point and the "
            "definitions it uses, top-level calls, asserts and prints dropped)"
        )
    if result["untrusted_tasks"]:
        lines.append(
            f"{len(result['untrusted_tasks'])} tasks have a test judged inside the program's process (untrusted_tasks)"
        )
    if result["no_hidden_test_tasks"]:
        lines.append(
            f"{len(result['no_hidden_test_tasks'])} tasks show every test in the prompt (no_hidden_test_tasks): "
            "a pass there is no evidence of solving"
        )
    return "\n".join(lines)
