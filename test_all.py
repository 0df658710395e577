"""Preflight: run this before spending GPU hours.  `python test_all.py [--preset ...]`

It checks, with the same library functions the phases use (nothing is re-implemented here):
  - the unified prompt contains its key elements and the system prompt is set;
  - thinking and code extraction on canned responses in every format a model or server produces;
  - the extracted code is valid Python, and every phase's own path reads model output through the one
    parser: phase 2's trace records, phase 4's judged samples and (with the student) phase 3's rewards;
  - SFT labels mask the prompt and padding and keep every response token;
  - extracted code runs against a task's tests in the sandbox, rewards are computed, and a hostile
    program (an always-equal object plus sys.exit) scores zero;
  - one training step on the student gives finite losses, changes the LoRA weights and leaves the
    base weights unchanged;
  - the student loads and generates, and whether its output already has <think> and a code block
    (a WARN, not a FAIL, for a small untrained model);
  - the teacher-SFT target follows the student: its closed-think rate on a few training prompts at the
    rollout decoding is measured, and the preflight says whether the run uses thinking + code or code-only
    targets and why (a WARN when the configured target does not fit the student);
  - multi-turn rollouts: a scripted tool exchange and a scripted feedback exchange round-trip through
    the loop (program cut at its tag, result inserted, action mask exactly the policy's tokens, hidden
    tests never shown), and a hostile program inside <program> reads nothing, scores nothing and
    leaves nothing behind;
  - the teacher endpoint answers, if one is running (WARN when none is);
  - with on-policy distillation on (dual_source.opd_weight > 0), the teacher (teacher.logprob_source)
    shares the student's tokenizer and answers the log-prob of every token of a short completion.

Each line is `✓ PASS`, `✗ FAIL` (with a hint) or `⚠ WARN`; the exit code is non-zero on any FAIL.
Functions are named check_* so pytest does not collect this file (tests/e2e/test_preflight.py runs it).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from config import (
    Config,
    ConfigError,
    add_config_arguments,
    apply_overrides,
    config_from_args,
    config_summary,
    exit_on_config_error,
    normalize_api_base,
)
from utils.code_parser import check_syntax
from utils.prompts import (
    PYTHON_FENCE,
    SYSTEM_PROMPT_UNIFIED,
    THINK_CLOSE,
    THINK_OPEN,
    build_chat_messages,
    get_unified_prompt,
)
from utils.thinking_extraction import extract_thinking_and_code_unified


@dataclass
class Report:
    """Collects check outcomes and prints them as they happen."""

    results: list[tuple[str, str, str]] = field(default_factory=list)  # (status, message, hint)

    def _add(self, status: str, message: str, hint: str = "") -> None:
        self.results.append((status, message, hint))
        symbol = {"PASS": "✓ PASS", "FAIL": "✗ FAIL", "WARN": "⚠ WARN"}[status]
        print(f"{symbol} {message}" + (f"\n         hint: {hint}" if hint else ""), flush=True)

    def ok(self, message: str) -> None:
        self._add("PASS", message)

    def fail(self, message: str, hint: str) -> None:
        self._add("FAIL", message, hint)

    def warn(self, message: str, hint: str = "") -> None:
        self._add("WARN", message, hint)

    def expect(self, condition: bool, message: str, hint: str) -> bool:
        """PASS if condition holds, else FAIL with the hint."""
        if condition:
            self.ok(message)
        else:
            self.fail(message, hint)
        return condition

    def ok_or_warn(self, condition: bool, pass_message: str, warn_message: str, hint: str) -> None:
        if condition:
            self.ok(pass_message)
        else:
            self.warn(warn_message, hint)

    def count(self, status: str) -> int:
        return sum(1 for s, _, _ in self.results if s == status)


def section(title: str) -> None:
    print(f"\n== {title} ==", flush=True)


# Canned responses in every shape the pipeline meets: (name, response, reasoning field, expected
# code or None, expected has_thinking). Code inside the thinking is a trap: it must never be chosen.
ADD = "def add(a, b):\n    return a + b"
CANNED_RESPONSES: list[tuple[str, str, str | None, str | None, bool]] = [
    ("inline <think> + ```python", f"<think>\nAdd the numbers.\n</think>\n\n```python\n{ADD}\n```", None, ADD, True),
    ("template opened <think> (only </think>)", f"Add them.\n</think>\n\n```python\n{ADD}\n```", None, ADD, True),
    ("reasoning in a separate field", f"```python\n{ADD}\n```", "Add the numbers.", ADD, True),
    (
        "code drafted inside thinking is ignored",
        f"<think>\nDraft:\n```python\ndef add(a, b):\n    return a - b\n```\n</think>\n\n```python\n{ADD}\n```",
        None,
        ADD,
        True,
    ),
    ("truncated inside <think> gives no code", f"<think>\nDraft:\n```python\n{ADD}\n```\nNow check", None, None, True),
    (
        "several blocks: the last python block wins",
        f"```python\nprint(1)\n```\nFinal:\n```python\n{ADD}\n```",
        None,
        ADD,
        False,
    ),
    (
        "CRLF line endings and a `py` tag",
        f"<think>\r\nok\r\n</think>\r\n\r\n```py\r\n{ADD.replace(chr(10), chr(13) + chr(10))}\r\n```",
        None,
        ADD,
        True,
    ),
    ("`Python3` tag", f"```Python3\n{ADD}\n```", None, ADD, False),
    ("untagged fence", f"<think>x</think>\n```\n{ADD}\n```", None, ADD, True),
    ("bare code, no fence, no thinking", ADD, None, ADD, False),
    ("prose only gives no code", "I cannot solve this problem.", None, None, False),
]


def check_prompt_format(report: Report, config: Config) -> None:
    section("Unified prompt")
    mbpp: dict[str, Any] = {
        "task_id": "mbpp/1",
        "source": "mbpp",
        "problem": "Write a function to add two numbers.",
        "test_type": "assert",
        "fn_name": "add",
        "tests": ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(-1, 1) == 0"],
    }
    prompt = get_unified_prompt(mbpp, config.prompt.num_visible_tests)
    report.expect(
        mbpp["problem"] in prompt, "prompt contains the problem text", "utils/prompts.py must include task.problem"
    )
    report.expect(
        THINK_OPEN in prompt and THINK_CLOSE in prompt and PYTHON_FENCE in prompt,
        "prompt shows the <think> … </think> + ```python format",
        "FORMAT_EXAMPLE must be in the prompt",
    )
    shown = sum(t in prompt for t in mbpp["tests"])
    report.expect(
        shown == min(config.prompt.num_visible_tests, 3) and "`add`" in prompt,
        f"MBPP prompt names the function and shows {shown} of 3 asserts (prompt.num_visible_tests="
        f"{config.prompt.num_visible_tests})",
        "hidden tests must stay hidden; see _task_requirements",
    )
    stdin = {"problem": "Read n and print n*2.", "test_type": "stdin", "tests": []}
    report.expect(
        "standard input" in get_unified_prompt(stdin),
        "stdin task prompt says to read standard input",
        "stdin tasks need the I/O convention in the prompt",
    )
    call = {
        "problem": "Reverse.",
        "test_type": "call",
        "fn_name": "rev",
        "starter_code": "\nclass Solution:\n    def rev(self, s):\n        ",
        "tests": [],
    }
    report.expect(
        "class Solution" in get_unified_prompt(call),
        "call-based prompt includes the starter code",
        "call tasks need starter_code in the prompt",
    )
    messages = build_chat_messages(prompt)
    report.expect(
        messages[0] == {"role": "system", "content": SYSTEM_PROMPT_UNIFIED} and THINK_OPEN in SYSTEM_PROMPT_UNIFIED,
        "system prompt is set and asks for <think>",
        "build_chat_messages must send SYSTEM_PROMPT_UNIFIED",
    )


def check_extraction(report: Report) -> None:
    section("Thinking and code extraction (canned responses)")
    for name, response, reasoning, expected_code, expected_thinking in CANNED_RESPONSES:
        parsed = extract_thinking_and_code_unified(response, reasoning)
        good = parsed.code == expected_code and parsed.has_thinking == expected_thinking
        code_len = "none" if parsed.code is None else f"{len(parsed.code)} chars"
        detail = f"code: {code_len}, thinking: {len(parsed.thinking)} chars"
        report.expect(
            good,
            f"{name} ({detail})",
            f"expected code={expected_code!r}, has_thinking={expected_thinking}; got {parsed.code!r}, "
            f"{parsed.has_thinking}. See the rules in utils/thinking_extraction.py",
        )

    invalid = [
        n
        for n, r, rs, _, _ in CANNED_RESPONSES
        if (c := extract_thinking_and_code_unified(r, rs).code) is not None and not check_syntax(c)[0]
    ]
    report.expect(not invalid, "every extracted program is valid Python", f"invalid code from: {', '.join(invalid)}")


@contextlib.contextmanager
def parser_spy() -> Iterator[list[str | None]]:
    """Record every response the one parser (`extract_thinking_and_code_unified`) reads while the block runs.

    Its first step, `split_thinking`, is looked up in its module at each call, so the spy sees every call
    however a caller imported the parser; a phase that grew a parser of its own never shows up."""
    import utils.thinking_extraction as one_parser

    seen: list[str | None] = []
    original = one_parser.split_thinking

    def spy(response: str | None, reasoning: str | None = None) -> Any:
        seen.append(response)
        return original(response, reasoning)

    one_parser.split_thinking = spy
    try:
        yield seen
    finally:
        one_parser.split_thinking = original


def add_task(problem: str = "Add two numbers.", num_tests: int = 3) -> Any:
    """The preflight's task: add(a, b), with its first `num_tests` asserts."""
    from utils.dataset_loader import Task

    tests = ("assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(10, 5) == 15")
    return Task(
        task_id="preflight/add",
        source="preflight",
        problem=problem,
        test_type="assert",
        fn_name="add",
        tests=tests[:num_tests],
        reference_solutions=(ADD,),
    )


