"""Rewards: from sandbox verdicts and parsed responses to one scalar per sample (pure, no I/O).

A reward function has the signature ``(results, parsed) -> list[float | None]`` where ``results``
are `evaluation.code_executor.ExecutionResult`s and ``parsed`` the dicts of
`utils.thinking_extraction.extract_thinking_and_code_unified`. ``None`` means "could not be
verified" (the sandbox itself failed): such a sample gets no advantage at all, rather than being
punished as wrong.

- correctness ``binary``: 1.0 if every test passed, else 0.0 (the product's GRPO reward);
- correctness ``fraction``: the share of tests passed (partial credit; the CPU preset uses it,
  because a 135M student rarely passes every test and binary rewards would be almost all zero);
- ``format``: 1.0 for the requested shape (closed ``<think>`` then a ```` ```python ```` block),
  0.5 for code in any other shape, 0.0 for no code; added with a small weight.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

RewardFunction = Callable[[Sequence[Any], Sequence[dict]], list[float | None]]


def binary_correctness(results: Sequence[Any], parsed: Sequence[dict]) -> list[float | None]:
    return [None if r.status == "sandbox_error" else float(r.passed) for r in results]


def fraction_correctness(results: Sequence[Any], parsed: Sequence[dict]) -> list[float | None]:
    return [None if r.status == "sandbox_error" else float(r.pass_fraction) for r in results]


def format_reward(results: Sequence[Any], parsed: Sequence[dict]) -> list[float | None]:
    return [1.0 if p.get("well_formed") else 0.5 if p.get("has_code") else 0.0 for p in parsed]


REWARD_FUNCTIONS: dict[str, RewardFunction] = {
    "binary": binary_correctness,
    "fraction": fraction_correctness,
    "format": format_reward,
}
CORRECTNESS_REWARDS = ("binary", "fraction")


def get_reward_function(name: str) -> RewardFunction:
    if name not in REWARD_FUNCTIONS:
        raise ValueError(f"unknown reward {name!r}; valid rewards: {', '.join(REWARD_FUNCTIONS)}")
    return REWARD_FUNCTIONS[name]


@dataclass(frozen=True)
class Reward:
    total: float | None  # None: unverifiable, excluded from advantages
    correctness: float | None
    format: float


def compute_rewards(results: Sequence[Any], parsed: Sequence[dict], correctness: str = "binary",
                    format_weight: float = 0.1) -> list[Reward]:
    """total = correctness + format_weight * format, or None when correctness is None."""
    if correctness not in CORRECTNESS_REWARDS:
        raise ValueError(f"unknown correctness reward {correctness!r}; valid: {', '.join(CORRECTNESS_REWARDS)}")
    if len(results) != len(parsed):
        raise ValueError(f"{len(results)} results but {len(parsed)} parsed responses")
    correct = get_reward_function(correctness)(results, parsed)
    fmt = format_reward(results, parsed)
    return [Reward(None if c is None else c + format_weight * f, c, f) for c, f in zip(correct, fmt, strict=True)]
