"""The backend primitive of the multi-turn loop: continue token-id sequences.

    continue_sequences(sequences, max_new_tokens, stop_strings) -> list[Continuation]

Each sequence (prompt + turns so far, as ids) is continued by at most its own `max_new_tokens`,
stopping at an end-of-turn id (finish "stop", the id kept as the last new id) or when the text of
the new ids contains one of `stop_strings` (finish "stop_string": the new ids end with the token that
completed it; nothing after that token is kept), else "length".

- `HFContinuer`: transformers `generate` in left-padded batches.
- `KVContinuer`: the batched KV-cache CPU sampler (`rollouts.kv_sampler.KVCacheRollout.continue_ids`),
  with its per-token log-probs (the trainer's importance weights correct its bf16 copy).
- `VLLMContinuer`: a vLLM engine (`LLM.generate` with `prompt_token_ids`), with the sampler's
  log-probs; tested through tests/fake_vllm.py.
- `ServerContinuer`: a running `vllm serve` (`POST /v1/completions` with prompt token ids, the
  environment's stop strings and `return_token_ids`), with the sampler's log-probs; tested through
  tests/fake_openai_server.py's FakeVLLMServer, its request body against vLLM's CompletionRequest.
- `ScriptedBackend`: a policy that says what it is told, for the tests and the preflight.

`continuer_for(rollout)` picks the continuer of a single-turn rollout backend (the one place that
maps one to the other; phases 3 and 4 both use it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from multiturn.loop import Continuation
from rollouts.completion import stop_ids
from rollouts.hf import generation_eos_ids, left_padded
from rollouts.sampling import FULL_SOFTMAX, SamplingSettings
from utils.sft_data import end_of_turn_id


def cut_continuation(
    tokenizer: Any, ids: Sequence[int], budget: int, stop_ids: Sequence[int], stop_strings: Sequence[str]
) -> Continuation:
    """The continuation a backend should return for raw sampled `ids` (which may run past a stop:
    a batch keeps sampling other rows, and finished rows are padded)."""
    stops = set(stop_ids)
    last_chars = {s[-1] for s in stop_strings if s}
    for j, token in enumerate(ids[:budget]):
        if token in stops:
            kept = list(ids[: j + 1])
            return Continuation(kept, tokenizer.decode(kept[:-1], skip_special_tokens=True), "stop")
        if stop_strings and any(c in tokenizer.decode([token]) for c in last_chars):
            kept = list(ids[: j + 1])
            text = tokenizer.decode(kept, skip_special_tokens=True)
            if any(s in text for s in stop_strings):
                return Continuation(kept, text, "stop_string")
    kept = list(ids[:budget])
    return Continuation(kept, tokenizer.decode(kept, skip_special_tokens=True), "length")


class HFContinuer:
    """`continue_sequences` with transformers `generate`, with the single-turn HF sampler's settings
    (`SamplingSettings`, passed whole) and stop ids (end of turn, EOS, the generation config's EOS)."""

    def __init__(
        self, model: Any, tokenizer: Any, sampling: SamplingSettings = FULL_SOFTMAX, batch_size: int = 8
    ) -> None:
        self.model, self.tokenizer, self.sampling, self.batch_size = model, tokenizer, sampling, batch_size

    @torch.no_grad()
    def continue_sequences(
        self, sequences: list[list[int]], max_new_tokens: list[int], stop_strings: tuple[str, ...]
    ) -> list[Continuation]:
        tok, model = self.tokenizer, self.model
        stops = sorted(set(stop_ids(tok)) | generation_eos_ids(model))
        device = next(model.parameters()).device
        sampling = self.sampling.hf_generate_kwargs()
        if stop_strings:
            sampling.update(stop_strings=list(stop_strings), tokenizer=tok)
        was_training = model.training
        model.eval()  # no dropout while sampling
        results: list[Continuation] = []
        try:
            for start in range(0, len(sequences), self.batch_size):
                chunk = sequences[start : start + self.batch_size]
                budgets = max_new_tokens[start : start + self.batch_size]
                input_ids, attention = left_padded(chunk, tok.pad_token_id, device)
                output = model.generate(
                    input_ids=input_ids,
                    attention_mask=attention,
                    max_new_tokens=max(budgets),
                    eos_token_id=stops,
                    pad_token_id=tok.pad_token_id,
                    **sampling,
                )
                for row, budget in zip(output[:, input_ids.shape[1] :].tolist(), budgets, strict=True):
                    results.append(cut_continuation(tok, row, budget, stops, stop_strings))
        finally:
            model.train(was_training)
        return results


class VLLMContinuer:
    """`continue_sequences` on a vLLM engine: one `generate` call for all sequences, one `SamplingParams` each.

    `vllm_module` is the imported `vllm` (or tests/fake_vllm.py's stand-in); `lora_request` the
    adapter to sample with (None: the base model). vLLM keeps the stop token as the last id, and
    with a stop string keeps the ids up to the token that completed it
    (`include_stop_str_in_output` keeps the tag in the text too).
    """

    def __init__(
        self,
        llm: Any,
        vllm_module: Any,
        tokenizer: Any,
        sampling: SamplingSettings = FULL_SOFTMAX,
        lora_request: Any = None,
        logprobs: bool = True,
    ) -> None:
        self.llm, self.vllm, self.tokenizer = llm, vllm_module, tokenizer
        self.sampling, self.lora_request, self.logprobs = sampling, lora_request, logprobs
        self.on_close: Callable[[], None] | None = None  # set by `continuer_for`: prune, sleep

    def close(self) -> None:
        """Called once the episodes of a `generate` are over."""
        if self.on_close is not None:
            self.on_close()

    def continue_sequences(
        self, sequences: list[list[int]], max_new_tokens: list[int], stop_strings: tuple[str, ...]
    ) -> list[Continuation]:
        stops = stop_ids(self.tokenizer)
        shared = {**self.sampling.vllm_kwargs(), "n": 1, "stop_token_ids": stops, "skip_special_tokens": True}
        if self.logprobs:
            shared["logprobs"] = 0  # the sampled token's own log-prob
        if stop_strings:
            shared.update(stop=list(stop_strings), include_stop_str_in_output=True)
        # one call, one SamplingParams per sequence: after the first turn most samples have a budget of their own,
        # and a call per distinct budget would decode them nearly one at a time (vLLM batches across params)
        params = [self.vllm.SamplingParams(**shared, max_tokens=budget) for budget in max_new_tokens]
        outputs = self.llm.generate(
            [{"prompt_token_ids": ids} for ids in sequences], params, lora_request=self.lora_request, use_tqdm=False
        )
        results: list[Continuation] = []
        for output in outputs:
            c = output.outputs[0]
            ids = list(c.token_ids)
            if c.finish_reason == "stop" and isinstance(c.stop_reason, str):
                finish = "stop_string"
            elif c.finish_reason == "stop" or (ids and ids[-1] in stops):
                finish = "stop"
            else:
                finish = "length"
            logprobs = (
                [step[t].logprob for t, step in zip(c.token_ids, c.logprobs, strict=True)]
                if getattr(c, "logprobs", None)
                else None
            )
            results.append(Continuation(ids, c.text, finish, logprobs))
        return results


def server_continuation(raw: Any, prompt_ids: list[int], stops: set[int]) -> Continuation:
    """One `/v1/completions` answer (n=1, return_token_ids) as a Continuation, read as single-turn sampling
    reads it (`rollouts.vllm_server.parse_completions`); vLLM names a stop string it stopped on in
    `stop_reason` (the ids end with the token that completed it, the text with the string). ValueError when
    the answer is not what was asked for."""
    from rollouts.vllm_server import parse_completions

    [sample] = parse_completions(raw, prompt_ids, 1, stops)
    finish = "stop_string" if sample.stop_string else sample.finish_reason
    logprobs = list(sample.logprobs) if sample.logprobs is not None else None
    return Continuation(list(sample.token_ids), sample.text, finish, logprobs)


class ServerContinuer:
    """`continue_sequences` on a running `vllm serve` (`rollouts.vllm_server.VLLMServerRollout`), sampling from
    the adapter the server loaded as `model_name`, one request per sequence, all in flight at once."""

    def __init__(self, rollout: Any, model_name: str) -> None:
        self.rollout, self.model_name = rollout, model_name

    def continue_sequences(
        self, sequences: list[list[int]], max_new_tokens: list[int], stop_strings: tuple[str, ...]
    ) -> list[Continuation]:
        from rollouts.vllm_server import completion_request

        r = self.rollout
        stops = stop_ids(r.tokenizer)
        bodies = [
            completion_request(self.model_name, ids, 1, budget, r.sampling, stops, r.logprobs, stop_strings)
            for ids, budget in zip(sequences, max_new_tokens, strict=True)
        ]
        return r.post_completions(bodies, lambda body, raw: server_continuation(raw, body["prompt"], set(stops)))


class KVContinuer:
    """`continue_sequences` with the KV-cache sampler of `rollouts.kv_sampler` (its sampling copy of
    `model` is refreshed from the current adapter at each call), one `continue_ids` call per distinct
    budget. Its records keep the sampler's float32 log-probs, one per new id."""

    def __init__(self, rollout: Any, model: Any) -> None:
        self.rollout, self.model = rollout, model

    def continue_sequences(
        self, sequences: list[list[int]], max_new_tokens: list[int], stop_strings: tuple[str, ...]
    ) -> list[Continuation]:
        results: list[Continuation | None] = [None] * len(sequences)
        for budget in sorted(set(max_new_tokens)):
            rows = [i for i, b in enumerate(max_new_tokens) if b == budget]
            groups = self.rollout.continue_ids(self.model, [sequences[i] for i in rows], 1, budget, stop_strings)
            for i, [record] in zip(rows, groups, strict=True):
                finish = "stop_string" if record.stop_string else record.finish_reason
                logprobs = list(record.logprobs) if record.logprobs is not None else None
                results[i] = Continuation(list(record.token_ids), record.text, finish, logprobs)
        return results  # type: ignore[return-value]


class ScriptedBackend:
    """A policy that answers from a script: `script(sequence_index, turn_index) -> text`.

    The text is encoded with the tokenizer (markup in it stays characters); a turn that contains a stop
    string is cut after it (finish "stop_string"), otherwise it ends with the end-of-turn id (finish "stop"), unless the
    budget cuts it first ("length"). Sequences are told apart by their first call's order.
    """

    def __init__(self, tokenizer: Any, script: Callable[[int, int], str]) -> None:
        self.tokenizer, self.script = tokenizer, script
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


BackendFor = Callable[[Any, int], Any]  # (model, step) -> a continuer (anything with continue_sequences)


def continuer_for(rollout: Any) -> BackendFor:
    """`(model, step) -> continuer` for a single-turn rollout backend, sampling as it does (its tokenizer,
    `SamplingSettings`, batch size, engine and adapter hand-off), so a multi-turn run samples like the
    single-turn run of the same config.

    - `HFRollout` -> `HFContinuer`; `KVCacheRollout` -> `KVContinuer`;
    - `VLLMRollout` -> `VLLMContinuer`: with an adapter hand-off (training) the model's adapter is
      published every `gen_update_steps` steps as for single-turn sampling; without one (phase 4)
      `model` is the `LoRARequest` to sample with (None: the base model). With sleep mode the engine is
      woken for the episode (`close` puts it back to sleep);
    - `VLLMServerRollout` -> `ServerContinuer`: the adapter is published and loaded by name every
      `gen_update_steps` steps (`sync_adapter`), as for single-turn sampling;
    - a rollout with its own `continuer(model, step)` method (tests, a scripted policy) -> that.
    """
    own = getattr(rollout, "continuer", None)
    if callable(own):
        return own
    from rollouts.hf import HFRollout
    from rollouts.kv_sampler import KVCacheRollout
    from rollouts.vllm_colocated import VLLMRollout
    from rollouts.vllm_server import VLLMServerRollout

    if isinstance(rollout, VLLMServerRollout):
        return lambda model, step: ServerContinuer(rollout, rollout.sync_adapter(model, step))
    if isinstance(rollout, KVCacheRollout):
        return lambda model, step: KVContinuer(rollout, model)
    if isinstance(rollout, HFRollout):
        return lambda model, step: HFContinuer(model, rollout.tokenizer, rollout.sampling, rollout.sequences_per_call)
    if isinstance(rollout, VLLMRollout):

        def vllm_continuer(model: Any, step: int) -> VLLMContinuer:
            if rollout.sleep_mode:
                rollout.wake()
            handoff = rollout.handoff
            request = rollout.sync_adapter(model, step) if handoff is not None else model
            continuer = VLLMContinuer(
                rollout.llm, rollout.vllm, rollout.tokenizer, rollout.sampling, request, rollout.logprobs
            )

            def after_episode() -> None:  # what the single-turn `generate` does after sampling
                if handoff is not None:
                    handoff.prune(keep=Path(request.lora_path))
                if rollout.sleep_mode:
                    rollout.llm.sleep(level=1)

            continuer.on_close = after_episode
            return continuer

        return vllm_continuer
    raise TypeError(
        f"no multi-turn continuation for the rollout backend {type(rollout).__name__}: multi_turn.mode=tool|feedback "
        "works with grpo.rollout_backend=hf, kv, vllm or vllm_server"
    )