def check_one_parser(report: Report, config: Config) -> None:
    """Phase 2 (teacher trace records) and phase 4 (judged samples), each through its own library call,
    on a response whose thinking drafts wrong code: a parser of their own would read other code."""
    section("One parser on every phase's path")
    import asyncio
    import tempfile

    from clients.openai_compat import TeacherResponse
    from evaluation.evaluate import CachedCompletion, execute_samples
    from sandbox.executor import SandboxError, SandboxPool
    from synthesis.generate_traces import generate_traces
    from utils.jsonl import read_jsonl

    name, response, reasoning, expected, _ = next(c for c in CANNED_RESPONSES if c[0].startswith("code drafted"))
    task = add_task()

    class CannedTeacher:  # what generate_traces asks of a TeacherClient
        model, max_concurrency = "preflight-canned", 1

        async def complete(self, messages: list[dict]) -> TeacherResponse:
            return TeacherResponse(text=response, reasoning=reasoning, finish_reason="stop")

    try:
        with tempfile.TemporaryDirectory() as tmp, SandboxPool.from_config(config.sandbox, workers=1) as pool:
            with parser_spy() as phase2_seen:
                traces = Path(tmp) / "traces.jsonl"
                asyncio.run(
                    generate_traces(
                        [task],
                        CannedTeacher(),  # type: ignore[arg-type]
                        traces,
                        num_samples=1,
                        pool=pool,
                        progress=False,
                    )
                )
            [trace] = read_jsonl(traces)
            cache = {(task.task_id, 0): CachedCompletion(task.task_id, 0, response, 1, "stop", None)}
            with parser_spy() as phase4_seen:
                [row] = execute_samples([task], cache, 1, pool)
    except (SandboxError, OSError) as exc:
        report.fail(f"the sandbox could not start: {exc}", "the sandbox needs Linux; see sandbox/worker.py")
        return
    report.expect(
        response in phase2_seen and trace["code"] == expected and trace["passed"],
        "phase 2: trace records come from the one parser (synthesis.generate_traces)",
        f"the parser saw {len(phase2_seen)} responses, the record's code is {trace['code']!r}: "
        "synthesis/generate_traces.py must call utils.thinking_extraction.extract_thinking_and_code_unified",
    )
    report.expect(
        response in phase4_seen and row.code == expected and row.passed,
        "phase 4: judged samples come from the one parser (evaluation.evaluate.execute_samples)",
        f"the parser saw {len(phase4_seen)} responses, the sample's code is {row.code!r}: "
        "evaluation/evaluate.py must call utils.thinking_extraction.extract_thinking_and_code_unified",
    )


