"""Transport to the teacher: an async OpenAI-compatible chat client. Knows nothing about tasks.

Works against `vllm serve` (the GPU teacher) and the local CPU stand-ins (`scripts/serve_local_teacher.py`: its kv
engine, or `transformers serve`).
`post_json` (the retry loop below, for any endpoint) is also the transport of the `vllm_server`
rollout backend (rollouts/vllm_server.py).

- At most `max_concurrency` requests in flight (a semaphore); one sample per request, because some
  servers ignore `n` (vLLM's prefix cache makes repeated prompts cheap anyway).
- Sampling parameters and ``extra_body={"chat_template_kwargs": {"enable_thinking": ...}}``; with thinking on,
  vLLM's per-request ``thinking_token_budget`` (0.32+: after that many thinking tokens the server ends the
  thinking, so the answer still fits ``max_tokens``). vLLM accepts it only from a server started with
  ``--reasoning-parser``; a server that refuses it (HTTP 400 naming it) gets the requests without it from then
  on, and `thinking_budget_note` says so once.
- Retries with exponential backoff and full jitter on connection errors, timeouts, 408/409/429 and
  5xx, never sooner than a `Retry-After` (or `retry-after-ms`) header asks; never on other 4xx. A
  request for a model the server does not serve raises `TeacherFatalError` at once, listing what
  `/v1/models` says the server does serve.
- Every response shape a vLLM server produces for Qwen3 is returned as (text, reasoning):
  ``message.reasoning`` (vLLM with a reasoning parser), ``message.reasoning_content`` (older vLLM),
  or nothing (thinking inline in ``content``, possibly only ``</think>`` when the chat template
  opened the tag). The caller parses them with `extract_thinking_and_code_unified`.
- A malformed answer (no choices, no message) is a failed request (`TeacherResponse.error`), never
  a crash.
- `complete_text`: a raw-text completion (POST /v1/completions) of a prompt the caller rendered, for
  tool-mode traces, which continue the teacher's own text after each `<result>`. A chat request cannot
  do that with Qwen3's template: a final assistant message is rendered with an (empty) think block in
  front of it, so a message still inside its `<think>` would be re-framed. Stop strings come back
  included in the text, whichever server: vLLM leaves a matched stop string out of `text` and names
  it in `stop_reason` (restored here), and so does the local kv engine; `transformers serve` keeps it in the text.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import openai

from config import normalize_api_base

RETRYABLE_STATUS = {408, 409, 429}
T = TypeVar("T")


class TeacherFatalError(RuntimeError):
    """A mistake that retrying cannot fix (wrong model name, bad API key, no server)."""


class RequestFailedError(RuntimeError):
    """A request that failed for good: a status that is not retried, retries run out, or a malformed answer."""

    def __init__(self, message: str, attempts: int, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.attempts, self.status, self.body = attempts, status, body  # body: the decoded error answer, if any


WRONG_TEACHER_HINT = "Set teacher.model_name (or --model) to one of these."


@dataclass
class TeacherResponse:
    text: str | None  # message.content
    reasoning: str | None = None  # message.reasoning / reasoning_content, when the server split it out
    finish_reason: str | None = None  # "stop", "length" (truncated), ...
    usage: dict = field(default_factory=dict)  # prompt_tokens, completion_tokens, total_tokens
    latency: float = 0.0  # seconds, all attempts included
    attempts: int = 0
    error: str | None = None  # set when the request failed for good (the sample becomes an api_error row)
    stop_string: str | None = None  # complete_text: the stop string the server stopped on, if it says so (vLLM)

    @property
    def ok(self) -> bool:
        return self.error is None


def not_an_openai_server(base_url: str, role: str) -> str:
    """What to say when GET {base_url}/models answered 404: the server is not an OpenAI-compatible `vllm serve`
    (TRL's `trl vllm-serve` answers /health/ and /generate/, not /v1/...), or the URL lacks its /v1."""
    base = base_url.rstrip("/")
    fix = "" if base.endswith("/v1") else f"; with `vllm serve` the URL ends in /v1: {base}/v1"
    return (
        f"{base}/models answered 404: the {role} is not an OpenAI-compatible server. tgrpo needs `vllm serve MODEL` "
        f"(not `trl vllm-serve`) or another OpenAI-compatible server{fix}."
    )


def models_endpoint_status(base_url: str, timeout: float = 10.0) -> int | None:
    """The HTTP status of GET {base_url}/models, or None when nothing answers (the caller's connection checks
    report that with their own advice)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{base_url.rstrip('/')}/models", timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except (OSError, ValueError):  # nothing answers, or not an http(s) URL
        return None


def _is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, (openai.APIConnectionError, asyncio.TimeoutError)):  # includes APITimeoutError
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in RETRYABLE_STATUS or exc.status_code >= 500
    return False


def retry_after_seconds(exc: BaseException) -> float | None:
    """The wait a 429/503 asks for: `retry-after-ms`, or `Retry-After` in seconds or as an HTTP date."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    try:
        if headers.get("retry-after-ms"):
            return max(0.0, float(headers["retry-after-ms"]) / 1000)
        value = headers.get("retry-after")
        if not value:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max(0.0, (when - datetime.now(when.tzinfo)).total_seconds())
    except (TypeError, ValueError):
        return None


def _looks_like_wrong_model(exc: openai.APIStatusError) -> bool:
    text = str(exc).lower()
    return exc.status_code == 404 or (
        exc.status_code in (400, 422)
        and "model" in text
        and any(w in text for w in ("not found", "does not exist", "pinned", "unknown"))
    )


def _first_choice(raw: Any) -> dict[str, Any]:
    """The first choice of a completion body; ValueError when the body has none."""
    if not isinstance(raw, dict):
        raise ValueError(f"the body is not a JSON object: {str(raw)[:80]!r}")
    choices = raw.get("choices")
    if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise ValueError("the response has no choices")
    return choices[0]


class TeacherClient:
    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str = "EMPTY",
        temperature: float = 0.7,
        top_p: float = 0.8,
        presence_penalty: float = 0.0,
        max_tokens: int = 1024,
        enable_thinking: bool = True,
        thinking_token_budget: int = 0,
        request_timeout: float = 600.0,
        max_retries: int = 5,
        max_concurrency: int = 32,
        backoff_base: float = 1.0,
        backoff_cap: float = 30.0,
    ) -> None:
        self.base_url = normalize_api_base(base_url)
        self.model = model
        self.sampling = {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens}
        if presence_penalty:
            self.sampling["presence_penalty"] = presence_penalty
        self.extra_body = {"chat_template_kwargs": {"enable_thinking": enable_thinking}}
        self.thinking_token_budget = thinking_token_budget if enable_thinking else 0  # 0: not sent
        self.thinking_budget_note = ""  # why the budget stopped being sent (the server refused it), once
        self.request_timeout = request_timeout
        self.max_retries = max_retries
        self.backoff_base, self.backoff_cap = backoff_base, backoff_cap
        self.max_concurrency = max_concurrency
        self._semaphore = asyncio.Semaphore(max_concurrency)
        # Our own retry loop replaces the client's: the client would retry a 404 for a wrong model name (and
        # hide it behind a generic error), while we fail at once listing the served models; it also knows
        # nothing of our per-sample error rows. Like the client's, ours honours Retry-After.
        self._client = openai.AsyncOpenAI(
            base_url=self.base_url, api_key=api_key, timeout=request_timeout, max_retries=0
        )

    @classmethod
    def from_config(cls, teacher: Any, model: str | None = None, **overrides: Any) -> TeacherClient:
        """From a config.TeacherConfig section; `model` overrides the (resolved) model name."""
        import os

        kwargs = dict(
            base_url=teacher.api_url,
            model=model or teacher.model_name,
            api_key=os.environ.get("TGRPO_TEACHER_API_KEY", teacher.api_key),
            temperature=teacher.temperature,
            top_p=teacher.top_p,
            presence_penalty=teacher.presence_penalty,
            max_tokens=teacher.max_tokens,
            enable_thinking=teacher.enable_thinking,
            thinking_token_budget=teacher.thinking_token_budget,
            request_timeout=teacher.request_timeout,
            max_retries=teacher.max_retries,
            max_concurrency=teacher.max_concurrent_requests,
        )
        kwargs.update(overrides)
        return cls(**kwargs)

    async def list_models(self, timeout: float = 10.0) -> list[str]:
        """Model ids from GET /v1/models. Raises TeacherFatalError when nothing answers."""
        try:
            page = await asyncio.wait_for(self._client.models.list(), timeout)
        except (TimeoutError, openai.APIConnectionError) as exc:
            raise TeacherFatalError(
                f"No teacher server answers at {self.base_url} ({type(exc).__name__}). Start one: "
                "`vllm serve Qwen/Qwen3-32B-FP8 --port 8129 --reasoning-parser qwen3` on a GPU, or `make teacher` "
                "for the local CPU stand-in; or point --api_url at a running server."
            ) from None
        except openai.APIStatusError as exc:
            if exc.status_code in (401, 403):
                raise TeacherFatalError(
                    f"{self.base_url} refused the API key ({exc.status_code}); set "
                    "TGRPO_TEACHER_API_KEY or teacher.api_key."
                ) from None
            if exc.status_code == 404:
                raise TeacherFatalError(not_an_openai_server(self.base_url, "teacher")) from None
            return []  # a server that does not list its models; requests may still work
        return [m.id for m in getattr(page, "data", []) or []]

    async def model_cards(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        """GET /v1/models as plain dicts (vLLM's cards carry `max_model_len`, and `parent` on a LoRA adapter's);
        [] when the server does not answer it."""
        try:
            raw = await asyncio.wait_for(self._client.get("/models", cast_to=object), timeout)
        except (TimeoutError, openai.APIError):
            return []
        data = raw.get("data", []) if isinstance(raw, dict) else []
        return [card for card in data if isinstance(card, dict)]

    async def complete(self, messages: Sequence[Mapping[str, str | None]]) -> TeacherResponse:
        """One chat completion with retries. Never raises for a bad sample; raises TeacherFatalError
        for mistakes that would fail every request."""
        start = time.monotonic()
        while True:
            body = {"model": self.model, "messages": messages, **self.sampling, **self.extra_body}
            budget = self.thinking_token_budget
            if budget:
                body["thinking_token_budget"] = budget
            try:
                response, attempts = await self.post_json("/chat/completions", body, parse=self._parse)
            except RequestFailedError as failed:
                if budget and failed.status == 400 and "thinking_token_budget" in str(failed):
                    self._drop_thinking_budget(str(failed))
                    continue  # the same request without it
                return self._failed(str(failed), start, failed.attempts)
            break
        response.latency, response.attempts = time.monotonic() - start, attempts
        return response

    def _drop_thinking_budget(self, refusal: str) -> None:
        """The server refused `thinking_token_budget` (vLLM without --reasoning-parser): stop sending it."""
        if self.thinking_token_budget and not self.thinking_budget_note:
            self.thinking_budget_note = (
                f"the teacher server at {self.base_url} refused thinking_token_budget ({refusal[:160]}): requests go "
                "on without it, so thinking that runs past teacher.max_tokens leaves no code; start vLLM with "
                "--reasoning-parser qwen3 (docs/gpu.md) to have the thinking end inside the budget"
            )
            print(f"warning: {self.thinking_budget_note}", file=sys.stderr, flush=True)
        self.thinking_token_budget = 0

    def text_request(self, prompt: str, stop: Sequence[str], max_tokens: int) -> dict[str, Any]:
        """The body of `complete_text`'s request: OpenAI completion fields only (`transformers serve` refuses
        any other; vLLM's extensions such as include_stop_str_in_output are left out on purpose)."""
        return {"model": self.model, "prompt": prompt, **self.sampling, "max_tokens": max_tokens, "stop": list(stop)}

    async def complete_text(self, prompt: str, stop: Sequence[str], max_tokens: int) -> TeacherResponse:
        """One raw-text completion of `prompt` (already rendered through the chat template), stopping at any
        of `stop` or after `max_tokens`; the text ends with the stop string when the server stopped on one.
        The sampling settings are the chat requests' (no `chat_template_kwargs`: no template is applied)."""
        start = time.monotonic()
        try:
            response, attempts = await self.post_json(
                "/completions", self.text_request(prompt, stop, max_tokens), parse=self._parse_text
            )
        except RequestFailedError as failed:
            return self._failed(str(failed), start, failed.attempts)
        response.latency, response.attempts = time.monotonic() - start, attempts
        return response

    async def post_json(
        self,
        path: str,
        body: dict[str, Any],
        parse: Callable[[Any], T] = lambda raw: raw,
        wrong_model_hint: str | None = WRONG_TEACHER_HINT,
    ) -> tuple[T, int]:
        """POST `body` to `path` under the concurrency bound, retrying transient failures; returns (parse(body of
        the answer), attempts). Raises TeacherFatalError for a refused API key and, when `wrong_model_hint` is
        given, for a model the server does not serve (listing what it serves); RequestFailedError otherwise."""
        attempt = 0
        async with self._semaphore:
            while True:
                attempt += 1
                try:
                    # The client's low-level `post` with a plain dict body: the typed
                    # `chat.completions.create` path spends ~2.4 ms of CPU per request walking
                    # TypedDicts and building pydantic models, which at 32 requests in flight cost
                    # ~14% of throughput on a 2-core machine. Auth, timeouts and the error classes
                    # (openai.APIStatusError & co.) are the same.
                    raw = await self._client.post(path, cast_to=object, body=body)
                    return parse(raw), attempt
                except openai.APIStatusError as exc:
                    if exc.status_code in (401, 403):
                        raise TeacherFatalError(f"{self.base_url} refused the API key ({exc.status_code}).") from None
                    if wrong_model_hint is not None and _looks_like_wrong_model(exc):
                        served = await self._served_models()
                        raise TeacherFatalError(
                            f"The server at {self.base_url} does not serve model {body.get('model')!r} "
                            f"({exc.status_code}: {str(exc)[:200]}). It serves: "
                            f"{', '.join(served) or 'nothing it will list'}. {wrong_model_hint}"
                        ) from None
                    if not _is_retryable(exc) or attempt > self.max_retries:
                        raise RequestFailedError(
                            f"HTTP {exc.status_code}: {str(exc)[:300]}", attempt, exc.status_code, exc.body
                        ) from None
                    asked = retry_after_seconds(exc)
                except (TimeoutError, openai.APIConnectionError) as exc:
                    asked = None
                    if attempt > self.max_retries:
                        raise RequestFailedError(f"{type(exc).__name__}: {str(exc)[:300]}", attempt) from None
                except (openai.APIError, ValueError, TypeError, AttributeError, KeyError) as exc:
                    # malformed or unparsable answer: a failed request, not a crash (not retried)
                    raise RequestFailedError(
                        f"malformed response: {type(exc).__name__}: {str(exc)[:300]}", attempt
                    ) from None
                delay = min(self.backoff_cap, self.backoff_base * 2 ** (attempt - 1))
                wait = random.uniform(0, delay)  # full jitter: spreads retries of a burst
                if asked is not None:  # the server said when (429/503 with Retry-After): never sooner
                    wait = max(wait, min(asked, self.request_timeout))
                await asyncio.sleep(wait)

    @staticmethod
    def _failed(error: str, start: float, attempts: int) -> TeacherResponse:
        return TeacherResponse(None, error=error, latency=time.monotonic() - start, attempts=attempts)

    @staticmethod
    def _parse(raw: Any) -> TeacherResponse:
        """The JSON body of a chat completion -> TeacherResponse; ValueError when it is not one."""
        choice = _first_choice(raw)
        message = choice.get("message")
        if not isinstance(message, dict):
            raise ValueError("the first choice has no message")
        reasoning = message.get("reasoning") or message.get("reasoning_content")
        content = message.get("content")
        usage = raw.get("usage") if isinstance(raw.get("usage"), dict) else {}
        return TeacherResponse(
            text=content if isinstance(content, str) else None,
            reasoning=reasoning if isinstance(reasoning, str) else None,
            finish_reason=choice.get("finish_reason"),
            usage={k: v for k, v in usage.items() if isinstance(v, int)},
        )

    @staticmethod
    def _parse_text(raw: Any) -> TeacherResponse:
        """The JSON body of a text completion -> TeacherResponse (stop string restored); ValueError when it is
        not one."""
        choice = _first_choice(raw)
        text = choice.get("text")
        if not isinstance(text, str):
            raise ValueError("the first choice has no text")
        stop_reason = choice.get("stop_reason")  # vLLM: the matched stop string, left out of `text`
        stop_string = stop_reason if isinstance(stop_reason, str) else None
        if stop_string is not None and not text.endswith(stop_string):
            text += stop_string
        usage = raw.get("usage") if isinstance(raw.get("usage"), dict) else {}
        return TeacherResponse(
            text=text,
            finish_reason=choice.get("finish_reason"),
            usage={k: v for k, v in usage.items() if isinstance(v, int)},
            stop_string=stop_string,
        )

    async def probe(self, messages: list[dict[str, str]], max_tokens: int = 512) -> tuple[list[str], TeacherResponse]:
        """Connection check: (served model ids, one small completion). Raises TeacherFatalError."""
        served = await self.list_models(timeout=5.0)
        saved = self.sampling["max_tokens"]
        self.sampling["max_tokens"] = min(saved, max_tokens)
        try:
            return served, await self.complete(messages)
        finally:
            self.sampling["max_tokens"] = saved

    async def _served_models(self) -> list[str]:
        try:
            return await self.list_models(timeout=5.0)
        except TeacherFatalError:
            return []

    async def close(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> TeacherClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
