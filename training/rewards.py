"""Rewards: from sandbox verdicts and parsed responses to one scalar per sample (pure, no I/O).

A reward function has the signature ``(results, parsed) -> list[float | None]`` where ``results``
are `sandbox.judge.ExecutionResult`s and ``parsed`` the `ParsedResponse`s of
`utils.thinking_extraction.extract_thinking_and_code_unified`. ``None`` means "could not be
verified" (the sandbox itself failed): such a sample gets no advantage at all, rather than being
punished as wrong. The trainer re-runs such a program once; if the harness fails on it again, it
counts as a failure (`confirmed_failures`), so breaking the harness is never rewarded.

- correctness ``binary``: 1.0 if every test passed, else 0.0 (the product's GRPO reward);
- correctness ``fraction``: the share of the tests that passed (partial credit; the CPU preset uses it,
  because a 135M student rarely passes every test and binary rewards would be almost all zero).
  Both are computed on the tests the prompt does not show (`utils.shown_tests`): the trainer runs a
  program on its task's hidden tests only, since a program can pass a shown test by printing its
  literal answer; a task whose prompt shows every test gives no correctness signal (None, `ungraded`);
- ``format``: 1.0 for the requested shape (closed ``<think>`` then a ```` ```python ```` block),
  0.5 for code in any other shape, 0.0 for no code; added with a small weight.

Your own reward functions (``grpo.reward_funcs``, TRL's signature): ``fn(prompts, completions, **columns)
-> list[float | None]``, one value per completion, named by import path ``package.module:function`` or a
file ``path/to/file.py:function``, each added with its weight (``grpo.reward_weights``, default 1.0) to
the built-in total. ``prompts`` are the user prompts and ``completions`` the raw completion texts;
``columns`` holds one list per key, aligned with them: the task's ``task_id``, ``source``,
``problem``, ``test_type``, ``tests``, ``difficulty``, ``fn_name``, and what this pipeline already
computed: the extracted ``code``, the sandbox ``status`` and ``pass_fraction``. As in TRL, ``None``
means "this function does not apply to that sample": it adds nothing (the sample keeps the built-in
reward); only the built-in correctness can make a sample unscorable. Accept ``**kwargs``: more
columns may be added.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollouts.completion import RolloutCompletion
from sandbox.judge import ExecutionResult
from utils.dataset_loader import Task
from utils.thinking_extraction import ParsedResponse

RewardFunction = Callable[[Sequence[Any], Sequence[ParsedResponse]], list[float | None]]


def _unverifiable(result: Any) -> bool:
    """A harness failure, or a verdict that came from inside the program's process (a test no
    process outside it can judge: the program could forge it; see docs/sandbox.md, class 7)."""
    return result.status == "sandbox_error" or getattr(result, "untrusted_tests", 0) > 0


def binary_correctness(results: Sequence[Any], parsed: Sequence[ParsedResponse]) -> list[float | None]:
    return [None if _unverifiable(r) else float(r.passed) for r in results]


def fraction_correctness(results: Sequence[Any], parsed: Sequence[ParsedResponse]) -> list[float | None]:
    """The share of the tests run that passed, per result (a run that stopped early counts its unreached
    tests as failed)."""
    return [None if _unverifiable(r) else float(r.pass_fraction) for r in results]


def format_scores(parsed: Sequence[ParsedResponse]) -> list[float]:
    """1.0 for the requested shape, 0.5 for code in any other shape, 0.0 for no code (never None)."""
    return [1.0 if p.well_formed else 0.5 if p.has_code else 0.0 for p in parsed]


def format_reward(results: Sequence[Any], parsed: Sequence[ParsedResponse]) -> list[float | None]:
    return list(format_scores(parsed))


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


UserRewardFunction = Callable[..., list[float | None]]  # TRL: fn(prompts, completions, **columns)


class RewardFunctionError(ValueError):
    """A user reward function that cannot be loaded or returned something unusable; names the function."""


@dataclass(frozen=True)
class UserReward:
    name: str  # the spec as configured, e.g. "my_rewards:brevity"
    function: UserRewardFunction
    weight: float


def load_reward_function(spec: str) -> UserRewardFunction:
    """'package.module:function' or 'path/to/file.py:function' -> the function."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise RewardFunctionError(f"grpo.reward_funcs: {spec!r} is not 'module:function' or 'file.py:function'.")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).expanduser()
            if not path.is_file():
                raise RewardFunctionError(f"grpo.reward_funcs: {spec!r}: no file {path}.")
            loader_spec = importlib.util.spec_from_file_location(f"tgrpo_user_rewards_{path.stem}", path)
            if loader_spec is None or loader_spec.loader is None:  # a .py path always has one
                raise RewardFunctionError(f"grpo.reward_funcs: {spec!r}: {path} cannot be loaded as a module.")
            module = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except RewardFunctionError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the user's module raises while importing
        raise RewardFunctionError(
            f"grpo.reward_funcs: cannot import {module_name!r} for {spec!r} ({type(exc).__name__}: {exc})."
        ) from None
    function = getattr(module, attr, None)
    if not callable(function):
        raise RewardFunctionError(f"grpo.reward_funcs: {module_name!r} has no function {attr!r}.")
    return function


def load_reward_functions(specs: Sequence[str], weights: Sequence[float] = ()) -> list[UserReward]:
    if weights and len(weights) != len(specs):
        raise RewardFunctionError(f"grpo.reward_weights has {len(weights)} values for {len(specs)} grpo.reward_funcs.")
    return [
        UserReward(spec, load_reward_function(spec), float(weights[i]) if weights else 1.0)
        for i, spec in enumerate(specs)
    ]