def check_sft_labels(report: Report, config: Config, tokenizer) -> None:
    """Two teacher traces through teacher-SFT's own path (`build_teacher_sft`, then the trainer's `collate_sft`),
    with teacher-SFT switched on whatever the config's weight."""
    section("SFT labels")
    import dataclasses

    from synthesis.generate_traces import TeacherTrace
    from training.sft_sources import build_teacher_sft
    from utils.sft_data import IGNORE_INDEX, build_sft_target, collate_sft, encode_prompt, end_of_turn_id

    biggest = "def biggest(xs):\n    best = xs[0]\n    for x in xs:\n        best = max(best, x)\n    return best"
    traces = [
        TeacherTrace(
            "preflight/1", 0, get_unified_prompt("Add two numbers."), thinking="Use +.", code=ADD, passed=True
        ),
        TeacherTrace(
            "preflight/2",
            0,
            get_unified_prompt("Return the maximum of a list."),
            thinking="Scan once, keep the best so far.",
            code=biggest,
            passed=True,
        ),
    ]
    d = dataclasses.replace(config.dual_source, teacher_sft_weight=1.0, teacher_sft_batch_size=2, sft_max_length=4096)
    template = config.student.chat_template_kwargs
    try:
        built, _ = build_teacher_sft(
            traces, tokenizer, d, chat_template_kwargs=template, rollout_budget=config.grpo.max_new_tokens
        )
        batch = collate_sft(built, tokenizer.pad_token_id)
    except Exception as exc:  # noqa: BLE001 - a preflight reports any failure instead of crashing
        report.fail(f"teacher-SFT preparation raised {type(exc).__name__}: {exc}", "see training/sft_sources.py")
        return
    report.ok(f"teacher-SFT batch prepared as training prepares it: input_ids {tuple(batch['input_ids'].shape)}")
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    eot = end_of_turn_id(tokenizer)
    problems = [] if len(built) == len(traces) else [f"{len(traces) - len(built)} of {len(traces)} traces dropped"]
    for row, trace in enumerate(traces[: len(built)]):
        p = len(encode_prompt(tokenizer, trace.prompt, chat_template_kwargs=template))
        n = int(mask[row].sum())
        if not (labels[row, :p] == IGNORE_INDEX).all():
            problems.append(f"row {row}: a prompt token is supervised (data leak)")
        if not (labels[row, p:n] == ids[row, p:n]).all():
            problems.append(f"row {row}: a response label differs from its token id")
        if not (labels[row, n:] == IGNORE_INDEX).all():
            problems.append(f"row {row}: a padding position is supervised")
        target = build_sft_target(trace.thinking, trace.code or "", d.include_thinking)
        decoded = tokenizer.decode(ids[row, p : n - 1].tolist())
        if decoded != target or int(ids[row, n - 1]) != eot:
            problems.append(f"row {row}: supervised span is not exactly target + end-of-turn")
    report.expect(
        not problems,
        "labels: prompt and padding masked with -100, every response token supervised "
        f"({int((labels != IGNORE_INDEX).sum())} supervised tokens)",
        "; ".join(problems),
    )


def run_sampler(config: Config, purpose: str, tokenizer: Any, model: Any, **evaluation: Any) -> tuple[Any, str, str]:
    """(the sampler synced to `model`, its name, why the kv sampler refused the model or ""): the one the run
    samples `purpose` with ("train": phase 3's, with grpo's settings; "eval": phase 4's, with evaluation's,
    `evaluation` overriding its keys), built by `build_sampler` as the phases build it. A vLLM backend becomes
    transformers generate (the preflight starts no engine; the vLLM checks are their own), and so does a kv sampler
    that refuses the model (`UnsupportedModelError`: phases 3 and 4 refuse such a student, and the caller says so)."""
    from rollouts.from_config import build_sampler
    from rollouts.kv_sampler import UnsupportedModelError

    def build(backend: str) -> Any:
        if purpose == "train":
            changes: dict[str, dict[str, Any]] = {"grpo": {"rollout_backend": backend}}
        else:
            changes = {"evaluation": {**evaluation, "backend": backend}}
        sampled = apply_overrides(config, changes, "the preflight's sampler")
        return build_sampler(sampled, purpose=purpose, tokenizer=tokenizer)  # type: ignore[arg-type]

    backend = config.rollout_backend if purpose == "train" else config.evaluation_backend
    backend = backend if backend in ("hf", "kv") else "hf"
    sampler = build(backend)
    try:
        sampler.sync(model, 0)
    except UnsupportedModelError as error:
        sampler = build("hf")
        sampler.sync(model, 0)
        return sampler, "transformers generate", str(error)
    return sampler, "the kv sampler" if backend == "kv" else "transformers generate", ""


def check_student(report: Report, config: Config, max_new_tokens: int) -> tuple | None:
    section(f"Student model ({config.student.model_name})")
    from utils.student_model import ModelLoadError, load_student

    start = time.time()
    try:
        model, tokenizer = load_student(
            config.student.model_name,
            config.student.torch_dtype,
            config.student.load_in_8bit,
            config.paths.model_cache_dir,
        )
    except (ModelLoadError, OSError, ValueError, RuntimeError) as exc:
        report.fail(f"student failed to load: {exc}", "check student.model_name; on CPU use --preset cpu")
        return None
    report.ok(f"model loaded ({time.time() - start:.1f} s)")
    task = {
        "problem": "Write a function to find the sum of two numbers.",
        "test_type": "assert",
        "fn_name": "sum_two",
        "tests": ["assert sum_two(2, 3) == 5"],
    }
    start = time.time()
    # greedy, with the sampler phase 4 evaluates with (on the cpu preset the kv sampler, as phase 3's rollouts)
    sampler, name, refused = run_sampler(
        config, "eval", tokenizer, model, temperature=0.0, max_new_tokens=max_new_tokens
    )
    if refused:
        report.fail(
            f"the configured kv sampler cannot run this student ({refused})",
            "set grpo.rollout_backend=hf and evaluation.backend=hf (transformers generate) for this model",
        )
    try:
        sample = sampler.sample([get_unified_prompt(task, config.prompt.num_visible_tests)], 1)[0][0]
    finally:
        sampler.release()
    report.expect(
        sample.num_tokens > 0,
        f"student generated {sample.num_tokens} tokens with {name} ({time.time() - start:.1f} s, "
        f"finish_reason={sample.finish_reason})",
        "generation returned nothing",
    )
    parsed = extract_thinking_and_code_unified(sample.text)
    small = "expected for a small untrained student; teacher-SFT teaches the format"
    report.ok_or_warn(parsed.has_thinking, "output contains a <think> block", "output has no <think> block", small)
    report.ok_or_warn(
        parsed.has_code, "code extracted from the output", "no code could be extracted from the output", small
    )
    if parsed.has_code and parsed.code is not None:
        from sandbox.executor import SandboxPool, compile_error

        with SandboxPool.from_config(config.sandbox, workers=1) as pool:  # a model's code compiles only there
            error = compile_error(parsed.code, pool)
        report.ok_or_warn(
            error is None, "student code is valid Python", f"student code does not compile ({error})", small
        )
    return model, tokenizer


