"""Split a model response into thinking and answer, then find the code in the answer.

`extract_thinking_and_code_unified` is the only parser of model output in the project: the
teacher traces (phase 2), the rewards (phase 3), evaluation (phase 4), the format reward and
the preflight all call it, so they cannot disagree.

Rules, decided once (tests/unit/utils/test_thinking_extraction.py covers each):
- CRLF and CR become LF first.
- Thinking comes from one of three places:
  * inline: ``<think> ... </think>`` in the text. With several think spans, the answer is the text
    after the **last** ``</think>``; the thinking is everything from the first ``<think>`` up to it,
    with the tags removed. Text before the first ``<think>`` is ignored.
  * template-opened: the chat template already emitted ``<think>`` (Qwen3 does), so the text only
    contains ``</think>``: everything before it is thinking.
  * a separate field: OpenAI-compatible servers with a reasoning parser return the thinking as
    ``reasoning`` (older vLLM: ``reasoning_content``), and the text holds only the answer. Pass it
    as `reasoning=`; inline tags in the text are still removed.
- An unclosed ``<think>`` (the model was cut off while thinking) yields **no answer and no
  code**: whatever code it drafted while thinking is not graded. A ``<think>`` that reopens after
  the last ``</think>`` ends the answer at that point.
- Code is chosen from the answer only, by `utils.code_parser.select_code`: a block holding a program
  (a copied `# your code` placeholder is none); for a task with an entry point (`entry_point=`, the task's
  `fn_name`) the last block that defines it, with the definitions it uses from the other blocks; else the
  last python block, else the last untagged block, else the answer itself if it is a program. Rewards and
  strict verdicts pass the same entry point, so they grade the same program. Nothing here compiles it:
  whether it compiles is the sandbox's verdict (`ExecutionResult.compiles`).

`lenient_code` is the one exception, for reporting only (phase 4's lenient pass@k, never a reward): the
code of a response whose thinking never closed, chosen by the same rule from the unclosed thinking. It
tells a format failure (a program written, its block left open) from a failure to write one.
`sanitized_code` is the other reporting-only grade (phase 4's sanitized pass@k): the answer's program the way
EvalPlus sanitizes it (`utils.code_parser.sanitize_program`).
"""

from __future__ import annotations

from dataclasses import dataclass

from utils.code_parser import normalize_newlines, sanitize_program, select_code
from utils.prompts import THINK_CLOSE, THINK_OPEN


def _strip_tags(text: str) -> str:
    return text.replace(THINK_OPEN, "").replace(THINK_CLOSE, "").strip()


@dataclass(frozen=True)
class ThinkingSplit:
    """A response split into its thinking and its answer."""

    thinking: str  # tags removed; "" when there is none
    answer: str  # the text after the thinking ("" when the thinking never closed)
    has_thinking: bool
    think_closed: bool
    thinking_source: str | None  # "inline", "template_opened", "field" or None (no thinking at all)


@dataclass(frozen=True)
class ParsedResponse(ThinkingSplit):
    """One parsed model response: what every phase reads from model output (`extract_thinking_and_code_unified`)."""

    code: str | None  # the selected program, from the answer only
    has_code: bool
    code_source: str | None  # "python_block" | "plain_block" | "raw_answer" | None
    num_code_blocks: int
    well_formed: bool  # closed thinking followed by a python block: the format the prompt asks for


def split_thinking(response: str | None, reasoning: str | None = None) -> ThinkingSplit:
    """The thinking and the answer of a response (see the module docstring for the rules)."""
    text = normalize_newlines(response or "")
    last_close = text.rfind(THINK_CLOSE)
    first_open = text.find(THINK_OPEN)
    if last_close != -1:
        head, answer = text[:last_close], text[last_close + len(THINK_CLOSE) :]
        if first_open != -1 and first_open < last_close:
            thinking, source = _strip_tags(head[first_open + len(THINK_OPEN) :]), "inline"
        else:
            thinking, source = _strip_tags(head), "template_opened"
        closed = True
    elif first_open != -1:
        thinking, answer, closed, source = _strip_tags(text[first_open + len(THINK_OPEN) :]), "", False, "inline"
    else:
        thinking, answer, closed, source = "", text, False, None

    reopened = answer.find(THINK_OPEN)
    if reopened != -1:  # "<think>a</think> answer <think> b...": the tail is unfinished thinking
        thinking = "\n\n".join(p for p in (thinking, _strip_tags(answer[reopened:])) if p)
        answer, closed = answer[:reopened], False

    field = normalize_newlines(reasoning).strip() if reasoning else ""
    if field:
        thinking = "\n\n".join(p for p in (field, thinking) if p)
        source = "field"
        # The server's parser removed the tags; an answer after the reasoning means it ended.
        closed = bool(answer.strip()) and reopened == -1
    return ThinkingSplit(
        thinking=thinking,
        answer=answer.strip("\n"),
        has_thinking=bool(thinking),
        think_closed=closed,
        thinking_source=source,
    )


def extract_thinking_and_code_unified(
    response: str | None, reasoning: str | None = None, entry_point: str | None = None
) -> ParsedResponse:
    """Parse one model response (see the module docstring for the rules); `entry_point` is the task's `fn_name`."""
    split = split_thinking(response, reasoning)
    code, code_source, num_blocks = select_code(split.answer, entry_point) if split.answer else (None, None, 0)
    return ParsedResponse(
        **vars(split),
        code=code,
        has_code=code is not None,
        code_source=code_source,
        num_code_blocks=num_blocks,
        well_formed=split.has_thinking and split.think_closed and code_source == "python_block",
    )


def lenient_code(response: str | None, reasoning: str | None = None, entry_point: str | None = None) -> str | None:
    """The strict parser's code; for a response with no code whose thinking never closed, the program found
    inside that unclosed thinking (same selection rule); None when there is neither."""
    parsed = extract_thinking_and_code_unified(response, reasoning, entry_point)
    if parsed.code is not None or parsed.think_closed or not parsed.thinking:
        return parsed.code
    return select_code(parsed.thinking, entry_point)[0]


def sanitized_code(response: str | None, reasoning: str | None = None, entry_point: str | None = None) -> str | None:
    """The answer's program graded EvalPlus-style (`utils.code_parser.sanitize_program`): the entry point and the
    definitions it reaches from every block, top-level calls, asserts and prints dropped; None without an answer."""
    answer = split_thinking(response, reasoning).answer
    return sanitize_program(answer, entry_point) if answer else None


def extract_function_from_code(
    response: str | None, reasoning: str | None = None, entry_point: str | None = None
) -> str | None:
    """Clean code from a full response: thinking and fences removed (the unified extraction).

    Returns None when the response has no code outside its thinking.
    """
    return extract_thinking_and_code_unified(response, reasoning, entry_point).code
