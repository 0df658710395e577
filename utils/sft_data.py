"""SFT examples: prompt + response -> token ids and labels masked on the prompt.

One masking function (`build_sft_example`) serves teacher-SFT (phase 3, on teacher traces),
self-SFT (phase 3, on the student's own best samples) and the preflight's label check.

- The prompt is tokenized with the tokenizer's chat template and generation prompt, exactly as
  generation sees it (`encode_prompt`, also used by the rollout and evaluation code).
- The response is tokenized on its own and appended, then the end-of-turn token. Generation
  produces tokens after the prompt ids, so this is the same boundary the policy samples at.
- labels = IGNORE_INDEX on every prompt and padding position, = input_ids on every response
  position. The causal-LM loss shifts labels internally, so position i's label is token i.
- Nothing is truncated: an example whose prompt + response (+ end-of-turn) does not fit max_length
  is dropped (counted in the batch's `num_dropped`). Cutting a teacher trace from the right would
  train on a thinking prefix with no </think>, no code and no end of turn.

This module knows tokenizers and tensors, not models or configs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from utils.prompts import CODE_FENCE, PYTHON_FENCE, SYSTEM_PROMPT_UNIFIED, THINK_CLOSE, THINK_OPEN, build_chat_messages

IGNORE_INDEX = -100


class TraceLike(Protocol):
    """What teacher-SFT reads of a trace: `synthesis.generate_traces.TeacherTrace` (utils imports no synthesis)."""

    @property
    def prompt(self) -> str: ...
    @property
    def thinking(self) -> str: ...
    @property
    def code(self) -> str | None: ...
    def conversation(self) -> list[dict[str, str]] | None: ...


def build_sft_target(thinking: str | None, code: str, include_thinking: bool = True) -> str:
    """The response text the student should produce: thinking block, blank line, python block."""
    answer = f"{PYTHON_FENCE}\n{code.strip(chr(10))}\n{CODE_FENCE}"
    if include_thinking and thinking and thinking.strip():
        return f"{THINK_OPEN}\n{thinking.strip()}\n{THINK_CLOSE}\n\n{answer}"
    return answer


# A student that closes its <think> block in fewer of its own samples than this does not get thinking targets:
# it learns to open the block and often never closes it, and an unclosed block has no gradable answer.
CLOSED_THINK_THRESHOLD = 0.9


def thinking_targets_configured(include_thinking: bool, teacher_source: str, reference_thinking: str) -> bool:
    """Whether teacher-SFT targets will carry a <think> block: dual_source.include_thinking, and for the reference
    teacher its teacher.reference_thinking mode too."""
    return include_thinking and (teacher_source != "references" or reference_thinking != "none")


def sft_target_choice(
    closed: int, total: int, thinking_configured: bool, threshold: float = CLOSED_THINK_THRESHOLD
) -> tuple[bool, str]:
    """Which teacher-SFT target fits a student that closed its <think> block in `closed` of `total` samples:
    (the configured target agrees, the sentence that says which target the run uses and why)."""
    rate = closed / total if total else 0.0
    closes = rate >= threshold
    measured = f"the student closes <think> in {closed} of {total} samples ({rate:.0%}; threshold {threshold:.0%})"
    if thinking_configured and closes:
        return True, f"{measured}: the run uses thinking + code targets, a format it already writes"
    if not thinking_configured and not closes:
        return True, f"{measured}: the run uses code-only targets, a format it can imitate"
    if thinking_configured:
        return False, (
            f"{measured}, but the run uses thinking + code targets: a student that does not close the block learns "
            "to open it and loses its answers; set teacher.reference_thinking=none and dual_source.include_thinking"
            "=false (code-only targets)"
        )
    return False, (
        f"{measured}, but the run uses code-only targets: it thinks natively, so thinking targets would keep its "
        "format (teacher.reference_thinking=short, dual_source.include_thinking=true)"
    )


def encode_prompt(
    tokenizer: Any,
    user_prompt: str,
    system_prompt: str | None = SYSTEM_PROMPT_UNIFIED,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Token ids of the chat prompt up to and including the assistant generation header."""
    return chat_prompt_ids(tokenizer, build_chat_messages(user_prompt, system_prompt), chat_template_kwargs)