def training_prompts(config: Config, count: int) -> list[str]:
    """The first `count` prompts of the run's training tasks (phase 1's train.jsonl in paths.data_dir), else of the
    embedded fixtures (the same prompt shape)."""
    from utils.dataset_loader import EMBEDDED_APPS, EMBEDDED_MBPP, load_apps, load_mbpp, read_tasks

    train = Path(config.paths.data_dir) / "train.jsonl"
    if train.is_file():
        tasks = read_tasks(train)[:count]
    else:  # MBPP- and APPS-format alike, as phase 1 mixes them
        mbpp, apps = load_mbpp(EMBEDDED_MBPP)[0], load_apps(EMBEDDED_APPS)[0]
        tasks = [t for pair in zip(mbpp, apps, strict=False) for t in pair][:count]
    return [get_unified_prompt(t, config.prompt.num_visible_tests) for t in tasks]


def check_target_format(report: Report, config: Config, model, tokenizer, prompts: int = 4, samples: int = 2) -> None:
    """Measure the student's closed-think rate on training prompts at the rollout decoding and say which
    teacher-SFT target the run uses and why (a warning when the configured target does not fit the student)."""
    section("Teacher-SFT target format")
    import torch

    from utils.sft_data import sft_target_choice, thinking_targets_configured

    torch.manual_seed(config.training.seed)
    sampler, _, _ = run_sampler(config, "train", tokenizer, model)  # phase 3's rollout distribution: its sampler
    try:
        outputs = sampler.sample(training_prompts(config, prompts), samples)
    finally:
        sampler.release()
    texts = [c.text for per_prompt in outputs for c in per_prompt]
    closed = sum(extract_thinking_and_code_unified(t).think_closed for t in texts)
    configured = thinking_targets_configured(
        config.dual_source.include_thinking, config.teacher.source, config.teacher.reference_thinking
    )
    fits, sentence = sft_target_choice(closed, len(texts), configured)
    if fits:
        report.ok(sentence)
    else:
        report.warn(sentence, "the target follows the student: change the two keys named above")


def check_training_step(report: Report, config: Config, model, tokenizer) -> None:
    section("One training step (GRPO + teacher-SFT + self-SFT)")
    import tempfile

    import torch

    from rollouts.from_config import build_sampler
    from synthesis.generate_traces import TeacherTrace
    from training.grpo_trainer import GRPOTrainer
    from training.setup import build_run
    from utils.student_model import attach_lora

    task = add_task("Write a function add(a, b) that returns a + b.", num_tests=2)
    small = apply_overrides(
        config,
        {
            "grpo": {"num_samples_per_prompt": 2, "max_new_tokens": 48},
            "training": {
                "per_device_train_batch_size": 1,
                "gradient_accumulation_steps": 1,
                "max_steps": 1,
                "save_steps": 0,
                "warmup_steps": 0,
                "gradient_checkpointing": False,
            },
            "dual_source": {"teacher_sft_batch_size": 1},
        },
        "the preflight's one-step run",
    )
    lora = config.lora
    peft_model = attach_lora(model, lora.r, lora.lora_alpha, lora.lora_dropout, lora.target_modules)
    base = {k: v.detach().clone() for k, v in peft_model.named_parameters() if "lora_" not in k}
    adapter = {k: v.detach().clone() for k, v in peft_model.named_parameters() if "lora_" in k}
    teacher = [
        TeacherTrace(task.task_id, 0, get_unified_prompt(task), thinking="Return the sum.", code=ADD, passed=True)
    ]
    with tempfile.TemporaryDirectory() as out:
        # the configured sampler; vLLM's own checks are below
        backend = small.rollout_backend if small.rollout_backend in ("hf", "kv") else "hf"
        sampled = apply_overrides(small, {"grpo": {"rollout_backend": backend}}, "the preflight")
        rollout = build_sampler(sampled, purpose="train", tokenizer=tokenizer, output_dir=Path(out))
        try:
            parts = build_run(
                small,
                tasks=[task],
                teacher_examples=teacher,
                output_dir=out,
                model=peft_model,
                tokenizer=tokenizer,
                rollout=rollout,
            )
            trainer = GRPOTrainer(parts)
            with parser_spy() as phase3_seen:
                groups, rollout_metrics = trainer.collect_rollouts()
            metrics = trainer.train_on_rollouts(groups, rollout_metrics)[0]
            trainer.pool.close()
        except Exception as exc:  # noqa: BLE001 - a preflight reports any failure instead of crashing
            report.fail(f"a training step raised {type(exc).__name__}: {exc}", "see training/grpo_trainer.py")
            return
    texts = [sample.completion.text for group in groups for sample in group]
    report.expect(
        texts != [] and all(text in phase3_seen for text in texts),
        f"phase 3: the rewards of all {len(texts)} rollouts come from the one parser (GRPOTrainer.collect_rollouts)",
        "training/grpo_trainer.py must parse rollouts with utils.thinking_extraction.extract_thinking_and_code_unified",
    )
    report.expect(
        all(math.isfinite(v) for k, v in metrics.items() if k.startswith("loss/")),
        f"losses are finite (total {metrics['loss/total']:.4f}, KL {metrics['kl']:.2e})",
        "check the learning rate",
    )
    changed = sum(not torch.equal(adapter[k], v) for k, v in peft_model.named_parameters() if "lora_" in k)
    report.expect(
        changed > 0, f"the step changed {changed} LoRA tensors", "no LoRA weight moved: are the SFT weights 0?"
    )
    unchanged = all(torch.equal(base[k], v) for k, v in peft_model.named_parameters() if "lora_" not in k)
    report.expect(unchanged, "base weights are unchanged", "only LoRA parameters may be trainable")


