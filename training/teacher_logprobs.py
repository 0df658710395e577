"""The teacher's log-prob of every token of the student's own samples: what on-policy distillation
(`dual_source.opd_weight`, `training.losses.opd_loss`) compares the student against.

A sample is a `rollouts.completion.RolloutCompletion` (prompt ids + completion ids, from any rollout
backend, single- or multi-turn); the teacher scores the completion tokens teacher-forced on the same ids,
so no text is re-encoded. Two sources (`teacher.logprob_source`):

- `server`: the served teacher (`vllm serve`): one `POST /v1/completions` per sample whose prompt is the
  token ids prompt + completion, with `prompt_logprobs=0` (the log-prob of each prompt token itself given
  the tokens before it) and `max_tokens=1` (vLLM 0.33.0 refuses 0 unless `echo`; the one generated token
  is thrown away). The answer's `choices[0].prompt_logprobs` has one entry per prompt token (None for the
  first), each a map from token id (a string in JSON) to {logprob, rank, decoded_token}; the last
  len(completion) entries are the completion's. vLLM computes them from the raw logits (temperature 1)
  and reports -inf as -9999. Transport and retries are phase 2's client (`TeacherClient.post_json`).
  Since a served teacher's log-probs are at temperature 1 and the student's are taken at grpo.temperature,
  `build_teacher_scorer` refuses a served teacher unless grpo.temperature is 1: a teacher identical to the
  student would otherwise have a non-zero advantage on every token, paid for the temperature alone.
  `transformers serve` has no prompt log-probs: the CPU stand-in is the local source.
  Each request re-prefills its whole sequence, the group's shared prompt included, G times per group: vLLM
  (0.33.0, `SamplingParams.__post_init__`) sets `skip_reading_prefix_cache` on every request that asks for prompt
  log-probs (cached positions would have no logits to report), and its OpenAI completion request has no field to
  turn that off; one request per group cannot stand in, since each sample's completion is its own continuation
  of the prompt. What the served path pays extra is the prompt's G - 1 repeats (APPS prompts: median ~745
  tokens) on the 32B teacher; the local source reads each group's prompt once (`shared_prompt`).
- `local`: a model (+ optional LoRA adapter) in this process, one no-grad teacher-forced forward per row
  chunk (`training.batching.chunked_completion_logprobs` at the student's rollout temperature, the one its
  own log-probs are taken at, so a teacher identical to the student has advantage 0; with `shared_prompt`,
  each group's prompt read once: `training.shared_prompt.shared_chunked_completion_logprobs`).

Both refuse a teacher whose tokenizer is not the student's (`check_same_tokenizer`): token ids would mean
other strings and the log-probs would be of nonsense. Qwen3-32B and Qwen3-1.7B share one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from clients.openai_compat import RequestFailedError, TeacherClient
from config import TeacherConfig
from rollouts.completion import RolloutCompletion
from training.batching import (
    autocast_forward,
    chunked_completion_logprobs,
    dropout_disabled,
    pad_rollout_batch,
)
from training.shared_prompt import shared_chunked_completion_logprobs

LOGPROB_SOURCES = ("server", "local")


class TokenizerMismatchError(ValueError):
    """The teacher's tokenizer is not the student's: its log-probs of the student's token ids mean nothing."""


class TeacherScoringError(RuntimeError):
    """The teacher could not score a sample (refused, failed after retries, or answered something else)."""


@dataclass(frozen=True)
class TeacherScores:
    """One rollout batch scored: per sample, the teacher's log-prob of each completion token."""

    logprobs: list[tuple[float, ...]]  # one tuple per sample, len == len(sample.token_ids)
    seconds: float  # wall time of the scoring (all requests / forwards)
    tokens: int  # completion tokens scored

    def metrics(self) -> dict[str, float]:
        return {"opd/teacher_s": self.seconds, "opd/teacher_tokens": float(self.tokens)}


