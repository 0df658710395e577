"""The one multi-turn rollout loop, for every backend and both environments.

All samples of a step advance together, turn by turn: each round, every active sample's token ids
(prompt + everything so far) go to the backend in one call, which continues each by at most its
remaining budget and stops at an end-of-turn id or at one of the environment's stop strings; the
environment then answers each turn (`environments.code_env`), and its observation is tokenized
and appended. A backend is anything with

    continue_sequences(sequences: list[list[int]], max_new_tokens: list[int],
                       stop_strings: tuple[str, ...]) -> list[Continuation]

(every `rollouts.protocol.Sampler`, and the scripted policies of the preflight and tests).

Token ids are the single truth: the policy's ids are kept exactly as sampled (never decoded and
re-encoded), observations are encoded once and appended, and the next turn continues from exactly
those ids. So the sequence the trainer scores is byte-for-byte the one the policy saw.

- tool observations are plain text inside the same assistant turn (`<result>` blocks);
- feedback observations are a user turn of the chat template: the tokens the template puts between
  the end of an assistant message and the next assistant header (`utils.sft_data.environment_turn_ids`,
  the one function teacher-SFT also frames environment turns with, so training on a multi-turn trace
  and sampling one give the same ids).
Text an environment inserts is encoded with `split_special_tokens=True`: a program that prints
`<|im_end|>` produces those characters, never the end-of-turn token.

Each sample carries an action mask, one entry per token after the prompt: 1 = sampled by the policy,
0 = inserted by the environment (result blocks, feedback turns with their template framing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from environments.code_env import EpisodeState, Step, Turn
from rollouts.completion import MultiTurnInfo, RolloutCompletion
from rollouts.protocol import Continuation
from utils.dataset_loader import Task
from utils.sft_data import encode_inserted_text, environment_turn_ids


class ContinueBackend(Protocol):
    def continue_sequences(
        self, sequences: list[list[int]], max_new_tokens: list[int], stop_strings: tuple[str, ...]
    ) -> list[Continuation]: ...


class Environment(Protocol):
    stop_strings: tuple[str, ...]

    def start(self, task: Task) -> EpisodeState: ...

    def step(self, states: Sequence[EpisodeState], turns: Sequence[Turn]) -> list[Step]: ...


@dataclass
class Episode:
    """One sample in flight."""

    prompt_ids: list[int]
    state: EpisodeState
    token_ids: list[int] = field(default_factory=list)
    action_mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)
    done: bool = False
    truncated: bool = False

    def append(self, ids: list[int], policy: bool, logprobs: list[float] | None = None) -> None:
        self.token_ids += ids
        self.action_mask += [int(policy)] * len(ids)
        if self.logprobs is None:
            return
        if not policy:
            self.logprobs += [0.0] * len(ids)
        elif logprobs is None:
            self.logprobs = None  # this backend gives none: the record has none
        else:
            self.logprobs += list(logprobs)


def _record(episode: Episode, mode: str) -> RolloutCompletion:
    """The rollout record: a completion whose token ids hold every turn, with its `MultiTurnInfo`."""
    policy_turns = episode.turns
    answers = [t["text"] for t in policy_turns]
    last = policy_turns[-1] if policy_turns else {"text": "", "finish_reason": "length"}
    pieces = []
    for turn in policy_turns:
        pieces.append(turn["text"])
        if turn.get("observation") is not None:
            pieces.append(turn["observation"])
        if turn.get("feedback") is not None:  # a user turn: shown as such (its ids are the template's)
            pieces.append(f"\n\n[feedback]\n{turn['feedback']}\n\n")
    transcript = "".join(pieces)
    # what the reward scores: only text the policy sampled. Tool mode: its own spans, one turn per line,
    # never a `<result>` block (a program could print `</think>` and a solution there); feedback: the last answer
    graded = "\n".join(answers) if mode == "tool" else last["text"]
    return RolloutCompletion(
        text=graded,
        token_ids=tuple(episode.token_ids),
        prompt_ids=tuple(episode.prompt_ids),
        finish_reason="stop" if last["finish_reason"] == "stop" else "length",
        logprobs=tuple(episode.logprobs) if episode.logprobs is not None and episode.token_ids else None,
        action_mask=tuple(episode.action_mask),
        multi_turn=MultiTurnInfo(
            mode=mode,
            turns=tuple(episode.turns),
            answers=tuple(answers) if mode == "feedback" else (graded,),
            transcript=transcript,
            truncated=episode.truncated,
            tool_calls=episode.state.tool_calls,
            tool_successes=episode.state.tool_successes,
        ),
    )


def run_episodes(
    backend: ContinueBackend,
    environment: Environment,
    tokenizer: Any,
    prompt_ids: Sequence[list[int]],
    tasks: Sequence[Task],
    *,
    mode: str,
    max_new_tokens: int,
    max_total_tokens: int,
    chat_template_kwargs: dict | None = None,
    progress: Any = None,
) -> list[RolloutCompletion]:
    """Run every (prompt, task) pair to the end; one record per pair, in order.

    `max_new_tokens` bounds one policy turn, `max_total_tokens` everything after the prompt. A
    sample that reaches a limit (tokens, turns) ends with `truncated` set and is scored on its last
    answer.
    """
    episodes = [Episode(list(p), environment.start(t)) for p, t in zip(prompt_ids, tasks, strict=True)]
    while True:
        active = [e for e in episodes if not e.done]
        if not active:
            break
        budgets = [min(max_new_tokens, max_total_tokens - len(e.token_ids)) for e in active]
        for e, b in zip(active, budgets, strict=True):
            if b <= 0:
                e.done = e.truncated = True
        active = [e for e, b in zip(active, budgets, strict=True) if b > 0]
        if not active:
            break
        outputs = backend.continue_sequences(
            [e.prompt_ids + e.token_ids for e in active],
            [min(max_new_tokens, max_total_tokens - len(e.token_ids)) for e in active],
            tuple(environment.stop_strings),
        )
        for e, out in zip(active, outputs, strict=True):
            e.append(list(out.token_ids), True, out.logprobs)
        steps = environment.step([e.state for e in active], [Turn(o.text, o.finish_reason) for o in outputs])
        for e, out, step in zip(active, outputs, steps, strict=True):
            turn = {"text": out.text, "finish_reason": out.finish_reason, "observation": None, **step.info}
            e.turns.append(turn)
            if step.done:
                e.done, e.truncated = True, step.truncated
                continue
            assert step.observation is not None, "an environment step that goes on has an observation"
            ids = (
                environment_turn_ids(tokenizer, {"role": "user", "content": step.observation}, chat_template_kwargs)
                if step.as_user_message
                else encode_inserted_text(tokenizer, step.observation)
            )
            if len(e.token_ids) + len(ids) >= max_total_tokens:  # no room left for the policy to answer it
                e.done = e.truncated = True
                continue
            turn["feedback" if step.as_user_message else "observation"] = step.observation
            e.append(ids, False)
        if progress is not None:
            progress(sum(e.done for e in episodes), len(episodes))
    return [_record(e, mode) for e in episodes]