def reward_columns(tasks: Sequence[Any], parsed: Sequence[ParsedResponse], results: Sequence[Any]) -> dict[str, list]:
    """The keyword columns a user reward function receives, one entry per completion."""
    return {
        "task_id": [t.task_id for t in tasks],
        "source": [t.source for t in tasks],
        "problem": [t.problem for t in tasks],
        "test_type": [t.test_type for t in tasks],
        "tests": [list(t.tests) for t in tasks],
        "difficulty": [t.difficulty for t in tasks],
        "fn_name": [t.fn_name for t in tasks],
        "code": [p.code for p in parsed],
        "status": [r.status for r in results],
        "pass_fraction": [r.pass_fraction for r in results],
    }


def _call_user_reward(
    reward: UserReward, prompts: Sequence[str], completions: Sequence[str], columns: dict[str, list]
) -> list[float | None]:
    values = reward.function(prompts=list(prompts), completions=list(completions), **columns)
    if not isinstance(values, (list, tuple)) or len(values) != len(completions):
        got = f"{len(values)} values" if isinstance(values, (list, tuple)) else type(values).__name__
        raise RewardFunctionError(
            f"reward function {reward.name} returned {got} for {len(completions)} completions; "
            "it must return one float (or None) per completion."
        )
    out = []
    for v in values:
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise RewardFunctionError(
                f"reward function {reward.name} returned {v!r}; rewards are finite numbers or None."
            )
        out.append(None if v is None else float(v))
    return out


@dataclass(frozen=True)
class Reward:
    total: float | None  # None: unverifiable, excluded from advantages
    correctness: float | None
    format: float
    user: dict[str, float | None] = field(default_factory=dict)  # each user reward function's raw value
    shaping: float = 0.0  # the multi-turn terms (tool use, turn cost; `shaping_reward`)

    @property
    def bonus(self) -> float:
        """The shaping part of `total` (weighted format bonus, user rewards, multi-turn terms), which the
        advantage centres but does not scale; 0 for an unscorable sample."""
        return self.total - self.correctness if self.total is not None and self.correctness is not None else 0.0


@dataclass(frozen=True)
class ScoredSample:
    """One rollout sample after the sandbox and the rewards: what the trainer's update plan, batching and
    self-SFT read. Built once per sample by `training.scoring.score_rollouts`, never changed afterwards."""

    task: Task
    completion: RolloutCompletion
    parsed: ParsedResponse
    result: ExecutionResult
    reward: Reward


def compute_rewards(
    results: Sequence[Any],
    parsed: Sequence[ParsedResponse],
    *,
    correctness: str = "binary",
    format_weight: float = 0.1,
    user_rewards: Sequence[UserReward] = (),
    prompts: Sequence[str] = (),
    completions: Sequence[str] = (),
    columns: dict[str, list] | None = None,
    confirmed_failures: Collection[int] = (),
    shaping: Sequence[float] = (),
    ungraded: Collection[int] = (),
) -> list[Reward]:
    """total = correctness + format_weight * format + sum(weight * user value) + shaping, or None when
    correctness is None.

    A user function's None adds nothing to that sample (TRL's convention: the function does not apply).
    `shaping`: one multi-turn term per sample (empty: 0), like the format bonus part of the shaping
    reward, which the advantage centres but does not scale.
    `confirmed_failures`: indices whose program made the harness fail again when re-run. They score as
    failures (correctness 0), not as unverifiable: an unverifiable sample gets advantage 0, which in a
    group of wrong answers is better than theirs, so a program that can break the harness would be
    rewarded for it.
    `ungraded`: indices whose task has no hidden test (its prompt shows every test): correctness None, like
    an unverifiable sample, since passing what the prompt printed is no evidence of solving.
    """
    if correctness not in CORRECTNESS_REWARDS:
        raise ValueError(f"unknown correctness reward {correctness!r}; valid: {', '.join(CORRECTNESS_REWARDS)}")
    if len(results) != len(parsed):
        raise ValueError(f"{len(results)} results but {len(parsed)} parsed responses")
    if shaping and len(shaping) != len(results):
        raise ValueError(f"{len(shaping)} shaping terms for {len(results)} results")
    correct = get_reward_function(correctness)(results, parsed)
    correct = [None if i in ungraded else 0.0 if i in confirmed_failures else c for i, c in enumerate(correct)]
    fmt = format_scores(parsed)
    user = {r.name: _call_user_reward(r, prompts, completions, columns or {}) for r in user_rewards}
    weights = {r.name: r.weight for r in user_rewards}
    out = []
    for i, (c, f) in enumerate(zip(correct, fmt, strict=True)):
        values = {name: column[i] for name, column in user.items()}
        extra = sum(weights[name] * v for name, v in values.items() if v is not None)
        shaped = float(shaping[i]) if shaping else 0.0
        out.append(Reward(None if c is None else c + format_weight * f + extra + shaped, c, f, values, shaped))
    return out


def shaping_reward(
    record: RolloutCompletion, tool_call_reward: float, tool_reward_cap: float, turn_cost: float
) -> float:
    """The optional multi-turn reward terms of one sample (0 when off, and for single-turn records):
    + tool_call_reward per program that ran without error, at most tool_reward_cap in all;
    - turn_cost per extra turn (feedback: answers after the first; tool: programs asked for)."""
    info = record.multi_turn
    if info is None or info.mode not in ("tool", "feedback"):
        return 0.0
    tool = info.mode == "tool"
    bonus = min(tool_call_reward * info.tool_successes, tool_reward_cap) if tool else 0.0
    extra_turns = info.tool_calls if tool else max(info.num_turns - 1, 0)
    return bonus - turn_cost * extra_turns
