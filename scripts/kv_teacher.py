"""The kv engine of the local teacher: an OpenAI-compatible HTTP server over the batched kv-cache sampler.

`python -m scripts.serve_local_teacher --engine kv` runs it (and `--engine auto` does when vLLM is not
importable and the sampler implements the model). Standard library HTTP (a `ThreadingHTTPServer` on 127.0.0.1),
one engine thread:

- Requests that arrive together are generated together: the engine takes the first waiting request, what queued
  while it was generating and what arrives less than `batch_window` seconds (50 ms) after the request before
  (for at most 10 windows), plans batches
  (`plan_batches`) and runs each as ONE `rollouts.kv_sampler.sample_token_ids` call. The sampler takes one set of
  sampling knobs, one token budget and one list of stop strings per call, so requests that differ in any of them
  go in separate batches, one after another (per-row temperatures are not implemented). A request with a `seed`
  is generated alone, from a generator seeded with it: the same request and seed give the same answer.
- Endpoints: GET /health, GET /v1/models (the one served name), POST /v1/chat/completions (the model's chat
  template with `chat_template_kwargs`, as `utils.sft_data.encode_prompt` renders prompts), POST /v1/completions
  (a text prompt, tokenized as vLLM does, special tokens parsed). Fields honoured: model, messages / prompt,
  max_tokens (max_completion_tokens), n, temperature, top_p, top_k, min_p, repetition_penalty, stop, seed.
  Knobs a request leaves out take the model folder's generation_config.json values, else off (vLLM's rule).
- Answers as vLLM's: finish_reason "stop" (an end-of-turn or EOS token, or a stop string, which is cut from the
  text and named in `stop_reason`) or "length"; usage counts prompt, completion (the stop token included) and
  total tokens. Errors are OpenAI error bodies: 404 for a model it does not serve, 400 for a request it cannot
  honour.
- Not supported (400, naming the field): streaming, log-probs of any kind (logprobs, top_logprobs,
  prompt_logprobs, echo), tools, thinking_token_budget (there is no reasoning parser; the project's client then
  sends requests without it). presence_penalty and frequency_penalty are not applied (one note per server, as
  `transformers serve` ignores them too). No LoRA adapters, no token-id prompts, one prompt per request.
- One line per batch on stdout: rows, requests, prompt and generated tokens, seconds, tokens/s.
"""

from __future__ import annotations

import http.server
import json
import math
import queue
import signal
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollouts.sampling import SamplingSettings

ENGINE_NAME = "kv"
DEFAULT_BATCH_WINDOW = 0.05  # seconds: a request arriving sooner after the last one joins its batch
BURST_WINDOWS = 10  # a batch waits for late arrivals at most this many windows after its first request
DEFAULT_MAX_BATCH_ROWS = 64
# KV-cache positions one batch may hold (rows x (longest prompt + budget)): 32,768 positions of SmolLM2-135M in
# float32 are 1.5 GB of cache
DEFAULT_MAX_BATCH_POSITIONS = 32_768
REFUSED_FIELDS = {
    "stream": "streaming",
    "logprobs": "log-probs",
    "top_logprobs": "log-probs",
    "prompt_logprobs": "prompt log-probs (phase 3's on-policy distillation on CPU: teacher.logprob_source=local)",
    "echo": "echo",
    "tools": "tools",
    "functions": "functions",
    "response_format": "response_format",
    "thinking_token_budget": "thinking_token_budget (no reasoning parser)",
}
IGNORED_PENALTIES = ("presence_penalty", "frequency_penalty")
KNOB_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}


class RequestError(ValueError):
    """A request the engine answers with an OpenAI error body (`status`: 400 or 404)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param


# ------------------------------------------------------------------------------------------------
# Requests: parsed from their JSON body without the tokenizer (pure)


@dataclass(frozen=True)
class ParsedRequest:
    """What one request asks for; `messages` for a chat completion, `prompt` for a text completion."""

    endpoint: str  # "chat" or "text"
    messages: tuple[dict[str, Any], ...] | None
    prompt: str | None
    n: int
    max_tokens: int | None  # None: the rest of the context
    knobs: SamplingSettings
    stop: tuple[str, ...]
    seed: int | None
    chat_template_kwargs: dict[str, Any]
    ignored: tuple[str, ...] = ()  # fields set that the engine does not apply


def _number(body: dict[str, Any], name: str, kind: type, check: Callable[[Any], bool], rule: str) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise RequestError(f"{name} must be {'a number' if kind is float else 'an integer'}, got {value!r}", param=name)
    if not check(value):
        raise RequestError(f"{name} must be {rule}, got {value!r}", param=name)
    return kind(value)


def _message_text(content: Any, index: int) -> str:
    """A message's content: a string, or OpenAI's list of parts of which only text parts are allowed."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise RequestError(f"messages[{index}].content must be a string or a list of text parts", param="messages")


