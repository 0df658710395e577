"""Phase 2: teacher traces over the OpenAI-compatible API, verified by execution, resumable.

    python phase2_generate_teacher_traces.py --test_connection      # is the teacher up? thinking on?
    python phase2_generate_teacher_traces.py                        # every training task x num_samples
    python phase2_generate_teacher_traces.py --max_tasks 5 --num_samples 2
    python phase2_generate_teacher_traces.py --teacher references   # no server: the tasks' own verified solutions

The teacher is `vllm serve Qwen/Qwen3-32B-FP8 --port 8129 --reasoning-parser qwen3` on a GPU, or the
local CPU stand-in (`make teacher`). Writes data/teacher_traces.jsonl (one record per sample, see
synthesis/generate_traces.py), data/teacher_traces.stats.json and data/teacher_traces.config.json.
A rerun continues where the last one stopped; --overwrite starts fresh.
Exit codes: 0 every sample answered, 1 every request failed, the server is unusable or a file is bad,
2 bad configuration, 3 some requests failed (their api_error rows are kept; rerun the same command
to ask for exactly those samples again), 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from config import Config, ConfigFlag, check_command_line, phase_command_line, run_phase

FLAGS = (
    ConfigFlag("--max_tasks", "teacher.max_tasks"),
    ConfigFlag("--num_samples", "teacher.num_samples_per_problem"),
    ConfigFlag("--api_url", "teacher.api_url"),
    ConfigFlag("--model", "teacher.model_name"),
    ConfigFlag("--concurrency", "teacher.max_concurrent_requests"),
    ConfigFlag("--max_tokens", "teacher.max_tokens"),
    ConfigFlag("--teacher", "teacher.source"),
    ConfigFlag(
        "--mode",
        "multi_turn.mode",
        "feedback: a failing shown test goes back to the teacher as a user message; tool: the teacher's "
        "<program> blocks run in the sandbox and their <result> is appended to its text, which it continues "
        "(through /v1/completions, with the chat template rendered here from teacher.tokenizer).",
    ),
)


DESCRIPTION = (
    "Phase 2: ask the teacher for <think> reasoning + a python block for every training task, "
    "verify each answer in the sandbox, and append records to data/teacher_traces.jsonl (resumable). "
    "Exit codes: 0 every sample answered; 1 every request failed, the server is unusable or a file is bad; "
    "2 bad configuration; 3 some requests failed (rerun to retry exactly those)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--test_connection",
        action="store_true",
        help="Only check the server: list its models, send one small request, report latency and whether "
        "thinking came back (--mode tool: also load the teacher's tokenizer and send one text completion). "
        "Exit code 0 only if it works.",
    )
    parser.add_argument("--input", help="Task file (default: train.jsonl in paths.data_dir).")
    parser.add_argument("--output", help="Trace file (default: teacher_traces.jsonl in paths.data_dir).")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="Start a fresh trace file instead of resuming (the old "
        "one is replaced when the first good answer arrives).",
    )


# --help and argument mistakes are answered before the heavy imports below (torch: seconds, more on a busy machine)
if __name__ == "__main__":
    check_command_line(DESCRIPTION, FLAGS, add_arguments)

from clients.openai_compat import TeacherClient, TeacherFatalError
from environments.code_env import make_environment
from sandbox.executor import SandboxPool
from synthesis.generate_traces import TextPrompter, TraceFileBusy, generate_traces, load_teacher_examples
from synthesis.reference_traces import REFERENCE_TEACHER, MixedTraceFile, write_reference_traces
from training.checkpointing import save_config
from utils.dataset_loader import DataFormatError, dataset_name_note, read_tasks, require_tasks
from utils.disk import DiskFullError
from utils.jsonl import write_json_atomic
from utils.prompts import PROGRAM_CLOSE, build_chat_messages, get_unified_prompt
from utils.sft_data import build_sft_example, teacher_sft_ids
from utils.student_model import ModelLoadError, load_tokenizer, served_model_name
from utils.thinking_extraction import extract_thinking_and_code_unified

EXIT_SOME_FAILED = 3


async def test_connection(config: Config) -> int:
    model = served_model_name(config.teacher.model_name, config.paths.model_cache_dir)
    async with TeacherClient.from_config(config.teacher, model=model, max_retries=1) as client:
        print(f"Teacher: {client.base_url}  model: {model}")
        prompt = get_unified_prompt("Write a Python function add(a, b) that returns a + b.")
        try:
            served, response = await client.probe(build_chat_messages(prompt))
        except TeacherFatalError as exc:
            print(f"✗ {exc}")
            return 1
        print(f"Served models: {', '.join(served) if served else '(the server lists none)'}")
        if not response.ok:
            print(f"✗ request failed: {response.error}")
            return 1
        parsed = extract_thinking_and_code_unified(response.text, response.reasoning)
        where = (
            "separate reasoning field" if response.reasoning else "inline <think>" if parsed.has_thinking else "none"
        )
        print(
            f"✓ answered in {response.latency:.2f} s, {response.usage.get('completion_tokens', '?')} tokens, "
            f"finish_reason={response.finish_reason}"
        )
        print(f"  thinking came back: {parsed.has_thinking} ({where}); code extracted: {parsed.has_code}")
        if config.multi_turn.mode == "tool":  # tool mode also needs the tokenizer and the text completions endpoint
            try:
                prompter = teacher_prompter(config)
            except ModelLoadError as exc:
                print(f"✗ {exc}")
                return 1
            text = await client.complete_text(prompter.render(build_chat_messages(prompt)), [PROGRAM_CLOSE], 16)
            if not text.ok:
                print(f"✗ /completions (tool mode continues the teacher's text there) failed: {text.error}")
                return 1
            print(f"✓ tool mode: chat template rendered here, /completions answered in {text.latency:.2f} s")
        return 0


# Settings that change what a trace looks like: records made with different values must not share a file.
SAMPLING_KEYS = ("model_name", "temperature", "top_p", "presence_penalty", "enable_thinking", "max_tokens")


class TraceSettingsChanged(ValueError):  # noqa: N818 - a refusal to resume, named for the situation
    """A resume with sampling settings other than those the existing trace file was made with."""


def check_resume_settings(config: Config, output_path: Path, saved_config_path: Path) -> None:
    """Refuse to append to a trace file made with other sampling settings (its saved config says which)."""
    if not output_path.is_file() or output_path.stat().st_size == 0 or not saved_config_path.is_file():
        return
    try:
        saved = json.loads(saved_config_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return
    old_teacher, old_prompt = saved.get("teacher", {}), saved.get("prompt", {})
    changed = [
        f"teacher.{key} {old_teacher[key]!r} -> {getattr(config.teacher, key)!r}"
        for key in SAMPLING_KEYS
        if key in old_teacher and old_teacher[key] != getattr(config.teacher, key)
    ]
    old_mode = saved.get("multi_turn", {}).get("mode", "single")
    if old_mode != config.multi_turn.mode:
        changed.append(f"multi_turn.mode {old_mode!r} -> {config.multi_turn.mode!r}")
    if "num_visible_tests" in old_prompt and old_prompt["num_visible_tests"] != config.prompt.num_visible_tests:
        changed.append(
            f"prompt.num_visible_tests {old_prompt['num_visible_tests']!r} -> {config.prompt.num_visible_tests!r}"
        )
    if changed:
        raise TraceSettingsChanged(
            f"{output_path} was generated with other settings ({'; '.join(changed)}); appending would mix two kinds of "
            "traces in one file. Rerun with the old settings, start the file afresh with --overwrite, or write a new "
            "file with --output."
        )


def unserved_model(served: list[str], model: str, configured: str, base_url: str) -> str:
    """The refusal when the server lists models and `model` (the name sent; `configured` is
    teacher.model_name) is not one of them, else "". A server that lists none is asked as it is."""
    if not served or model in served or any(s.startswith(model) for s in served):
        return ""
    which = f"only {served[0]!r}" if len(served) == 1 else ", ".join(repr(s) for s in served)
    fix = f"--model {served[0]}" if len(served) == 1 else "--model with one of them"
    named = f" (teacher.model_name {configured!r})" if configured != model else ""
    return (
        f"the teacher at {base_url} serves {which}, not {model!r}{named}; its answers would be recorded under "
        f"a teacher that did not write them. Pass {fix}, or serve the model under that name (vllm serve "
        f"--served-model-name)."
    )


def teacher_sft_fit(config: Config, output_path: Path, task_ids: set[str]) -> dict | None:
    """How many of the file's traces usable for teacher-SFT do not fit `dual_source.sft_max_length` with the
    student's tokenizer (phase 3 leaves those out, never cuts them). None when the tokenizer cannot load; no
    tokenizer is loaded when no trace is usable."""
    d = config.dual_source
    usable = load_teacher_examples(output_path, task_ids, d.teacher_sft_only_passed)
    if not usable:
        return {"usable": 0, "too_long": 0, "sft_max_length": d.sft_max_length}
    print(
        f"counting the {len(usable)} usable traces that fit dual_source.sft_max_length={d.sft_max_length} "
        f"(loading the student's tokenizer, {config.student.model_name})...",
        flush=True,
    )
    try:
        tokenizer = load_tokenizer(config.student.model_name, config.paths.model_cache_dir)
    except (ModelLoadError, OSError) as error:
        print(f"note: cannot count traces too long for teacher-SFT ({str(error).splitlines()[0]})", file=sys.stderr)
        return None
    template = config.student.chat_template_kwargs
    too_long = sum(
        build_sft_example(*teacher_sft_ids(tokenizer, t, d.include_thinking, template), d.sft_max_length) is None
        for t in usable
    )
    return {"usable": len(usable), "too_long": too_long, "sft_max_length": d.sft_max_length}


def main(
    config: Config, input_path: Path | None = None, output_path: Path | None = None, overwrite: bool = False
) -> dict:
    """Generate the missing traces of `input_path`'s tasks (default: the config's train file) into `output_path`
    (default: the config's trace file); returns the run's statistics, as written to `<output>.stats.json`.

    Raises TeacherFatalError (the server is unusable), ModelLoadError (tool mode: no teacher tokenizer),
    DataFormatError, TraceFileBusy, TraceSettingsChanged. Failed requests do not raise: they are counted
    (`api_errors`) and kept as api_error rows for the next run. With teacher.source=references no server is
    asked: the tasks' reference solutions are verified in the sandbox instead (`reference_main`).
    """
    note, refuse = dataset_name_note(config.data.dataset_name, Path(input_path or config.paths.train_file))
    if refuse:  # TRL's habit: the dataset in the config; phase 1 turns it into the task file read here
        raise DataFormatError(note)
    if note:
        print(note, flush=True)
    if config.teacher.source == "references":
        return reference_main(
            config, input_path or config.paths.train_file, output_path or config.paths.teacher_traces_file, overwrite
        )
    return asyncio.run(
        generate_all(
            config,
            input_path or config.paths.train_file,
            output_path or config.paths.teacher_traces_file,
            overwrite,
        )
    )


async def generate_all(config: Config, input_path: Path, output_path: Path, overwrite: bool) -> dict:
    tasks = read_tasks(input_path)
    task_ids = {t.task_id for t in tasks}  # phase 3 trains on every task of the file
    if config.teacher.max_tasks > 0:
        tasks = tasks[: config.teacher.max_tasks]
    tasks = require_tasks(tasks, input_path, len(task_ids))
    model = served_model_name(config.teacher.model_name, config.paths.model_cache_dir)
    n = config.teacher.num_samples_per_problem
    config_path = output_path.with_suffix(".config.json")
    if not overwrite:
        check_resume_settings(config, output_path, config_path)
        save_config(config, config_path)
    print(
        f"{len(tasks)} tasks x {n} samples from {input_path} -> {output_path}; "
        f"teacher {model} at {config.teacher.base_url}"
    )
    mode = config.multi_turn.mode
    prompter = teacher_prompter(config) if mode == "tool" else None
    async with TeacherClient.from_config(config.teacher, model=model) as client:
        served = await client.list_models()  # fails fast and clearly when no server answers
        refusal = unserved_model(served, model, config.teacher.model_name, client.base_url)
        if refusal:  # a server that answers any name would have its traces recorded under ours
            raise TeacherFatalError(refusal)
        with SandboxPool.from_config(config.sandbox, secret_paths=[input_path]) as pool:
            environment = (
                make_environment(mode, pool, config.multi_turn, config.prompt.num_visible_tests)
                if mode != "single"
                else None
            )
            stats = await generate_traces(
                tasks,
                client,
                output_path,
                num_samples=n,
                pool=pool,
                num_visible_tests=config.prompt.num_visible_tests,
                overwrite=overwrite,
                teacher_model=config.teacher.model_name,
                on_fresh_start=lambda: save_config(config, config_path),
                mode=mode,
                environment=environment,
                prompter=prompter,
                tool_budget=config.teacher.max_tokens,
            )
    print("\n" + "=" * 50 + "\nTeacher trace statistics (this run)\n" + "=" * 50)
    print(stats.table())
    print(f"elapsed: {stats.elapsed_s:.1f} s")
    payload = {
        **stats.to_dict(),
        "teacher_sft_fit": None,
        "output": str(output_path),
        "teacher_model": config.teacher.model_name,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    return finish_stats(config, output_path, task_ids, payload)


def finish_stats(config: Config, output_path: Path, task_ids: set[str], payload: dict) -> dict:
    """Write the run's statistics, then count the traces that fit teacher-SFT (the student's tokenizer loads
    only when some trace is usable) and write them again with that count."""
    stats_path = output_path.with_suffix(".stats.json")
    write_json_atomic(stats_path, payload)  # the run's record first: the count below may take a while
    fit = teacher_sft_fit(config, output_path, task_ids)
    if fit is not None:
        print(
            f"teacher-SFT: {fit['too_long']} of {fit['usable']} usable traces in the file do not fit "
            f"dual_source.sft_max_length={fit['sft_max_length']} (phase 3 leaves them out)"
        )
        payload = {**payload, "teacher_sft_fit": fit}
        write_json_atomic(stats_path, payload)
    print(f"\nWrote {output_path} and {stats_path}")
    return payload


def reference_main(config: Config, input_path: Path, output_path: Path, overwrite: bool) -> dict:
    """teacher.source=references: every task's reference solutions (up to num_samples_per_problem), run against
    its tests in the sandbox; the passing ones become trace records, the failing ones are dropped. Returns the
    statistics as written to `<output>.stats.json` (with the zero counters `exit_status` reads)."""
    tasks = read_tasks(input_path)
    task_ids = {t.task_id for t in tasks}
    if config.teacher.max_tasks > 0:
        tasks = tasks[: config.teacher.max_tasks]
    tasks = require_tasks(tasks, input_path, len(task_ids))
    n = config.teacher.num_samples_per_problem
    print(
        f"{len(tasks)} tasks x up to {n} reference solutions from {input_path} -> {output_path}; "
        f"each verified in the sandbox, thinking: {config.teacher.reference_thinking}"
    )
    start = time.monotonic()
    with SandboxPool.from_config(config.sandbox, secret_paths=[input_path]) as pool:
        stats = write_reference_traces(
            tasks,
            output_path,
            n,
            pool=pool,
            visible_tests=config.prompt.num_visible_tests,
            thinking_mode=config.teacher.reference_thinking,
            overwrite=overwrite,
        )
    save_config(config, output_path.with_suffix(".config.json"))
    print("\n" + "=" * 50 + "\nReference teacher statistics (this run)\n" + "=" * 50)
    print(stats.table())
    if stats.dropped_examples:
        print("dropped (failed their tests): " + ", ".join(stats.dropped_examples))
    payload = {
        **stats.to_dict(),
        "total": stats.candidates,
        "api_errors": 0,
        "errors": {},
        "kept_old_file": False,
        "elapsed_s": round(time.monotonic() - start, 2),
        "teacher_sft_fit": None,
        "output": str(output_path),
        "teacher_model": REFERENCE_TEACHER,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    return finish_stats(config, output_path, task_ids, payload)


def teacher_prompter(config: Config) -> TextPrompter:
    """Tool mode renders the teacher's chat prompt here and continues its text through /v1/completions, so it
    needs the teacher's tokenizer: teacher.tokenizer, else teacher.model_name (a hub name downloads only the
    tokenizer files; an embedded name resolves to its folder). ModelLoadError says what to set."""
    name = config.teacher.tokenizer_name
    try:
        tokenizer = load_tokenizer(name, config.paths.model_cache_dir)
    except (ModelLoadError, OSError) as error:
        raise ModelLoadError(
            f"--mode tool renders the teacher's chat template locally and could not load its tokenizer {name!r}: "
            f"{str(error).splitlines()[0]}\nSet teacher.tokenizer (--set teacher.tokenizer=NAME_OR_FOLDER) to the "
            "served model's tokenizer."
        ) from None
    return TextPrompter(tokenizer, config.teacher.chat_template_kwargs)


def exit_status(result: dict) -> int:
    """The exit code of a finished run (`main`'s result), saying on stderr why it is not 0."""
    first = next(iter(result["errors"]), "unknown")
    if result["kept_old_file"]:
        print(f"--overwrite: no request succeeded, so {result['output']} was left as it was.", file=sys.stderr)
    if result["total"] and result["api_errors"] == result["total"]:
        print(f"error: every request failed (first error: {first})", file=sys.stderr)
        return 1
    if result["api_errors"]:
        print(
            f"error: {result['api_errors']} of {result['total']} requests failed (first error: {first}); rerun the "
            "same command to retry them (exit code 3).",
            file=sys.stderr,
        )
        return EXIT_SOME_FAILED
    return 0


def cli(argv: list[str] | None = None) -> int:
    args, config = phase_command_line(DESCRIPTION, FLAGS, argv, add_arguments)
    if args.test_connection:
        return asyncio.run(test_connection(config))
    input_file, output_file = Path(args.input) if args.input else None, Path(args.output) if args.output else None
    return run_phase(
        lambda: main(config, input_file, output_file, args.overwrite),
        (
            TeacherFatalError,
            DataFormatError,
            TraceFileBusy,
            TraceSettingsChanged,
            ModelLoadError,
            MixedTraceFile,
            DiskFullError,
        ),
        "finished samples are saved; rerun the same command to continue.",
        exit_status,
        writes=str(output_file or config.paths.teacher_traces_file),
    )


if __name__ == "__main__":
    sys.exit(cli())