def chat_prompt_ids(
    tokenizer: Any, messages: list[dict[str, Any]], chat_template_kwargs: dict[str, Any] | None = None
) -> list[int]:
    """Token ids of `messages` rendered by the chat template, up to and including the assistant generation header."""
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False, **(chat_template_kwargs or {})
    )
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # some tokenizers return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def end_of_turn_id(tokenizer: Any) -> int:
    """The token that ends an assistant turn: ChatML's <|im_end|> if the vocab has it, else eos.

    Qwen base tokenizers use <|endoftext|> as eos but end chat turns with <|im_end|>; the
    student must learn to emit the token that generation stops on.
    """
    vocab = tokenizer.get_vocab()
    for token in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>"):
        if token in vocab:
            return vocab[token]
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer has neither a chat end-of-turn token nor an eos token")
    return tokenizer.eos_token_id


def encode_response(tokenizer: Any, response: str, add_end_of_turn: bool = True) -> list[int]:
    ids = tokenizer(response, add_special_tokens=False)["input_ids"]
    return list(ids) + ([end_of_turn_id(tokenizer)] if add_end_of_turn else [])


def teacher_sft_ids(
    tokenizer: Any, trace: TraceLike, include_thinking: bool, chat_template_kwargs: dict[str, Any] | None = None
) -> tuple[list[int], list[int]]:
    """(prompt ids, target ids) of one teacher trace as teacher-SFT trains on it (a multi-turn trace, one
    with a `conversation()`: the whole exchange, `encode_conversation`)."""
    conversation = trace.conversation()
    if conversation:
        prompt_ids, response_ids, _ = encode_conversation(tokenizer, trace.prompt, conversation, chat_template_kwargs)
        return prompt_ids, response_ids
    target = build_sft_target(trace.thinking, trace.code or "", include_thinking)
    return encode_prompt(tokenizer, trace.prompt, chat_template_kwargs=chat_template_kwargs), encode_response(
        tokenizer, target
    )


def build_sft_example(
    prompt_ids: Sequence[int], response_ids: Sequence[int], max_length: int, response_mask: Sequence[int] | None = None
) -> dict[str, list[int]] | None:
    """The masking function. Returns {'input_ids', 'labels'}, or None when there is no response or
    the whole example does not fit `max_length` (dropped, never cut).

    len(input_ids) == len(labels) <= max_length; labels[:len(prompt_ids)] are IGNORE_INDEX.
    `response_mask` (one entry per response token; None = all ones): 0 marks a token the environment
    inserted in a multi-turn response (a `<result>` block, a feedback turn), whose label is IGNORE_INDEX
    too: it is context for what follows, never a target.
    """
    if not response_ids or len(prompt_ids) + len(response_ids) > max_length:
        return None
    response_ids = list(response_ids)
    if response_mask is not None:
        if len(response_mask) != len(response_ids):
            raise ValueError(f"response_mask has {len(response_mask)} entries for {len(response_ids)} response tokens")
        targets = [t if m else IGNORE_INDEX for t, m in zip(response_ids, response_mask, strict=True)]
    else:
        targets = response_ids
    return {
        "input_ids": list(prompt_ids) + response_ids,
        "labels": [IGNORE_INDEX] * len(prompt_ids) + targets,
    }


# Tool mode: the harness inserts a program's output inline, inside the assistant's own turn, between
# these tags (utils.prompts owns the protocol; the values are repeated here only as the default).
RESULT_SPAN = ("<result>", "</result>")


def _response_segments(content: str, environment_span: tuple[str, str] | None) -> list[tuple[str, int]]:
    """An assistant message as (text, is_policy) pieces: `environment_span` blocks (tags and the line breaks
    just around them included) are 0."""
    if environment_span is None:
        return [(content, 1)] if content else []
    opening, closing = environment_span
    pieces, rest = [], content
    while opening in rest:
        before, _, after = rest.partition(opening)
        inside, found, tail = after.partition(closing)
        # the line breaks around the block are the environment's too (`environments.code_env.format_result`
        # inserts "\n<result>\n...\n</result>\n" after the policy's `</program>`)
        lead = "\n" if before.endswith("\n") else ""
        trail = "\n" if found and tail.startswith("\n") else ""
        pieces += [(before[: len(before) - len(lead)], 1), (lead + opening + inside + found + trail, 0)]
        rest = tail[len(trail) :]
    pieces.append((rest, 1))
    return [(text, policy) for text, policy in pieces if text]


