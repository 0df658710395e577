"""Try a model on one problem: `python -m evaluation.solve "Write a function add(a, b)..." [--assert ...]`

Shows the thinking, the extracted code and, when tests are given, the sandbox verdict; in a multi-turn
`--mode` (tool, feedback) also every turn and what the environment inserted after it. The quick look
a user wants after training: `--model_path outputs/final_model` (default) or any checkpoint or base model.
It samples with phase 4's sampler (`evaluation.backend`: the cpu preset's kv sampler; hf where that is vLLM, whose
engine would take longer to start than one answer takes) and first says what it loads and how it samples.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from config import Config, ConfigError, add_config_arguments, config_from_args, exit_on_config_error

if TYPE_CHECKING:
    from rollouts.completion import RolloutCompletion
    from sandbox.executor import ExecutionResult
    from utils.dataset_loader import Task
    from utils.thinking_extraction import ParsedResponse


@dataclass(frozen=True)
class Answer:
    """One sampled answer: the rollout record, its parse and (with tests) the sandbox's verdict."""

    sample: RolloutCompletion  # multi-turn: with its turns (`sample.multi_turn`)
    parsed: ParsedResponse
    verdict: ExecutionResult | None


def solve_task(problem: str, asserts: Sequence[str]) -> Task | None:
    """The task of `--assert` tests (None without tests). Raises TaskSchemaError for a test that cannot fail."""
    from utils.dataset_loader import Task, entry_point_from_asserts

    if not asserts:
        return None
    return Task(
        task_id="solve/1",
        source="solve",
        problem=problem,
        test_type="assert",
        tests=tuple(asserts),
        fn_name=entry_point_from_asserts(list(asserts)),
    )


def unjudged(problem: str) -> Task:
    """The task of a problem without `--assert` tests, for an environment: nothing is shown, nothing to test."""
    from utils.dataset_loader import Task

    return Task(
        task_id="solve/1", source="solve", problem=problem, test_type="stdin", tests=({"input": "", "output": ""},)
    )


def main(
    config: Config,
    problem: str,
    model_path: str | None = None,
    asserts: Sequence[str] = (),
    samples: int = 1,
    temperature: float = 0.0,
    max_new_tokens: int = 512,
    mode: str | None = None,
) -> list[Answer]:
    """Sample `samples` answers to `problem` and judge them on `asserts`. Raises TaskSchemaError (a bad assert,
    before the model loads: a test that cannot fail must not print "passed") and ModelLoadError."""
    from rollouts.from_config import build_sampler, episodes_for
    from rollouts.groups import sample_groups
    from rollouts.models import default_model_path, resolve_model
    from sandbox.executor import SandboxPool, execute_program
    from utils.prompts import get_unified_prompt
    from utils.student_model import load_adapter, load_student
    from utils.thinking_extraction import extract_thinking_and_code_unified

    task = solve_task(problem, asserts)
    base, adapter = resolve_model(model_path or str(default_model_path(config)), config)
    # the preset's sampler (the cpu preset's kv sampler is ~3x transformers generate); a vLLM engine would take
    # longer to start than one answer takes, so vllm falls back to hf here
    backend = "hf" if config.evaluation_backend in ("vllm", "vllm_server") else config.evaluation_backend
    print(
        f"loading {base}"
        + (f" with the adapter {adapter}" if adapter is not None else " (no adapter: the base model)")
        + f"; sampling with the {backend} sampler",
        flush=True,
    )
    model, tokenizer = load_student(
        base, config.student.torch_dtype, config.student.load_in_8bit, config.paths.model_cache_dir
    )
    if adapter is not None:
        model = load_adapter(model, adapter)
    mode = mode or config.multi_turn.mode
    prompt = get_unified_prompt(task if task else problem, config.prompt.num_visible_tests, mode=mode)
    # the flags stand in for the evaluation section's; the one transformers model loaded here is what samples
    ev = dataclasses.replace(
        config.evaluation, backend=backend, temperature=temperature, max_new_tokens=max_new_tokens, num_samples=1
    )
    config = dataclasses.replace(config, evaluation=ev, multi_turn=dataclasses.replace(config.multi_turn, mode=mode))
    sampler = build_sampler(config, purpose="eval", tokenizer=tokenizer)
    # one pool runs the episodes' programs (a multi-turn mode) and judges the answers
    with SandboxPool.from_config(config.sandbox, workers=2) as pool:
        episodes = episodes_for(config, pool, max_new_tokens=max_new_tokens)
        what = f"{samples} answer{'s' if samples != 1 else ''}, up to {max_new_tokens} tokens each"
        with progress(f"generating {what}", "generating"):
            [records] = sample_groups(
                sampler, model, [prompt], samples, tasks=[task or unjudged(problem)], episodes=episodes
            )
        if task is not None:
            print(f"judging {len(records)} answer{'s' if len(records) != 1 else ''} in the sandbox...", flush=True)
        answers = []
        for record in records:
            parsed = extract_thinking_and_code_unified(record.text, entry_point=task.fn_name if task else None)
            verdict = execute_program(parsed.code, task, pool=pool) if task is not None else None
            answers.append(Answer(record, parsed, verdict))
    return answers