class TeacherScorer(Protocol):
    def score(self, samples: Sequence[RolloutCompletion]) -> TeacherScores: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------------------------- tokenizer identity


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A digest of what a token id means: the whole vocabulary (added tokens included) and the special
    tokens. Two tokenizers with one fingerprint map every id to the same string."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    special = sorted(str(t) for t in tokenizer.all_special_tokens)
    payload = json.dumps({"vocab": vocab, "special": special}, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def check_same_tokenizer(student: Any, teacher: Any, student_name: str, teacher_name: str) -> None:
    """TokenizerMismatchError naming both models and the first differences, unless the two agree."""
    if tokenizer_fingerprint(student) == tokenizer_fingerprint(teacher):
        return
    ours, theirs = student.get_vocab(), teacher.get_vocab()
    our_tokens, their_tokens = {i: t for t, i in ours.items()}, {i: t for t, i in theirs.items()}
    differ = [
        (i, our_tokens.get(i), their_tokens.get(i))
        for i in sorted(set(our_tokens) | set(their_tokens))
        if our_tokens.get(i) != their_tokens.get(i)
    ][:3]
    examples = "; ".join(f"id {i}: {s!r} vs {t!r}" for i, s, t in differ) or (
        f"special tokens differ: {sorted(student.all_special_tokens)} vs {sorted(teacher.all_special_tokens)}"
    )
    raise TokenizerMismatchError(
        f"on-policy distillation needs the teacher to read the student's token ids, but the tokenizers differ: "
        f"student {student_name!r} ({len(ours)} tokens, {tokenizer_fingerprint(student)}) vs teacher "
        f"{teacher_name!r} ({len(theirs)} tokens, {tokenizer_fingerprint(teacher)}); {examples}. Use a teacher of "
        "the student's family (Qwen3-32B for Qwen3-1.7B), or set teacher.tokenizer to the served model's "
        "tokenizer if it was named wrongly."
    )


# ---------------------------------------------------------------------------------- the served teacher


def prompt_logprobs_request(model: str, token_ids: Sequence[int]) -> dict[str, Any]:
    """The body of one scoring request (vLLM 0.33.0's CompletionRequest fields): the sequence as a token-id
    prompt, the log-prob of each of its tokens, one throw-away generated token (greedy: no sampling cost)."""
    return {
        "model": model,
        "prompt": list(token_ids),
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 0,
    }


def parse_prompt_logprobs(raw: Any, token_ids: Sequence[int], num_scored: int) -> tuple[float, ...]:
    """The log-probs of the last `num_scored` of `token_ids` from a scoring answer; ValueError when the answer
    does not hold one entry per prompt token, each with the log-prob of the token that was there."""
    if not isinstance(raw, dict) or not isinstance(raw.get("choices"), list) or not raw["choices"]:
        raise ValueError(f"not a completion response: {str(raw)[:120]!r}")
    entries = raw["choices"][0].get("prompt_logprobs")
    if not isinstance(entries, list):
        raise ValueError(
            "the response has no prompt_logprobs: the server does not return prompt log-probs (vLLM does; "
            "`transformers serve` does not: use teacher.logprob_source=local on CPU)"
        )
    if len(entries) != len(token_ids):
        raise ValueError(f"{len(entries)} prompt log-prob entries for {len(token_ids)} prompt tokens")
    start = len(token_ids) - num_scored
    if num_scored and start < 1:
        raise ValueError("the first prompt token has no log-prob: score a completion after a non-empty prompt")
    out = []
    for position in range(start, len(token_ids)):
        entry = entries[position]
        token = token_ids[position]
        found = entry.get(str(token), entry.get(token)) if isinstance(entry, dict) else None
        if not isinstance(found, dict) or not isinstance(found.get("logprob"), (int, float)):
            raise ValueError(f"no log-prob for token {token} at prompt position {position}")
        value = float(found["logprob"])
        if math.isnan(value):
            raise ValueError(f"the log-prob of token {token} at prompt position {position} is NaN")
        out.append(value)
    return tuple(out)


class ServedTeacherScorer:
    """Scores samples through a served teacher's prompt log-probs, all requests in flight at once (the
    client bounds concurrency at teacher.max_concurrent_requests and retries transient failures)."""

    def __init__(self, client: TeacherClient, model: str) -> None:
        self.client = client
        self.model = model
        self.loop = asyncio.new_event_loop()  # the client's connections live on this one loop

    def check_context(self, longest_prompt: int, budget: int, budget_name: str) -> None:
        """Refuse, before training, a teacher server whose `--max-model-len` cannot hold the longest prompt plus
        `budget` completion tokens plus the one token each scoring request generates: vLLM answers a longer
        request with a 400 (not retried: training would end at the first long sample, hours in). A server whose
        /v1/models does not report the limit is not checked."""
        cards = self.loop.run_until_complete(self.client.model_cards())
        limits = [card.get("max_model_len") for card in cards if not card.get("parent")]
        known = [int(limit) for limit in limits if isinstance(limit, int)]
        needed = longest_prompt + budget + 1
        if known and min(known) < needed:
            raise TeacherScoringError(
                f"the teacher server at {self.client.base_url} holds {min(known)} tokens per sequence "
                f"(--max-model-len) and on-policy distillation needs {needed}: the longest prompt ({longest_prompt} "
                f"tokens) plus {budget} ({budget_name}) plus the one token each scoring request generates. Restart "
                f"it with --max-model-len {needed} or more, or lower {budget_name}."
            )

    def score(self, samples: Sequence[RolloutCompletion]) -> TeacherScores:
        start = time.monotonic()

        async def one(sample: RolloutCompletion) -> tuple[float, ...]:
            ids = [*sample.prompt_ids, *sample.token_ids]
            try:
                result, _ = await self.client.post_json(
                    "/completions",
                    prompt_logprobs_request(self.model, ids),
                    parse=lambda raw: parse_prompt_logprobs(raw, ids, len(sample.token_ids)),
                )
            except RequestFailedError as failed:
                raise TeacherScoringError(
                    f"the teacher at {self.client.base_url} could not score a sample ({len(ids)} tokens): {failed}"
                ) from None
            return result

        async def every() -> list[tuple[float, ...]]:
            return list(await asyncio.gather(*(one(s) for s in samples)))

        logprobs = self.loop.run_until_complete(every())
        return TeacherScores(logprobs, time.monotonic() - start, sum(len(s.token_ids) for s in samples))

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


# ---------------------------------------------------------------------------------- a local teacher


class LocalTeacherScorer:
    """Scores samples with a model in this process: teacher-forced, no grad, `chunk_size` rows per forward."""

    def __init__(
        self, model: Any, pad_token_id: int, chunk_size: int = 4, shared_prompt: bool = False, temperature: float = 1.0
    ) -> None:
        self.model = model
        self.temperature = temperature  # the student's rollout temperature: its log-probs are taken at it
        self.pad_token_id = pad_token_id
        self.chunk_size = chunk_size
        self.shared_prompt = shared_prompt  # each group's prompt forwarded once (training.shared_prompt)

    def score(self, samples: Sequence[RolloutCompletion]) -> TeacherScores:
        start = time.monotonic()
        device = next(self.model.parameters()).device
        batch = {k: v.to(device) for k, v in pad_rollout_batch(samples, self.pad_token_id).items()}
        with torch.no_grad(), dropout_disabled(self.model):
            forward = shared_chunked_completion_logprobs if self.shared_prompt else chunked_completion_logprobs
            values = forward(self.model, batch, self.chunk_size, self.temperature).cpu()  # (B, T)
        logprobs = [tuple(values[i, : len(s.token_ids)].tolist()) for i, s in enumerate(samples)]
        return TeacherScores(logprobs, time.monotonic() - start, sum(len(s.token_ids) for s in samples))

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------- from the config


def build_teacher_scorer(
    teacher: TeacherConfig,
    student_tokenizer: Any,
    *,
    student_name: str,
    cache_dir: str = "",
    torch_dtype: str = "float32",
    device: Any = None,
    chunk_size: int = 4,
    shared_prompt: bool = False,
    temperature: float = 1.0,
    autocast: str = "off",
) -> TeacherScorer:
    """The scorer `teacher.logprob_source` names, after checking the teacher's tokenizer is the student's.

    server: the tokenizer is loaded from teacher.tokenizer (else teacher.model_name; an embedded name resolves
    to its folder); the requests go to teacher.api_url for teacher.model_name. local: teacher.model_name is
    loaded here, with teacher.local_adapter on it when set. `temperature`: the student's rollout temperature
    (grpo.temperature); the local teacher is scored at it, a served one (temperature 1) is refused unless it is 1.
    `autocast`: the student's training.autocast; the local teacher's forwards run under the same, so a teacher equal
    to the student scores its tokens exactly as the student does (OPD pays for the models' difference, not for
    rounding)."""
    from utils.student_model import load_adapter, load_student, load_tokenizer, served_model_name

    name = teacher.model_name
    if teacher.logprob_source == "local":
        model, tokenizer = load_student(name, torch_dtype, False, cache_dir, device=device)
        check_same_tokenizer(student_tokenizer, tokenizer, student_name, name)
        if teacher.local_adapter:
            model = load_adapter(model, teacher.local_adapter)
        model.eval()
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        if autocast != "off":
            autocast_forward(model, autocast)
        return LocalTeacherScorer(model, student_tokenizer.pad_token_id, chunk_size, shared_prompt, temperature)
    if temperature != 1.0:
        raise TeacherScoringError(
            f"on-policy distillation with a served teacher needs grpo.temperature=1 (it is {temperature}): the "
            "server's prompt log-probs are at temperature 1 and the student's at grpo.temperature, so the advantage "
            "would pay for the temperature; set grpo.temperature=1 or teacher.logprob_source=local."
        )
    tokenizer_name = teacher.tokenizer_name
    check_same_tokenizer(student_tokenizer, load_tokenizer(tokenizer_name, cache_dir), student_name, tokenizer_name)
    served = served_model_name(name, cache_dir)
    return ServedTeacherScorer(TeacherClient.from_config(teacher, model=served), served)