def check_code_execution(report: Report, config: Config) -> None:
    section("Code execution (sandbox) and rewards")
    from sandbox.executor import SandboxError, SandboxPool, execute_many
    from training.rewards import compute_rewards

    task = add_task()
    responses = {
        "correct": f"<think>\nAdd them.\n</think>\n\n```python\n{ADD}\n```",
        "wrong": "<think>\nSubtract?\n</think>\n\n```python\ndef add(a, b):\n    return a - b\n```",
        "hostile": "```python\nimport sys\nclass Yes:\n    def __eq__(self, other):\n        return True\n"
        "def add(a, b):\n    return Yes()\nsys.exit(0)\n```",
    }
    parsed = {name: extract_thinking_and_code_unified(text) for name, text in responses.items()}
    try:
        with SandboxPool.from_config(config.sandbox, workers=2) as pool:
            results = dict(zip(responses, execute_many([(parsed[n].code, task) for n in responses], pool), strict=True))
            isolation = pool.isolation
    except (SandboxError, OSError) as exc:
        report.fail(f"the sandbox could not start: {exc}", "the sandbox needs Linux; see sandbox/worker.py")
        return
    ok = results["correct"]
    report.expect(
        ok.passed and ok.tests_passed == 3,
        f"code extracted from a full response passes its tests "
        f"({ok.tests_passed}/{ok.tests_total}, {ok.wall_time * 1000:.0f} ms)",
        f"sandbox verdict: {ok.status} {ok.error}",
    )
    report.expect(
        not results["wrong"].passed and results["wrong"].status == "wrong_answer",
        "wrong code is judged wrong_answer",
        f"got {results['wrong'].status}",
    )
    rewards = compute_rewards(
        [results[n] for n in responses],
        [parsed[n] for n in responses],
        correctness=config.grpo.correctness_reward,
        format_weight=config.grpo.format_reward_weight,
    )
    correct, wrong, hostile = (r.total for r in rewards)
    report.expect(
        correct is not None and wrong is not None and correct > wrong >= 0,
        f"rewards computed: correct {correct:.2f} > wrong {wrong:.2f}",
        "see training/rewards.py",
    )
    report.expect(
        not results["hostile"].passed and rewards[2].correctness == 0.0,
        f"a hostile program (always-equal object + sys.exit) scores zero ({results['hostile'].status})",
        "the verdict must come from the harness, not the program",
    )
    report.ok_or_warn(
        isolation == "namespaces",
        "sandbox isolation: namespaces (no network, secrets hidden, separate uid)",
        "sandbox isolation: basic (rlimits and process-group kill only)",
        "run as root (e.g. in a container) for network/filesystem isolation of model code",
    )


def _mask_runs(token_ids: Sequence[int], mask: Sequence[int]) -> list[tuple[int, list[int]]]:
    """(mask value, ids) for each run of equal mask values."""
    runs: list[tuple[int, list[int]]] = []
    for token, flag in zip(token_ids, mask, strict=True):
        if runs and runs[-1][0] == flag:
            runs[-1][1].append(token)
        else:
            runs.append((flag, [token]))
    return runs