HEARTBEAT_S = 15.0  # seconds between "still generating" lines: a long wait never looks like a hang


@contextlib.contextmanager
def progress(start: str, doing: str) -> Iterator[None]:
    """Print `start`, then "... still {doing} (N s)" every HEARTBEAT_S seconds until the block ends, then its
    time. The sampler generates the whole answer in one call, so elapsed time is the progress there is to show."""
    began = time.monotonic()
    print(f"{start}...", flush=True)
    done = threading.Event()

    def beat() -> None:
        while not done.wait(HEARTBEAT_S):
            print(f"... still {doing} ({time.monotonic() - began:.0f} s)", flush=True)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
    print(f"{doing} took {time.monotonic() - began:.1f} s", flush=True)


def format_answer(answer: Answer, number: int, total: int) -> str:
    """What the command prints for one answer: its turns, thinking, code and verdict."""
    sample, parsed, lines = answer.sample, answer.parsed, []
    info = sample.multi_turn
    lines.append(f"\n===== answer {number}/{total} ({sample.num_tokens} tokens, {sample.finish_reason}) =====")
    for turn_number, turn in enumerate(info.turns if info is not None else (), start=1):
        lines.append(f"--- turn {turn_number} ({turn['finish_reason']}) ---\n{turn['text']}")
        inserted = turn.get("observation") or turn.get("feedback")
        if inserted:
            lines.append(
                f"--- inserted by the {'tool' if turn.get('observation') else 'feedback'} environment ---\n"
                + inserted.strip("\n")
            )
    if info is not None and info.turns:
        lines.append(
            f"--- {info.num_turns} turns, {info.tool_calls} tool calls"
            + (", truncated by a limit" if info.truncated else "")
            + " ---"
        )
    lines.append("--- thinking ---\n" + (parsed.thinking or "(none)"))
    lines.append("--- code ---\n" + (parsed.code or "(no code found)"))
    if not parsed.code and not (info is not None and info.turns):  # what the model wrote instead of code
        lines.append("--- the model's text ---\n" + (sample.text.strip() or "(empty)"))
    if answer.verdict is not None:
        result = answer.verdict
        lines.append(
            f"--- verdict: {result.status} ({result.tests_passed}/{result.tests_total} tests)"
            + (f": {result.error}" if result.error else "")
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problem", help="The problem statement.")
    parser.add_argument(
        "--model_path",
        help="Adapter, checkpoint-* folder or base model (default: final_model in the "
        "resolved paths.output_dir, e.g. outputs/final_model).",
    )
    parser.add_argument(
        "--assert",
        dest="asserts",
        action="append",
        default=[],
        help="An MBPP-style test, e.g. --assert 'assert add(1, 2) == 3' (repeatable; the first is shown "
        "in the prompt, like phase 4 does).",
    )
    parser.add_argument("--samples", type=int, default=1, help="How many answers to sample (default 1).")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default).")
    parser.add_argument(
        "--max_new_tokens", type=int, default=512, help="Token budget per answer (per turn in a multi-turn mode)."
    )
    parser.add_argument(
        "--mode",
        choices=("single", "tool", "feedback"),
        help="single, tool (the model may run <program> blocks) or feedback (a failing shown --assert "
        "comes back and the model answers again); default: multi_turn.mode of the config.",
    )
    add_config_arguments(parser)
    return parser.parse_args(argv)


def cli(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as error:
        exit_on_config_error(error)
    from utils.dataset_loader import TaskSchemaError
    from utils.student_model import ModelLoadError

    try:
        answers = main(
            config,
            args.problem,
            args.model_path,
            args.asserts,
            args.samples,
            args.temperature,
            args.max_new_tokens,
            args.mode,
        )
    except TaskSchemaError as error:
        print(f"error: --assert: {error}.", file=sys.stderr)
        return 2
    except ModelLoadError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for number, answer in enumerate(answers, start=1):
        print(format_answer(answer, number, len(answers)))
    return 0


if __name__ == "__main__":
    sys.exit(cli())