def encode_inserted_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of text the environment inserts: special-token strings in it stay plain characters (a
    program that prints `<|im_end|>` does not end the turn), as the multi-turn rollout loop encodes it."""
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


_REPLY, _MESSAGE = "\u2063A\u2063", "\u2063U\u2063"  # placeholders no template or tokenizer rewrites


def environment_turn_ids(
    tokenizer: Any,
    message: dict[str, str],
    chat_template_kwargs: dict[str, Any] | None = None,
    system_prompt: str | None = SYSTEM_PROMPT_UNIFIED,
) -> list[int]:
    """Token ids the chat template puts after an assistant's end-of-turn token when `message` (a user or
    tool turn, e.g. test feedback) follows: the framing, the message's content, and the next assistant
    header. Rendered around placeholder texts (a reply without a think block, so templates that rewrite
    earlier replies do not change it); the template's markup is encoded with its special tokens, the
    content as inserted text (`encode_inserted_text`) -- the same ids the multi-turn rollout loop appends."""
    history = [
        *build_chat_messages("u", system_prompt),
        {"role": "assistant", "content": _REPLY},
        {"role": message["role"], "content": _MESSAGE},
    ]
    rendered = tokenizer.apply_chat_template(
        history, tokenize=False, add_generation_prompt=True, **(chat_template_kwargs or {})
    )
    eot = tokenizer.convert_ids_to_tokens(end_of_turn_id(tokenizer))
    after = rendered[rendered.index(_REPLY) + len(_REPLY) :]
    if not after.startswith(eot) or _MESSAGE not in after:
        raise ValueError(
            f"this chat template does not end an assistant reply with {eot!r} and then render a "
            f"{message['role']!r} turn; multi-turn SFT and feedback turns need one that does"
        )
    before, _, rest = after[len(eot) :].partition(_MESSAGE)
    encode = lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    return encode(before) + encode_inserted_text(tokenizer, message["content"]) + encode(rest)


def encode_conversation(
    tokenizer: Any,
    user_prompt: str,
    turns: Sequence[dict[str, str]],
    chat_template_kwargs: dict[str, Any] | None = None,
    system_prompt: str | None = SYSTEM_PROMPT_UNIFIED,
    environment_span: tuple[str, str] | None = RESULT_SPAN,
) -> tuple[list[int], list[int], list[int]]:
    """A multi-turn exchange as the student would have produced it: (prompt_ids, response_ids, response_mask).

    `turns` follow the prompt, as chat messages: `assistant` turns are the policy's (mask 1, each ended by
    the end-of-turn token), except the `environment_span` blocks inside them (a tool's `<result>`
    output, mask 0); any other role (a feedback `user` turn, a `tool` turn) is the environment's (mask 0,
    `environment_turn_ids`). Each piece is tokenized on its own, as a multi-turn rollout appends them.
    """
    prompt_ids = encode_prompt(tokenizer, user_prompt, system_prompt, chat_template_kwargs)
    ids: list[int] = []
    mask: list[int] = []
    for turn in turns:
        if turn["role"] != "assistant":
            piece = environment_turn_ids(tokenizer, turn, chat_template_kwargs, system_prompt)
            ids += piece
            mask += [0] * len(piece)
            continue
        for text, policy in _response_segments(turn["content"], environment_span):
            piece = (
                tokenizer(text, add_special_tokens=False)["input_ids"]
                if policy
                else encode_inserted_text(tokenizer, text)
            )
            ids += piece
            mask += [policy] * len(piece)
        ids.append(end_of_turn_id(tokenizer))
        mask.append(1)
    return prompt_ids, ids, mask


def check_thinking_targets(tokenizer: Any, include_thinking: bool, chat_template_kwargs: dict[str, Any] | None) -> None:
    """Refuse targets with a <think> block after a prompt that already closed one.

    Qwen3 templates with enable_thinking=false end the generation prompt with an empty
    "<think>\n\n</think>\n\n"; a target that starts with its own think block would teach the student
    a second one. Raises ValueError naming the two settings."""
    if not include_thinking:
        return
    ids = encode_prompt(tokenizer, "x", chat_template_kwargs=chat_template_kwargs)
    if THINK_CLOSE in tokenizer.decode(ids[-16:]):
        raise ValueError(
            "student.enable_thinking=false with dual_source.include_thinking=true: this chat template already "
            "closes an empty <think></think> block in the prompt, so teacher-SFT targets would teach a second "
            "think block. Set --set dual_source.include_thinking=false (code-only targets) or "
            "--set student.enable_thinking=true."
        )


def collate_sft(examples: Sequence[dict[str, list[int]]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest example. Pads get attention 0 and label IGNORE_INDEX.

    Returns input_ids, attention_mask, labels: (B, T) long tensors.
    """
    width = max((len(e["input_ids"]) for e in examples), default=0)
    batch = len(examples)
    input_ids = torch.full((batch, width), pad_token_id, dtype=torch.long)
    labels = torch.full((batch, width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example["input_ids"])
        input_ids[row, :n] = torch.tensor(example["input_ids"], dtype=torch.long)
        labels[row, :n] = torch.tensor(example["labels"], dtype=torch.long)
        attention_mask[row, :n] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