def check_multi_turn(report: Report, config: Config, tokenizer) -> None:
    """A scripted tool exchange and a scripted feedback exchange round-trip through the real loop, the
    student's tokenizer and the sandbox; a hostile program inside <program> learns and keeps nothing."""
    section("Multi-turn rollouts (tool and feedback modes)")
    import tempfile
    import time

    from environments.code_env import FeedbackEnvironment, ToolEnvironment
    from rollouts.groups import Episodes, sample_groups
    from rollouts.scripted import ScriptedBackend
    from sandbox.executor import SandboxError, SandboxPool, execute_program
    from utils.sft_data import end_of_turn_id

    task = add_task()
    template = {"enable_thinking": True} if "enable_thinking" in str(tokenizer.chat_template or "") else None
    tool_turns = [
        "<think>\nCheck it.\n<program>\nprint(1 + 1)\n</program>",
        f"\n2, good.\n</think>\n\n```python\n{ADD}\n```",
    ]
    wrong = "<think>\nSubtract?\n</think>\n\n```python\ndef add(a, b):\n    return a - b\n```"
    feedback_turns = [wrong, f"<think>\nAdd.\n</think>\n\n```python\n{ADD}\n```"]
    eot = end_of_turn_id(tokenizer)
    try:
        with (
            tempfile.TemporaryDirectory() as outside,
            SandboxPool.from_config(config.sandbox, workers=2) as pool,
        ):

            def run(turns, env, mode):  # through the sampling path phases 3 and 4 take
                policy = ScriptedBackend(tokenizer, lambda i, t: turns[min(t, len(turns) - 1)], 256, template)
                prompt = get_unified_prompt(task, 1, mode=mode)
                episodes = Episodes(env, mode, 256, 1024, template)
                return sample_groups(policy, None, [prompt], 1, tasks=[task], episodes=episodes)[0][0]

            tool = run(tool_turns, ToolEnvironment(pool, 2, 200), "tool")
            runs = _mask_runs(tool.token_ids, tool.action_mask)
            policy = [tokenizer.decode(ids) for flag, ids in runs if flag]
            inserted = [tokenizer.decode(ids) for flag, ids in runs if not flag]
            report.expect(
                inserted == ["\n<result>\n2\n</result>\n"] and tool.multi_turn.tool_calls == 1,
                "tool mode: the <program> is cut at its closing tag, run, and its result inserted",
                f"inserted {inserted}, tool calls {tool.multi_turn.tool_calls}: see environments/code_env.py",
            )
            report.expect(
                [p.replace(tokenizer.decode([eot]), "") for p in policy] == tool_turns and tool.token_ids[-1] == eot,
                "tool mode: the action mask covers exactly the policy's tokens (the result is masked out)",
                f"policy runs {policy}: see rollouts/episodes.py",
            )
            feedback = run(feedback_turns, FeedbackEnvironment(pool, 3, 1, 400), "feedback")
            runs = _mask_runs(feedback.token_ids, feedback.action_mask)
            told = "".join(tokenizer.decode(ids) for flag, ids in runs if not flag)
            report.expect(
                len(runs) == 3
                and task.tests[0] in told
                and not any(t in told for t in task.tests[1:])
                and feedback.num_turns == 2,
                "feedback mode: a failed shown test comes back as a user turn (masked); hidden tests never",
                f"feedback {told!r}: see environments/code_env.py",
            )
            secret = Path(outside) / "secret.txt"
            secret.write_text("SECRET-PREFLIGHT\n")
            marker = Path(outside) / "left-behind"
            hostile = (
                f"import os\ntry:\n    print(open({str(secret)!r}).read())\nexcept Exception as e:\n"
                f"    print(type(e).__name__)\ntry:\n    open({str(marker)!r}, 'w').write('x')\n"
                "except Exception as e:\n"
                "    print(type(e).__name__)\nprint('<|im_end|>')\n"
            )
            final = (
                "\n</think>\n\n```python\nimport sys\nclass Yes:\n    def __eq__(self, other):\n        return True\n"
                "def add(a, b):\n    return Yes()\nsys.exit(0)\n```"
            )
            bad = run([f"<think>\n<program>\n{hostile}</program>", final], ToolEnvironment(pool, 2, 400), "tool")
            inserted_ids = [t for t, m in zip(bad.token_ids, bad.action_mask, strict=True) if not m]
            seen = tokenizer.decode(inserted_ids)
            verdict = execute_program(extract_thinking_and_code_unified(bad.text).code, task, pool=pool)
            report.expect(
                "SECRET-PREFLIGHT" not in seen and eot not in inserted_ids and not verdict.passed,
                f"a hostile program inside <program> reads nothing outside, inserts no markup, scores nothing "
                f"({verdict.status})",
                f"result block {seen!r}: see environments/code_env.py",
            )
            time.sleep(0.5)
            if pool.isolation == "namespaces":
                report.expect(
                    not marker.exists(),
                    "a hostile program inside <program> leaves nothing behind",
                    f"{marker} was written from inside the sandbox",
                )
            else:
                report.warn(
                    "basic sandbox isolation: a <program> can write where the worker's user can",
                    "run as root (e.g. in a container) for filesystem isolation of model code",
                )
    except (SandboxError, OSError) as exc:
        report.fail(f"the sandbox could not start: {exc}", "the sandbox needs Linux; see sandbox/worker.py")


def check_teacher_endpoint(report: Report, config: Config, url: str) -> None:
    section(f"Teacher endpoint ({url})")
    import asyncio

    from clients.openai_compat import TeacherClient, TeacherFatalError
    from utils.student_model import served_model_name

    model = served_model_name(config.teacher.model_name, config.paths.model_cache_dir)

    async def probe():
        async with TeacherClient.from_config(
            config.teacher, model=model, base_url=url, max_retries=1, request_timeout=120.0
        ) as client:
            return await client.probe(build_chat_messages(get_unified_prompt("Write add(a, b) returning a + b.")), 256)

    try:
        served, response = asyncio.run(probe())
    except TeacherFatalError as exc:
        if "No teacher server answers" in str(exc):
            report.warn(
                f"no teacher answering at {normalize_api_base(url)}",
                "fine for now; start it before phase 2: `make teacher` (CPU) or "
                "`vllm serve Qwen/Qwen3-32B-FP8 --port 8129 --reasoning-parser qwen3` (GPU), "
                "or point --teacher_url at it",
            )
        else:
            report.fail(f"teacher endpoint unusable: {exc}", "fix teacher.model_name / teacher.api_key")
        return
    if not report.expect(
        response.ok,
        f"teacher answered in {response.latency:.1f} s (serves: {', '.join(served) or 'unlisted'})",
        f"the request failed: {response.error}",
    ):
        return
    parsed = extract_thinking_and_code_unified(response.text, response.reasoning)
    report.ok_or_warn(
        parsed.has_thinking,
        "teacher returned thinking",
        "teacher returned no thinking",
        "teacher.enable_thinking is already true: this teacher does not think (expected of a small stand-in such "
        "as the local 135M teacher; a Qwen3 teacher served with --reasoning-parser qwen3 does)"
        if config.teacher.enable_thinking
        else "set teacher.enable_thinking=true (it is false), or serve a teacher that thinks",
    )
    report.ok_or_warn(
        parsed.has_code,
        "teacher returned extractable code",
        "no code in the teacher's answer",
        "check teacher.max_tokens: a truncated answer has no code",
    )


def check_teacher_logprobs(report: Report, config: Config, tokenizer: Any, url: str | None = None) -> None:
    """On-policy distillation (dual_source.opd_weight > 0): the teacher (teacher.logprob_source) reads the
    student's token ids and scores one short completion, each token a finite log-prob."""
    source = config.teacher.logprob_source
    section(f"On-policy distillation teacher ({source})")
    import dataclasses

    from clients.openai_compat import TeacherFatalError
    from rollouts.completion import RolloutCompletion
    from training.teacher_logprobs import TeacherScoringError, TokenizerMismatchError, build_teacher_scorer
    from utils.sft_data import encode_prompt
    from utils.student_model import ModelLoadError

    teacher = dataclasses.replace(config.teacher, api_url=url) if url and source == "server" else config.teacher
    prompt = encode_prompt(tokenizer, get_unified_prompt("Write add(a, b) returning a + b."))
    answer = tokenizer(f"```python\n{ADD}\n```", add_special_tokens=False)["input_ids"]
    sample = RolloutCompletion("", tuple(answer), tuple(prompt), "stop")
    scorer = None
    try:
        scorer = build_teacher_scorer(
            teacher,
            tokenizer,
            student_name=config.student.model_name,
            cache_dir=config.paths.model_cache_dir,
            torch_dtype=config.student.torch_dtype,
        )
        scores = scorer.score([sample])
    except TokenizerMismatchError as exc:
        report.fail(str(exc), "pick a teacher of the student's family")
        return
    except (TeacherScoringError, TeacherFatalError) as exc:
        report.fail(
            f"the teacher does not answer prompt log-probs: {exc}",
            "serve the teacher with vLLM (`vllm serve ...`) at teacher.api_url, or set teacher.logprob_source=local",
        )
        return
    except (ModelLoadError, OSError) as exc:
        report.fail(f"could not load the teacher: {str(exc).splitlines()[0]}", "check teacher.model_name")
        return
    finally:
        if scorer is not None:
            scorer.close()
    values = scores.logprobs[0]
    report.expect(
        len(values) == len(answer) and all(math.isfinite(v) for v in values),
        f"teacher scored {len(answer)} completion tokens in {scores.seconds:.2f} s "
        f"(mean log-prob {sum(values) / max(len(values), 1):.2f})",
        f"the teacher's log-probs are not one finite value per token: {values[:8]}",
    )