def parse_request(body: Any, endpoint: str, served_name: str, defaults: dict[str, Any]) -> ParsedRequest:
    """The request a JSON body asks for, or RequestError (404 for another model name). `defaults`: the model's
    own sampling knobs (its generation_config), for those the body leaves out."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = body.get("model", served_name)
    if model != served_name:
        raise RequestError(f"The model `{model}` does not exist. This server serves `{served_name}`.", 404, "model")
    for name, what in REFUSED_FIELDS.items():
        value = body.get(name)
        unset = value is None or value is False or value == [] or (name == "top_logprobs" and value == 0)
        if not unset:
            raise RequestError(f"the kv engine does not support {what} ({name!r} was sent)", param=name)
    messages = prompt = None
    if endpoint == "chat":
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw or not all(isinstance(m, dict) for m in raw):
            raise RequestError("messages must be a non-empty list of {role, content} objects", param="messages")
        for i, m in enumerate(raw):
            if m.get("role") not in ("system", "user", "assistant", "developer"):
                raise RequestError(f"messages[{i}].role {m.get('role')!r} is not supported", param="messages")
        messages = tuple({"role": m["role"], "content": _message_text(m.get("content"), i)} for i, m in enumerate(raw))
    else:
        raw = body.get("prompt")
        if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str):
            raw = raw[0]
        if not isinstance(raw, str) or not raw:
            raise RequestError("prompt must be one non-empty string (no token ids, no lists)", param="prompt")
        prompt = raw
    n = _number(body, "n", int, lambda v: v >= 1, "at least 1")
    max_tokens = _number(body, "max_tokens", int, lambda v: v >= 1, "at least 1")
    if max_tokens is None:
        max_tokens = _number(body, "max_completion_tokens", int, lambda v: v >= 1, "at least 1")
    knobs = {
        "temperature": _number(body, "temperature", float, lambda v: v >= 0, ">= 0"),
        "top_p": _number(body, "top_p", float, lambda v: 0 < v <= 1, "in (0, 1]"),
        "top_k": _number(body, "top_k", int, lambda v: v >= -1, "-1, 0 (off) or positive"),
        "min_p": _number(body, "min_p", float, lambda v: 0 <= v <= 1, "in [0, 1]"),
        "repetition_penalty": _number(body, "repetition_penalty", float, lambda v: v > 0, "> 0"),
    }
    for name, value in knobs.items():
        if value is None:
            knobs[name] = defaults.get(name, KNOB_DEFAULTS[name])
    knobs["top_k"] = max(int(knobs["top_k"]), 0)  # vLLM's -1 and 0 both mean off
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is None:
        stop = []
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("stop must be a non-empty string or a list of them", param="stop")
    seed = _number(body, "seed", int, lambda v: True, "an integer")
    template = body.get("chat_template_kwargs") or {}
    if not isinstance(template, dict):
        raise RequestError("chat_template_kwargs must be an object", param="chat_template_kwargs")
    ignored = tuple(name for name in IGNORED_PENALTIES if body.get(name) not in (None, 0, 0.0))
    return ParsedRequest(
        endpoint=endpoint,
        messages=messages,
        prompt=prompt,
        n=n or 1,
        max_tokens=max_tokens,
        knobs=SamplingSettings(**knobs),
        stop=tuple(dict.fromkeys(stop)),
        seed=seed,
        chat_template_kwargs=template,
        ignored=ignored,
    )


# ------------------------------------------------------------------------------------------------
# Batches: which requests are generated together (pure)


@dataclass(frozen=True)
class Planned:
    """A request as the planner sees it: its order of arrival, its rows, its prompt length and its batch key."""

    index: int
    rows: int  # n
    prompt_tokens: int
    budget: int  # max_tokens
    knobs: SamplingSettings
    stop: tuple[str, ...]
    seed: int | None = None

    @property
    def key(self) -> tuple:
        """Requests with equal keys can share one sampler call; a seeded request shares with none."""
        alone = ("seed", self.index) if self.seed is not None else None
        return (self.knobs, self.budget, tuple(sorted(self.stop)), alone)


def batch_positions(requests: Sequence[Planned]) -> int:
    """KV-cache positions a batch of `requests` holds: every row is as wide as the longest prompt plus the budget."""
    if not requests:
        return 0
    return sum(r.rows for r in requests) * (max(r.prompt_tokens for r in requests) + requests[0].budget)


def plan_batches(requests: Sequence[Planned], max_rows: int, max_positions: int) -> list[list[Planned]]:
    """Requests split into batches, each one sampler call: equal keys only, at most `max_rows` rows and
    `max_positions` cache positions (a request over either limit alone is a batch of its own). Each request, in
    order of arrival, joins the first batch of its key it fits in. Batches are in the order of their first
    request's arrival; inside a batch, requests keep their order."""
    by_key: dict[tuple, list[list[Planned]]] = {}
    batches: list[list[Planned]] = []
    for request in sorted(requests, key=lambda r: r.index):
        candidates = by_key.setdefault(request.key, [])
        for batch in candidates:
            grown = [*batch, request]
            if sum(r.rows for r in grown) <= max_rows and batch_positions(grown) <= max_positions:
                batch.append(request)
                break
        else:
            candidates.append([request])
            batches.append(candidates[-1])
    return batches


