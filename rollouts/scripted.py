"""A policy that says what it is told: the `Sampler` of the preflight's multi-turn check and the tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rollouts.completion import RolloutCompletion, stop_ids
from rollouts.protocol import Continuation, SamplerBase, cut_continuation
from utils.sft_data import end_of_turn_id


class ScriptedBackend(SamplerBase):
    """A policy that answers from a script: `script(sequence_index, turn_index) -> text`.

    The text is encoded with the tokenizer (markup in it stays characters); a turn that contains a stop
    string is cut after it (finish "stop_string"), otherwise it ends with the end-of-turn id (finish "stop"), unless the
    budget cuts it first ("length"). Sequences are told apart by their first call's order.
    """

    def __init__(
        self,
        tokenizer: Any,
        script: Callable[[int, int], str],
        max_new_tokens: int = 256,
        chat_template_kwargs: dict | None = None,
    ) -> None:
        super().__init__(tokenizer, max_new_tokens, chat_template_kwargs=chat_template_kwargs)
        self.script = script
        self.calls: list[list[list[int]]] = []  # every batch of sequences it was asked to continue
        self._live: list[list] = []  # [ids so far, sample index, turns taken], one per sample seen

    def _claim(self, sequence: list[int], taken: set[int]) -> list:
        """The sample this sequence continues: the longest unclaimed known prefix, else a new sample."""
        matches = [
            e
            for e in self._live
            if id(e) not in taken and len(e[0]) <= len(sequence) and tuple(sequence[: len(e[0])]) == e[0]
        ]
        entry = max(matches, key=lambda e: len(e[0]), default=None)
        if entry is None:
            entry = [tuple(sequence), len(self._live), 0]
            self._live.append(entry)
        taken.add(id(entry))
        return entry

    def continue_sequences(
        self, sequences: list[list[int]], max_new_tokens: list[int], stop_strings: tuple[str, ...]
    ) -> list[Continuation]:
        self.calls.append([list(s) for s in sequences])
        out: list[Continuation] = []
        taken: set[int] = set()
        entries = [self._claim(s, taken) for s in sequences]  # claimed before any entry moves on
        for sequence, budget, entry in zip(sequences, max_new_tokens, entries, strict=True):
            text = self.script(entry[1], entry[2])
            hit = min((text.index(s) + len(s) for s in stop_strings if s in text), default=None)
            if hit is not None:
                text = text[:hit]
            ids = list(self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
            if hit is None:
                ids.append(end_of_turn_id(self.tokenizer))
            cont = cut_continuation(self.tokenizer, ids, budget, stop_ids(self.tokenizer), stop_strings)
            entry[0], entry[2] = tuple(sequence) + tuple(cont.token_ids), entry[2] + 1
            out.append(cont)
        return out

    def sample(self, prompts: list[str], num_samples: int, *, seed: int | None = None) -> list[list[RolloutCompletion]]:
        """The script's first turn, `num_samples` times per prompt (each a sample of its own)."""
        encoded = [self.encode(p) for p in prompts]
        flat = [ids for ids in encoded for _ in range(num_samples)]
        turns = self.continue_sequences(flat, [self.max_new_tokens] * len(flat), ())
        records = [
            RolloutCompletion(c.text, tuple(c.token_ids), tuple(ids), c.finish_reason)
            for ids, c in zip(flat, turns, strict=True)
        ]
        return [records[k * num_samples : (k + 1) * num_samples] for k in range(len(prompts))]