def check_gpu_setup(report: Report, config: Config, num_processes: int) -> None:
    """The GPU configuration (`--preset gpu`): each a PASS or a FAIL with the fix."""
    section(f"GPU setup ({num_processes} training process(es))")
    import importlib.util
    import os

    import torch

    from rollouts.vllm_engine import VLLM_LORA_RANKS
    from training.launch import LaunchError, check_launch_environment

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    report.expect(
        count >= num_processes,
        f"{count} CUDA GPU(s) visible for {num_processes} training process(es)",
        "one GPU per process: lower --num_processes or set CUDA_VISIBLE_DEVICES",
    )
    if config.student.torch_dtype == "bfloat16":  # emulation does not count: vLLM refuses bf16 below Ampere
        report.expect(
            count > 0 and torch.cuda.is_bf16_supported(including_emulation=False),
            "the GPU supports bfloat16 natively (compute capability 8.0 or higher)",
            "below Ampere (T4, RTX 20xx) use --set student.torch_dtype=float32: vLLM refuses bfloat16 there and "
            "torch only emulates it (slowly); float16 would train without loss scaling, its small gradients lost",
        )
    if config.student.torch_dtype == "float16" and os.environ.get("ACCELERATE_MIXED_PRECISION") != "fp16":
        report.warn(
            "student.torch_dtype=float16 trains without a loss scaler (accelerate's mixed_precision is 'no' unless "
            "launched with --mixed_precision fp16): per-token gradients of ~1e-5 underflow in the float16 backward",
            "use float32 (or bfloat16 on Ampere or newer), or accelerate launch --mixed_precision fp16",
        )
    try:
        check_launch_environment()
        report.ok("launch type supported (plain processes or DDP)")
    except LaunchError as exc:
        report.fail(str(exc), "answer `accelerate config` with multi-GPU (no DeepSpeed, no FSDP)")
    if config.rollout_backend == "vllm":
        report.expect(
            importlib.util.find_spec("vllm") is not None,
            "vLLM is importable",
            "pip install -r requirements-gpu.txt (vllm==0.33.0)",
        )
        report.expect(
            config.lora.r <= VLLM_LORA_RANKS[-1],
            f"lora.r={config.lora.r} fits a vLLM max_lora_rank",
            f"use lora.r <= {VLLM_LORA_RANKS[-1]}",
        )
        share = config.grpo.vllm_gpu_memory_utilization
        free = torch.cuda.mem_get_info()[0] / torch.cuda.mem_get_info()[1] if count else 0.0
        report.expect(
            0 < share <= 0.6 and free >= share,
            f"vLLM's memory share {share:.2f} fits (free: {free:.0%})",
            "lower grpo.vllm_gpu_memory_utilization (the trainer needs the rest) or free the GPU",
        )
    if os.environ.get("WORLD_SIZE"):
        report.ok(f"running under a launcher with WORLD_SIZE={os.environ['WORLD_SIZE']}")
    if count:
        check_gpu_memory(report, config)


def check_gpu_memory(report: Report, config: Config, prompt_tokens: int = 512) -> None:
    """Phase 3's predicted peak on one GPU (`training.memory_model`, measured by benchmarks/bench_memory.py) vs
    the memory of the visible GPU: a WARN, with the knob to turn, when it does not fit."""
    import torch

    from training import memory_model

    shape = memory_model.student_shape(config.student.model_name, config.paths.model_cache_dir)
    if shape is None:
        report.warn(f"no memory estimate: the config of {config.student.model_name} could not be read")
        return
    total = torch.cuda.mem_get_info()[1]
    teacher = None  # a local OPD teacher lives in the trainer's process: its weights and forward count too
    if config.dual_source.opd_weight > 0 and config.teacher.logprob_source == "local":
        teacher = memory_model.student_shape(config.teacher.model_name, config.paths.model_cache_dir)
    est = memory_model.estimate(config, shape, prompt_tokens, teacher)
    need = memory_model.required_bytes(config, est, total)
    gb = memory_model.GB
    vllm = config.rollout_backend == "vllm" and not config.grpo.vllm_sleep_mode
    detail = (
        f"predicted peak of phase 3 {need / gb:.1f} GB ({est.largest} {est.peak / gb:.1f} GB"
        + f" + {memory_model.GPU_ALLOWANCE / gb:.1f} GB CUDA allowance"
        + (f" + vLLM's share {config.grpo.vllm_gpu_memory_utilization * total / gb:.1f} GB" if vllm else "")
        + f"; prompts of {prompt_tokens} tokens)"
    )
    if config.training.gradient_checkpointing:
        knobs = "lower training.forward_chunk_size (1), grpo.max_new_tokens or dual_source.sft_max_length"
    else:
        knobs = "--set training.gradient_checkpointing=true"
    if vllm:
        knobs += ", or grpo.vllm_sleep_mode=true / a lower grpo.vllm_gpu_memory_utilization"
    report.ok_or_warn(
        need <= total,
        f"{detail} fits this GPU ({total / gb:.1f} GB)",
        f"{detail} exceeds this GPU ({total / gb:.1f} GB): the first update would run out of memory",
        knobs + " (docs/gpu.md, 'Memory')",
    )