# ------------------------------------------------------------------------------------------------
# Answers (pure, given the generated text)


@dataclass(frozen=True)
class Choice:
    text: str
    finish_reason: str  # "stop" or "length"
    stop_reason: str | None  # the stop string it stopped at
    tokens: int  # generated tokens, the stop token included


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, str | None]:
    """`text` up to the first of `stop` found in it (left out), and which one; (text, None) when none is."""
    found = [(text.find(s), s) for s in stop if s in text]
    if not found:
        return text, None
    at, which = min(found)
    return text[:at], which


def response_body(request: ParsedRequest, served_name: str, prompt_tokens: int, choices: Sequence[Choice]) -> dict:
    """The OpenAI (vLLM-shaped) body of a chat or text completion."""
    completion = sum(c.tokens for c in choices)
    chat = request.endpoint == "chat"
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": served_name,
        "choices": [
            {
                "index": i,
                **({"message": {"role": "assistant", "content": c.text}} if chat else {"text": c.text}),
                "logprobs": None,
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
            }
            for i, c in enumerate(choices)
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        },
    }


def error_body(error: RequestError) -> dict:
    kind = "NotFoundError" if error.status == 404 else "BadRequestError"
    return {"error": {"message": str(error), "type": kind, "param": error.param, "code": error.status}}


# ------------------------------------------------------------------------------------------------
# The engine: the model's sampling copy, the tokenizer, one thread that batches


@dataclass
class Job:
    """A request waiting for the engine; the handler thread waits on `done`."""

    request: ParsedRequest
    done: Future = field(default_factory=Future)


@dataclass
class Batched:
    job: Job
    ids: list[int]
    planned: Planned


