"""Rollouts from a running `vllm serve` on other GPUs (the scale-out path, TRL's server mode):
`grpo.rollout_backend=vllm_server`.

The server is started once, by the user, on the base model with LoRA and runtime LoRA updates on:

    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve BASE --enable-lora --max-lora-rank R \
        --logprobs-mode processed_logprobs

Every `gen_update_steps` optimizer steps the trainer publishes the adapter (`AdapterHandoff`: the main
process saves `step-N`, every process waits), the main process asks the server to load it under a new
name (`POST /v1/load_lora_adapter`; vLLM's prefix cache keys LoRA blocks by name, so a name is never
reused) and to unload the previous one (`POST /v1/unload_lora_adapter`), and every process waits
again. Then each process asks for its prompts' completions (`POST /v1/completions`, one request per
prompt with `n` samples) by prompt token ids, with `return_token_ids` and `logprobs=0`, so it gets
back exactly the token ids the policy produced and the sampler's log-prob of each. Every sampling
knob is sent: a field left out takes the model's generation-config default on the server.

Transport is phase 2's client (`clients.openai_compat.TeacherClient.post_json`: bounded
concurrency, retries with backoff on transient errors). The server reads the adapter folder at
load time, from the path the trainer sends: trainer and server must see the same storage at the
same path. Behaviour read from vLLM 0.33.0's source (vllm/entrypoints/openai/completion/protocol.py,
vllm/entrypoints/serve/lora/api_router.py, vllm/entrypoints/openai/models/serving.py); the fake
server in tests/fake_openai_server.py does what it does.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from clients.openai_compat import RequestFailedError, TeacherClient
from rollouts.completion import RolloutCompletion, completion_record, stop_ids
from rollouts.protocol import Continuation
from rollouts.sampling import SamplingSettings
from rollouts.vllm_engine import AdapterHandoff, AdapterSyncedSampler

T = TypeVar("T")


class ServerRolloutError(RuntimeError):
    """The rollout server refused or failed a request; the message says what to check."""


def completion_request(
    model: str,
    prompt_ids: list[int],
    num_samples: int,
    max_new_tokens: int,
    sampling: SamplingSettings,
    stop_token_ids: list[int],
    logprobs: bool = True,
    stop_strings: Sequence[str] = (),
) -> dict[str, Any]:
    """The body of one `POST /v1/completions` (vLLM 0.33.0's CompletionRequest fields), every knob explicit.
    `stop_strings` (a multi-turn environment's, e.g. `</program>`) stop generation with the string kept in
    the text; vLLM then returns the ids up to the token that completed it and names it in `stop_reason`."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt_ids),
        "n": num_samples,
        "max_tokens": max_new_tokens,
        **sampling.vllm_kwargs(),
        "stop_token_ids": list(stop_token_ids),
        "skip_special_tokens": True,
        "return_token_ids": True,
    }
    if logprobs:
        body["logprobs"] = 0  # the sampled token's own log-prob only
    if stop_strings:
        body.update(stop=list(stop_strings), include_stop_str_in_output=True)
    return body


def parse_completions(raw: Any, prompt_ids: list[int], num_samples: int, end_ids: set[int]) -> list[RolloutCompletion]:
    """The choices of one completion response, in order. ValueError when the body is not what was asked for."""
    if not isinstance(raw, dict) or not isinstance(raw.get("choices"), list):
        raise ValueError(f"not a completion response: {str(raw)[:120]!r}")
    choices = sorted(raw["choices"], key=lambda c: c["index"])
    if len(choices) != num_samples:
        raise ValueError(f"asked for {num_samples} completions, got {len(choices)}")
    samples = []
    for choice in choices:
        if choice.get("token_ids") is None:
            raise ValueError("the response has no token_ids (a server older than vLLM 0.10.2 ignores return_token_ids)")
        returned_prompt = choice.get("prompt_token_ids")
        if returned_prompt is not None and list(returned_prompt) != list(prompt_ids):
            raise ValueError("the server continued other prompt tokens than the ones sent")
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
        samples.append(
            completion_record(
                choice["token_ids"],
                choice.get("finish_reason"),
                choice.get("text") or "",
                prompt_ids,
                end_ids,
                logprobs,
                # a stop string (multi-turn) is named by value; a stop token by its id
                choice["stop_reason"] if isinstance(choice.get("stop_reason"), str) else None,
            )
        )
    return samples


class VLLMServerRollout(AdapterSyncedSampler):
    """The `Sampler` over a `vllm serve` that loads each new adapter by name; `sync` keeps it in step with the
    policy."""

    def __init__(
        self,
        client: TeacherClient,
        tokenizer: Any,
        max_new_tokens: int,
        sampling: SamplingSettings,
        handoff: AdapterHandoff,
        gen_update_steps: int = 1,
        chat_template_kwargs: dict | None = None,
        share: Callable[[str], str] = lambda value: value,
        logprobs: bool = True,
    ) -> None:
        super().__init__(tokenizer, max_new_tokens, sampling, handoff, gen_update_steps, chat_template_kwargs, logprobs)
        self.handoff: AdapterHandoff = handoff  # always one: the server reads each adapter from its folder
        self.client = client
        self.loop = asyncio.new_event_loop()  # the client's connections live on this one loop
        # adapter names are unique per run as well as per step: a long-running server may still hold an
        # earlier run's adapters, and vLLM refuses a name twice (and its prefix cache keys blocks by name)
        self.run_id = share(secrets.token_hex(4))
        self.adapter_name: str | None = None
        self.model_name = ""  # what `sample` and `continue_sequences` ask for: the adapter `sync` loaded

    def _run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    def check_context(self, longest_prompt: int, budget: int, budget_name: str) -> None:
        """Refuse, before training, a server whose `--max-model-len` cannot hold the longest prompt plus `budget`
        tokens: vLLM refuses a longer input (a 4xx that ends training mid-run) and clamps `max_tokens` to what is
        left (samples silently cut short). A server whose /v1/models does not report the limit is not checked."""
        limit = self._run(self._served_context())
        needed = longest_prompt + budget
        if limit is not None and limit < needed:
            raise ServerRolloutError(
                f"the rollout server at {self.client.base_url} holds {limit} tokens per sequence (--max-model-len) "
                f"and this run needs {needed}: the longest prompt ({longest_prompt} tokens) plus {budget} "
                f"({budget_name}). Restart it with --max-model-len {needed} or more, or lower {budget_name}."
            )

    async def _served_context(self) -> int | None:
        """The base model's `max_model_len` from GET /v1/models (vLLM reports it on each model card)."""
        limits = [card.get("max_model_len") for card in await self.client.model_cards() if not card.get("parent")]
        known = [int(limit) for limit in limits if isinstance(limit, int)]
        return min(known) if known else None

    def sync_adapter(self, model: Any, step: int) -> str:
        """Publish the current adapter every `gen_update_steps` steps and have the server load it (the main
        process loads it and unloads the previous one; every process waits); returns the name to sample with."""
        if not self.sync_due(step):
            assert self.adapter_name is not None  # set together with _synced_step
            return self.adapter_name
        path = self.handoff.publish(model, step)  # main process saves, every process waits
        name = f"tgrpo-{self.run_id}-step{step}"
        if self.handoff.is_main:
            self._run(self._adapter_call("load_lora_adapter", {"lora_name": name, "lora_path": str(path.resolve())}))
            if self.adapter_name is not None:
                self._run(self._adapter_call("unload_lora_adapter", {"lora_name": self.adapter_name}))
            self.handoff.prune(keep=path)  # the server read the folder at load time
        self.handoff.barrier()  # no process asks for the new name before it is loaded
        self.adapter_name, self._synced_step = name, step
        return name

    def publish_adapter(self, model: Any, step: int) -> None:
        """Asynchronous rollouts, on the trainer's thread (which owns the weights): write the adapter of `step`."""
        self.handoff.publish(model, step)

    def load_adapter(self, step: int) -> None:
        """Asynchronous rollouts, on the producer's thread (the only one using this sampler's connections): have
        the server load the adapter published at `step` and unload the previous one; `sample` then uses it.
        Called by the main process's producer only, for every rank (no barrier: no collective runs on the
        producer's thread, and no other rank samples, so none can be sampling from the adapter it unloads)."""
        name = f"tgrpo-{self.run_id}-step{step}"
        path = self.handoff.folder(step)
        self._run(self._adapter_call("load_lora_adapter", {"lora_name": name, "lora_path": str(path.resolve())}))
        if self.adapter_name is not None:
            self._run(self._adapter_call("unload_lora_adapter", {"lora_name": self.adapter_name}))
        self.handoff.prune_older(step)
        self.adapter_name = self.model_name = name
        self._synced_step = step

    async def _adapter_call(self, endpoint: str, body: dict[str, Any]) -> None:
        try:
            await self.client.post_json(f"/{endpoint}", body, wrong_model_hint=None)
        except RequestFailedError as failed:
            hint = ""
            if failed.status == 404 and failed.body == {"detail": "Not Found"}:  # FastAPI: no such route
                hint = (
                    " The server has no runtime LoRA endpoints: start it with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True "
                    "and --enable-lora."
                )
            elif endpoint == "load_lora_adapter":
                hint = (
                    f" Check that the server sees {body['lora_path']} (trainer and server must share that storage "
                    "at the same path) and that its --max-lora-rank holds lora.r."
                )
            raise ServerRolloutError(
                f"{self.client.base_url}/{endpoint} {body['lora_name']!r} failed: {failed}.{hint}"
            ) from None

    def post_completions(self, bodies: Sequence[dict[str, Any]], parse: Callable[[dict[str, Any], Any], T]) -> list[T]:
        """POST every body to /v1/completions at once (the client bounds concurrency and retries transient
        errors); `parse(body, answer)` each answer, in order. ServerRolloutError when one fails for good. The
        one transport of `sample` and `continue_sequences`."""

        async def one(body: dict[str, Any]) -> T:
            try:
                result, _ = await self.client.post_json(
                    "/completions",
                    body,
                    parse=lambda raw: parse(body, raw),
                    wrong_model_hint="The adapter was not loaded (or was unloaded by someone else): is another "
                    "trainer using this server?",
                )
            except RequestFailedError as failed:
                raise ServerRolloutError(f"{self.client.base_url}/completions failed: {failed}") from None
            return result

        async def every() -> list[T]:
            return list(await asyncio.gather(*(one(body) for body in bodies)))

        return self._run(every())

    def sync(self, policy: Any, step: int) -> None:
        self.policy = policy
        self.model_name = self.sync_adapter(policy, step)

    def sample(self, prompts: list[str], num_samples: int, *, seed: int | None = None) -> list[list[RolloutCompletion]]:
        """n completions per prompt from the adapter the server loaded last (`seed` is not used: training samples
        unseeded)."""
        end = set(stop_ids(self.tokenizer))
        encoded = [self.encode(p) for p in prompts]
        bodies = [
            completion_request(
                self.model_name, ids, num_samples, self.max_new_tokens, self.sampling, sorted(end), self.logprobs
            )
            for ids in encoded
        ]
        return self.post_completions(bodies, lambda body, raw: parse_completions(raw, body["prompt"], num_samples, end))

    def continue_sequences(
        self, sequences: list[list[int]], max_new_tokens: list[int], stop_strings: tuple[str, ...]
    ) -> list[Continuation]:
        """One request per sequence, all in flight at once; vLLM names a stop string it stopped on in
        `stop_reason` (the ids end with the token that completed it, the text with the string)."""
        stops = stop_ids(self.tokenizer)
        bodies = [
            completion_request(self.model_name, ids, 1, budget, self.sampling, stops, self.logprobs, stop_strings)
            for ids, budget in zip(sequences, max_new_tokens, strict=True)
        ]

        def parse(body: dict[str, Any], raw: Any) -> Continuation:
            [record] = parse_completions(raw, body["prompt"], 1, set(stops))
            return Continuation.from_record(record)

        return self.post_completions(bodies, parse)

    def close(self) -> None:
        """Unload the run's last adapter (main process; a long-lived server would otherwise keep one registered
        adapter per finished run), then close the connections. An unload that fails is reported, not raised:
        the run's results are already saved."""
        if self.adapter_name is not None and self.handoff.is_main:
            try:
                self._run(self._adapter_call("unload_lora_adapter", {"lora_name": self.adapter_name}))
            except ServerRolloutError as failed:
                print(f"warning: could not unload the last adapter from the rollout server: {failed}", flush=True)
            self.adapter_name = None
        self._run(self.client.close())
        self.loop.close()


def server_client(url: str) -> TeacherClient:
    """Phase 2's HTTP client pointed at the rollout server (bounded concurrency, retries on transient errors)."""
    return TeacherClient(
        url,
        model="",
        api_key=os.environ.get("TGRPO_ROLLOUT_API_KEY", "EMPTY"),
        request_timeout=1800.0,
        max_concurrency=256,
    )