def main(
    config: Config,
    teacher_url: str | None = None,
    num_processes: int = 1,
    skip_model: bool = False,
    max_new_tokens: int = 160,
    teacher: str = "check",
) -> Report:
    """Run every check for `config` (the model checks unless `skip_model`; the teacher endpoint's as `teacher`
    says: "check", "skip" or "only"); returns the report."""
    report = Report()
    if teacher == "only":
        check_teacher_endpoint(report, config, teacher_url or config.teacher.api_url)
        return _summarize(report)
    print(config_summary(config))  # one line: the checks come first (python -m config prints every key)
    checks: list[Callable[[], object]] = [
        lambda: check_prompt_format(report, config),
        lambda: check_extraction(report),
        lambda: check_one_parser(report, config),
    ]
    for check in checks:
        check()
    check_code_execution(report, config)
    if not skip_model:
        loaded = check_student(report, config, max_new_tokens)
        if loaded is not None:
            model, tokenizer = loaded
            check_sft_labels(report, config, tokenizer)
            check_target_format(report, config, model, tokenizer)
            check_multi_turn(report, config, tokenizer)
            check_training_step(report, config, model, tokenizer)
            if config.dual_source.opd_weight > 0:
                check_teacher_logprobs(report, config, tokenizer, teacher_url)
    if config.preset == "gpu":
        check_gpu_setup(report, config, num_processes)
    if teacher == "check":
        check_teacher_endpoint(report, config, teacher_url or config.teacher.api_url)
    return _summarize(report)


def _summarize(report: Report) -> Report:
    failed, warned, passed = report.count("FAIL"), report.count("WARN"), report.count("PASS")
    print("\nPreflight summary:")
    print(f"  total:    {len(report.results)}\n  passed:   {passed}\n  failed:   {failed}\n  warnings: {warned}")
    if failed:
        print("\nSome checks failed: fix them before training (each FAIL above has a hint).")
    else:
        print("\nAll checks passed" + (" (with warnings)" if warned else "") + ": ready to train.")
    return report


class QuietOutput(io.TextIOBase):
    """stdout for --quiet: every line goes to the log file; the screen gets one line per check section as it
    finishes (its counts and time), the WARN and FAIL lines (with their hints) as they come, and everything from
    the closing summary on."""

    def __init__(self, screen: TextIO, log: TextIO) -> None:
        self.screen, self.log, self.pending, self.summary = screen, log, "", False
        self.section: str | None = None
        self.started = 0.0
        self.counts = {"PASS": 0, "WARN": 0, "FAIL": 0}

    def _finish_section(self) -> None:
        if self.section is None:
            return
        c = self.counts
        mark = "✗" if c["FAIL"] else "⚠" if c["WARN"] else "✓"
        parts = [f"{c['PASS']} passed"] + [f"{c[k]} {k.lower()}ed" if k == "WARN" else f"{c[k]} failed" for k in
                                           ("WARN", "FAIL") if c[k]]  # fmt: skip
        self.screen.write(f"{mark} {self.section}: {', '.join(parts)} ({time.monotonic() - self.started:.1f} s)\n")
        self.section = None

    def write(self, text: str) -> int:
        self.log.write(text)
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            if not self.summary and line.startswith("Preflight summary:"):
                self._finish_section()
                self.summary = True
            if not self.summary and line.startswith("== ") and line.endswith(" =="):
                self._finish_section()
                self.section, self.started = line[3:-3], time.monotonic()
                self.counts = dict.fromkeys(self.counts, 0)
            for status in self.counts:
                if line.startswith(("✓ PASS", "⚠ WARN", "✗ FAIL")) and status in line[:6]:
                    self.counts[status] += 1
            if self.summary or line.startswith(("⚠ WARN", "✗ FAIL", "         hint:")):
                self.screen.write(line + "\n")
        self.screen.flush()
        return len(text)

    def flush(self) -> None:
        self.log.flush()
        self.screen.flush()


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Preflight checks: prompt format, extraction, SFT label masking, the student model "
        "and the teacher endpoint. Exit code 0 only if nothing failed.",
    )
    add_config_arguments(parser)
    parser.add_argument("--teacher_url", help="Teacher base URL to probe (default: teacher.api_url from the config).")
    parser.add_argument(
        "--num_processes",
        type=int,
        default=1,
        help="Training processes you will launch (GPU checks with --preset gpu; default 1).",
    )
    parser.add_argument(
        "--skip_model",
        action="store_true",
        help="Skip loading the student (and the SFT check with its tokenizer): the fast checks only.",
    )
    parser.add_argument(
        "--max_new_tokens", type=int, default=160, help="Tokens the student generates in its smoke test (default 160)."
    )
    parser.add_argument(
        "--teacher",
        choices=("check", "skip", "only"),
        default="check",
        help="The teacher endpoint check: 'check' probes it with the rest (a WARN when nothing answers), 'skip' "
        "leaves it out, 'only' probes it and runs nothing else (make run: 'skip' first, 'only' once its local "
        "teacher answers).",
    )
    parser.add_argument(
        "--quiet",
        metavar="LOG",
        help="Print the one-line config summary, the WARN and FAIL lines and the totals; the full output goes "
        "to the file LOG.",
    )
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        exit_on_config_error(exc)
    run = functools.partial(
        main, config, args.teacher_url, args.num_processes, args.skip_model, args.max_new_tokens, args.teacher
    )
    what = "teacher check" if args.teacher == "only" else "preflight checks"
    try:
        if not args.quiet:
            return 1 if run().count("FAIL") else 0
        if args.teacher != "only":
            print(config_summary(config))
        print(f"{what} (full output: {args.quiet})", flush=True)
        with open(args.quiet, "w") as log, contextlib.redirect_stdout(QuietOutput(sys.stdout, log)):
            report = run()
    except KeyboardInterrupt:  # the checks write nothing but their log: nothing to keep
        print(f"\ninterrupted: the {what} stopped; nothing was changed, rerun to check again.", file=sys.stderr)
        return 130
    return 1 if report.count("FAIL") else 0


if __name__ == "__main__":
    sys.exit(cli())