class Engine:
    """The served model and the thread that answers requests in batches."""

    def __init__(
        self,
        path: str,
        *,
        dtype: str = "bfloat16",
        batch_window: float = DEFAULT_BATCH_WINDOW,
        max_batch_rows: int = DEFAULT_MAX_BATCH_ROWS,
        max_batch_positions: int = DEFAULT_MAX_BATCH_POSITIONS,
        log: Callable[[str], None] = print,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from rollouts.kv_sampler import SAMPLER_DTYPES, DecoderWeights, sampler_stop_ids
        from utils.student_model import load_tokenizer

        self.path, self.log = path, log
        self.batch_window, self.max_batch_rows, self.max_batch_positions = (
            batch_window,
            max_batch_rows,
            max_batch_positions,
        )
        self.tokenizer = load_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        model.eval()
        self.weights = DecoderWeights.from_model(model, SAMPLER_DTYPES[dtype])  # UnsupportedModelError: refused
        self.stop_ids = frozenset(sampler_stop_ids(self.tokenizer, model))
        self.max_model_len = int(getattr(model.config, "max_position_embeddings", 0) or 4096)
        self.defaults = generation_defaults(Path(path))
        del model  # the sampling copy holds its own weights
        self.jobs: queue.Queue[Job] = queue.Queue()
        self.batches_served = 0
        self.generating = 0  # requests in the batch being generated now
        self._noted: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="kv-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, request: ParsedRequest) -> Future:
        for name in request.ignored:
            if name not in self._noted:
                self._noted.add(name)
                self.log(f"note: {name} is not applied by the kv engine (sent: requests are sampled without it)")
        job = Job(request)
        self.jobs.put(job)
        return job.done

    def _collect(self) -> list[Job]:
        """The first waiting job and every job queued behind it, then each that arrives less than `batch_window`
        after the one before (a burst of requests is one batch even when a busy client sends it over a few hundred
        milliseconds), for at most `BURST_WINDOWS` windows after the first."""
        jobs = [self.jobs.get()]
        deadline = time.monotonic() + BURST_WINDOWS * self.batch_window
        while (left := deadline - time.monotonic()) > 0:
            try:
                jobs.append(self.jobs.get(timeout=min(left, self.batch_window)))
            except queue.Empty:
                break
        return jobs

    def _run(self) -> None:
        while True:
            jobs = self._collect()
            ready: list[Batched] = []
            for index, job in enumerate(jobs):
                try:
                    ready.append(self._prepare(index, job))
                except RequestError as error:
                    job.done.set_result(error)
            by_index = {b.planned.index: b for b in ready}
            for batch in plan_batches([b.planned for b in ready], self.max_batch_rows, self.max_batch_positions):
                members = [by_index[p.index] for p in batch]
                self.generating = len(members)
                try:
                    self._generate(members)
                except Exception as error:  # noqa: BLE001 - the server stays up; each request answers 500
                    self.log(f"error: a batch of {len(members)} requests failed: {type(error).__name__}: {error}")
                    for member in members:
                        if not member.job.done.done():
                            member.job.done.set_exception(error)
                self.generating = 0

    def encode(self, request: ParsedRequest) -> list[int]:
        if request.endpoint == "chat":
            from utils.sft_data import chat_prompt_ids  # imports torch: loaded with the engine, not for --help

            return chat_prompt_ids(self.tokenizer, list(request.messages or ()), request.chat_template_kwargs)
        return list(self.tokenizer(request.prompt)["input_ids"])

    def _prepare(self, index: int, job: Job) -> Batched:
        request = job.request
        try:
            ids = self.encode(request)
        except Exception as error:  # noqa: BLE001 - a template that refuses these messages
            raise RequestError(f"the chat template could not render the messages: {error}") from None
        if not ids:
            raise RequestError("the prompt has no tokens", param="prompt")
        budget = request.max_tokens if request.max_tokens is not None else self.max_model_len - len(ids)
        if len(ids) + budget > self.max_model_len or budget < 1:
            raise RequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{len(ids) + budget} tokens ({len(ids)} in the messages, {budget} in the completion). Please reduce "
                "the length of the messages or completion.",
                param="max_tokens",
            )
        planned = Planned(index, request.n, len(ids), budget, request.knobs, request.stop, request.seed)
        if batch_positions([planned]) > self.max_batch_positions:
            raise RequestError(
                f"n={request.n} rows of {len(ids)} prompt + {budget} completion tokens exceed the kv engine's "
                f"batch ({self.max_batch_positions} cache positions, --max_batch_positions): ask for fewer tokens "
                "or fewer samples",
                param="max_tokens",
            )
        return Batched(job, ids, planned)

    def _generate(self, members: list[Batched]) -> None:
        import torch

        from rollouts.kv_sampler import sample_token_ids

        first = members[0].planned
        prompts = [m.ids for m in members for _ in range(m.planned.rows)]
        generator = torch.Generator().manual_seed(first.seed) if first.seed is not None else None
        start = time.perf_counter()
        groups = sample_token_ids(
            self.weights,
            prompts,
            1,
            first.budget,
            knobs=first.knobs,
            stop_token_ids=self.stop_ids,
            pad_id=self.tokenizer.pad_token_id,
            stop_strings=first.stop,
            tokenizer=self.tokenizer,
            max_batch_rows=max(len(prompts), 1),
            generator=generator,
        )
        seconds = time.perf_counter() - start
        rows = iter(row for [row] in groups)
        generated = 0
        for member in members:
            choices = [self._choice(next(rows), member.job.request.stop) for _ in range(member.planned.rows)]
            generated += sum(c.tokens for c in choices)
            body = response_body(member.job.request, self.path, len(member.ids), choices)
            member.job.done.set_result(body)
        self.batches_served += 1
        prompt_tokens = sum(len(p) for p in prompts)
        self.log(
            f"batch {self.batches_served}: rows={len(prompts)} requests={len(members)} prompt_tokens={prompt_tokens} "
            f"tokens={generated} seconds={seconds:.2f} ({generated / max(seconds, 1e-9):.1f} tokens/s)"
        )

    def _choice(self, row: Any, stop: Sequence[str]) -> Choice:
        ids = list(row.token_ids)
        if row.stop_string is not None:
            text, which = cut_at_stop(self.tokenizer.decode(ids, skip_special_tokens=True), stop)
            return Choice(text, "stop", which or row.stop_string, len(ids))
        on_stop_id = row.finish_reason == "stop" and bool(ids) and ids[-1] in self.stop_ids
        text = self.tokenizer.decode(ids[:-1] if on_stop_id else ids, skip_special_tokens=True)
        return Choice(text, row.finish_reason, None, len(ids))


def generation_defaults(folder: Path) -> dict[str, Any]:
    """The sampling knobs the model folder's generation_config.json sets (what vLLM serves by default)."""
    try:
        saved = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: saved[k] for k in KNOB_DEFAULTS if isinstance(saved.get(k), (int, float)) and not math.isnan(saved[k])}


# ------------------------------------------------------------------------------------------------
# HTTP


class Handler(http.server.BaseHTTPRequestHandler):
    engine: Engine  # set on the subclass `serve` builds
    protocol_version = "HTTP/1.1"  # keep-alive: the client's connection pool reuses connections

    def log_message(self, format: str, *args: Any) -> None:
        return None  # one line per batch instead of one per request

    def _send(self, status: int, body: dict | None) -> None:
        data = b"" if body is None else json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting
            pass

    def do_GET(self) -> None:
        path = self.path.split("?")[0].rstrip("/")
        if path == "/health":
            self._send(200, {"status": "ok", "engine": ENGINE_NAME, "max_batch_rows": self.engine.max_batch_rows})
        elif path == "/v1/models":
            card = {
                "id": self.engine.path,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "tgrpo",
                "root": self.engine.path,
                "parent": None,
                "max_model_len": self.engine.max_model_len,
            }
            self._send(200, {"object": "list", "data": [card]})
        else:
            self._send(404, error_body(RequestError(f"no such endpoint: GET {path}", 404)))

    def do_POST(self) -> None:
        path = self.path.split("?")[0].rstrip("/")
        endpoint = {"/v1/chat/completions": "chat", "/v1/completions": "text"}.get(path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if endpoint is None:
            self._send(404, error_body(RequestError(f"no such endpoint: POST {path}", 404)))
            return
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            self._send(400, error_body(RequestError("the request body is not JSON")))
            return
        try:
            request = parse_request(body, endpoint, self.engine.path, self.engine.defaults)
        except RequestError as error:
            self._send(error.status, error_body(error))
            return
        try:
            answer = self.engine.submit(request).result()
        except Exception as error:  # noqa: BLE001 - the batch failed: a server error, which the client retries
            self._send(500, {"error": {"message": f"{type(error).__name__}: {error}", "type": "InternalServerError"}})
            return
        if isinstance(answer, RequestError):
            self._send(answer.status, error_body(answer))
        else:
            self._send(200, answer)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's listen backlog is 5: a burst of more connections than that has the rest of its SYNs dropped
    # and resent by the client's kernel a second later, which splits one burst of requests into two batches
    request_queue_size = 256


def serve(engine: Engine, port: int, host: str = "127.0.0.1") -> int:
    """Answer on host:port until SIGINT or SIGTERM; returns the exit code (0). The engine thread may still be
    generating: the caller ends the process with `os._exit`, as an interpreter shutdown under a running torch
    operation aborts ("terminate called without an active exception")."""
    handler = type("BoundHandler", (Handler,), {"engine": engine})
    server = Server((host, port), handler)
    stop = threading.Event()
    received: list[str] = []

    def on_signal(number: int, frame: Any) -> None:
        received.append(signal.Signals(number).name)
        stop.set()

    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, on_signal)
    engine.start()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    thread.start()
    while not stop.wait(0.5):
        pass
    server.shutdown()
    server.server_close()
    cut = f", a batch of {engine.generating} requests cut short" if engine.generating else ""
    queued = f", {engine.jobs.qsize()} queued requests dropped" if not engine.jobs.empty() else ""
    engine.log(f"stopped ({received[0]}; {engine.batches_served} batches served{cut}{queued})")
    return 0
