"""A scriptable OpenAI-compatible chat server on 127.0.0.1, for tests and benchmarks, and a fake
`vllm serve` for the `vllm_server` rollout backend (`FakeVLLMServer`).

It answers in every shape a vLLM server produces for Qwen3 (thinking inline, template-opened,
in a `reasoning` or `reasoning_content` field, truncated) and can misbehave on purpose (5xx and
429 for the first N requests, 400s, malformed bodies, a fixed delay). It records each request.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from tests.canned_responses import teacher_message


@dataclass
class FakeTeacher:
    model: str = "fake-teacher"
    shape: str = "inline"  # one of SHAPES (tests/canned_responses.py), or: empty_choices, no_message, garbage, error400
    delay: float = 0.0  # seconds before answering
    fail_first: int = 0  # answer this many requests with `fail_status` first
    fail_status: int = 500
    retry_after: str | None = None  # sent as the Retry-After header of the failed answers
    answers: dict[str, str] = field(default_factory=dict)  # substring of the prompt -> code to answer with
    default_code: str = "def solution():\n    return None"
    requests: list[dict] = field(default_factory=list)
    port: int = 0
    # /v1/completions (tool-mode traces): the teacher's text for a text prompt; the text past the first stop
    # string, or past `max_tokens` words (a word stands for a token here), is never sent
    text_script: Any = None  # (prompt) -> text
    # how a matched stop string comes back: "vllm" (vLLM 0.33.0, openai/completion/serving.py and
    # v1/engine/detokenizer.py: left out of `text`, named in `stop_reason`) or "transformers" (`transformers
    # serve`: generation stops after the token completing it, which stays in the text; no stop_reason)
    stop_style: str = "vllm"
    # False: a `vllm serve` without --reasoning-parser, which refuses thinking_token_budget (vLLM 0.32/0.33,
    # v1/engine/input_processor.py: a 400 naming it)
    reasoning_parser: bool = True
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def text_completion(self, payload: dict) -> dict:
        text = self.text_script(payload["prompt"])
        limit, finish, stop_reason = int(payload.get("max_tokens") or 16), "stop", None
        words = text.split(" ")
        if len(words) > limit:
            text, finish = " ".join(words[:limit]), "length"
        hits = sorted((text.find(s) + len(s), s) for s in payload.get("stop") or [] if s in text)
        if hits:
            end, stop = hits[0]
            finish = "stop"
            if self.stop_style == "vllm":
                text, stop_reason = text[: end - len(stop)], stop
            else:
                text = text[:end]
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": stop_reason}
        if self.stop_style != "vllm":
            del choice["stop_reason"]
        return {
            "id": "cmpl-x",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": {"prompt_tokens": 10, "completion_tokens": len(text.split(" ")), "total_tokens": 0},
        }

    def code_for(self, prompt: str) -> str:
        for needle, code in self.answers.items():
            if needle in prompt:
                return code
        return self.default_code

    def body(self, payload: dict) -> dict | None:
        prompt = payload["messages"][-1]["content"]
        if self.shape == "empty_choices":
            return {"id": "x", "object": "chat.completion", "created": 0, "model": self.model, "choices": []}
        elif self.shape == "no_message":
            return {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": self.model,
                "choices": [{"index": 0, "finish_reason": "stop"}],
            }
        message, finish = teacher_message(self.code_for(prompt), self.shape)
        return {
            "id": "x",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30},
        }


def build_app(state: FakeTeacher) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": state.model, "object": "model"}]})

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        payload = await request.json()
        with state._lock:
            state.requests.append(payload)
            index = len(state.requests)
        if state.delay:
            await asyncio.sleep(state.delay)
        if payload.get("model") != state.model:
            return JSONResponse({"error": {"message": f"The model `{payload.get('model')}` does not exist."}}, 404)
        if index <= state.fail_first:
            headers = {"retry-after": state.retry_after} if state.retry_after is not None else None
            return JSONResponse({"error": {"message": "temporarily unavailable"}}, state.fail_status, headers=headers)
        if "thinking_token_budget" in payload and not state.reasoning_parser:
            message = (
                "thinking_token_budget is set but reasoning_config is not configured. Please set --reasoning-parser "
                "and/or --reasoning-config to use thinking_token_budget."
            )
            return JSONResponse({"error": {"message": message, "type": "BadRequestError", "code": 400}}, 400)
        if state.shape == "error400":
            return JSONResponse({"error": {"message": "bad request"}}, 400)
        if state.shape == "garbage":
            return PlainTextResponse("this is not json", 200)
        return JSONResponse(state.body(payload))  # skips FastAPI's slow generic encoder

    @app.post("/v1/completions")
    async def completions(request: Request):
        payload = await request.json()
        with state._lock:
            state.requests.append(payload)
        if payload.get("model") != state.model:
            return JSONResponse({"error": {"message": f"The model `{payload.get('model')}` does not exist."}}, 404)
        if state.text_script is None or not isinstance(payload.get("prompt"), str):
            return JSONResponse({"error": {"message": "this fake continues one text prompt"}}, 400)
        return JSONResponse(state.text_completion(payload))

    return app


# ------------------------------------------------------------------ a fake `vllm serve` for rollouts


@dataclass
class FakeVLLMServer:
    """The parts of vLLM 0.33.0's OpenAI-compatible server the `vllm_server` rollout backend uses, behaving as
    vLLM's source says (vllm/entrypoints/serve/lora/api_router.py, openai/models/serving.py,
    openai/completion/protocol.py and serving.py), not a stand-in that accepts anything:

    - `/v1/load_lora_adapter` exists only with `runtime_lora_updating` (VLLM_ALLOW_RUNTIME_LORA_UPDATING;
      otherwise FastAPI's 404 {"detail": "Not Found"}); needs `lora_name` and `lora_path` (400), refuses a
      name already loaded unless `load_inplace` (400) and the base model's name (400); reads the adapter
      folder at load time: no adapter_config.json is vLLM's LoRAAdapterNotFoundError (404), a rank above
      `max_lora_rank` a 500. Success is a plain-text 200.
    - `/v1/unload_lora_adapter`: an unknown name is a 404.
    - `/v1/completions`: `model` must be the base model or a loaded adapter (404 "The model `x` does not
      exist."); `prompt` as token ids; `n` samples, each ending with the stop token it stopped on (kept in
      `token_ids`, left out of `text`); `return_token_ids` adds `token_ids` and `prompt_token_ids`;
      `logprobs=0` adds `logprobs.token_logprobs`. A knob left out takes `generation_defaults` (vLLM
      applies the model's generation_config), so a request that omits one samples something else. A `stop`
      string in the responder's text ends the sample there (v1/engine/output_processor.py trims the ids
      after the token that completed it: a responder that writes one returns exactly those ids), the text
      cut before it, or after it with `include_stop_str_in_output`, and named in `stop_reason`.
    - `prompt_logprobs=N` adds `choices[0].prompt_logprobs`: None for the first prompt token, then per token a
      map {"<token id>": {"logprob", "rank", "decoded_token"}} holding at least that token itself
      (`prompt_logprob(prefix ids, token)` gives its value); `max_tokens` below 1 is refused without `echo`
      (SamplingParams: "max_tokens must be at least 1").
    Each completion request is recorded with the adapter digest it used (`calls`).
    """

    base_model: str = "base"
    runtime_lora_updating: bool = True
    max_lora_rank: int = 16
    max_model_len: int = 4096  # `--max-model-len`: /v1/models reports it on the base model's card
    generation_defaults: dict = field(
        default_factory=lambda: {
            "top_k": 20,
            "temperature": 0.6,
            "top_p": 0.95,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
        }
    )
    responder: Any = None  # (prompt_ids, index, rng) -> (text, ids without the stop token); None: a few random ids
    stop_with: Any = None  # None: the request's first stop id; "length": run to max_tokens
    logprob: float = -0.5
    # the teacher's log-prob of `token` after `prefix` (prompt log-probs); None: -(token % 7) / 4
    prompt_logprob: Any = None
    port: int = 0
    loaded: dict = field(default_factory=dict)  # adapter name -> (path, digest of its weights when loaded)
    events: list = field(default_factory=list)  # ("load" | "unload", name)
    calls: list = field(default_factory=list)  # (adapter name or None, digest or None, request body)
    seed: int = 0

    def app(self) -> FastAPI:
        import hashlib
        import json
        import random
        from pathlib import Path

        app = FastAPI()
        rng = random.Random(self.seed)
        lock = threading.Lock()

        def error(message: str, kind: str, code: int, param: str | None = None) -> JSONResponse:
            return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, code)

        @app.get("/v1/models")
        async def models() -> JSONResponse:
            cards = [{"id": self.base_model, "object": "model", "max_model_len": self.max_model_len}]
            cards += [{"id": n, "object": "model", "parent": self.base_model} for n in self.loaded]
            return JSONResponse({"object": "list", "data": cards})

        if self.runtime_lora_updating:

            @app.post("/v1/load_lora_adapter")
            async def load(request: Request):
                body = await request.json()
                name, path = body.get("lora_name"), body.get("lora_path")
                if not name or not path:
                    return error("Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput", 400)
                if name == self.base_model:
                    return error(
                        f"The lora adapter '{name}' conflicts with a served base model.", "InvalidUserInput", 400
                    )
                if name in self.loaded and not body.get("load_inplace"):
                    return error(
                        f"The lora adapter '{name}' has already been loaded. If you want to load the adapter "
                        "in place, set 'load_inplace' to True.",
                        "InvalidUserInput",
                        400,
                    )
                config = Path(path) / "adapter_config.json"
                if not config.is_file():
                    return error(f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError", 404)
                rank = int(json.loads(config.read_text())["r"])
                if rank > self.max_lora_rank:
                    return error(
                        f"LoRA rank {rank} is greater than max_lora_rank {self.max_lora_rank}.",
                        "InternalServerError",
                        500,
                    )
                weights = Path(path) / "adapter_model.safetensors"
                digest = hashlib.sha256(weights.read_bytes()).hexdigest()[:16] if weights.is_file() else None
                with lock:
                    self.loaded[name] = (path, digest)
                    self.events.append(("load", name))
                return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.", 200)

            @app.post("/v1/unload_lora_adapter")
            async def unload(request: Request):
                body = await request.json()
                name = body.get("lora_name")
                if not name:
                    return error("'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput", 400)
                if name not in self.loaded:
                    return error(f"The lora adapter '{name}' cannot be found.", "NotFoundError", 404)
                with lock:
                    del self.loaded[name]
                    self.events.append(("unload", name))
                return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.", 200)

        @app.post("/v1/completions")
        async def completions(request: Request):
            body = await request.json()
            model = body.get("model")
            if model != self.base_model and model not in self.loaded:
                return error(
                    f"The model `{model}` does not exist. Valid aliases: {self.base_model}.",
                    "NotFoundError",
                    404,
                    "model",
                )
            prompt = body.get("prompt")
            if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
                return error("this fake takes one prompt of token ids", "BadRequestError", 400)
            if int(body.get("max_tokens", 16)) < 1 and not body.get("echo"):
                return error(
                    f"max_tokens must be at least 1, got {body['max_tokens']}.", "BadRequestError", 400, "max_tokens"
                )
            sampling = {
                k: body[k] if body.get(k) is not None else self.generation_defaults.get(k)
                for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
            }
            stops = list(body.get("stop_token_ids") or [])
            stop_strings = list(body.get("stop") or [])
            with lock:
                self.calls.append(
                    (
                        None if model == self.base_model else model,
                        self.loaded[model][1] if model in self.loaded else None,
                        body,
                        sampling,
                    )
                )
            choices = []
            for index in range(int(body.get("n", 1))):
                text, ids = (self.responder or _random_ids)(prompt, index, rng)
                ids, finish, stop_reason = list(ids), "length", None
                hit = min(((text.index(s), s) for s in stop_strings if s in text), default=None)
                if hit is not None and len(ids) <= body.get("max_tokens", 16):
                    end = hit[0] + (len(hit[1]) if body.get("include_stop_str_in_output") else 0)
                    text, finish, stop_reason = text[:end], "stop", hit[1]
                elif self.stop_with != "length" and stops and len(ids) < body.get("max_tokens", 16):
                    ids.append(stops[0])
                    finish, stop_reason = "stop", stops[0]
                ids = ids[: body.get("max_tokens", 16)]
                choice = {
                    "index": index,
                    "text": text,
                    "finish_reason": finish,
                    "stop_reason": stop_reason,
                    "logprobs": None,
                }
                if body.get("logprobs") is not None:
                    choice["logprobs"] = {
                        "text_offset": list(range(len(ids))),
                        "token_logprobs": [self.logprob] * len(ids),
                        "tokens": [f"token_id:{t}" for t in ids],
                        "top_logprobs": [{}] * len(ids),
                    }
                if body.get("return_token_ids"):
                    choice.update(token_ids=ids, prompt_token_ids=prompt)
                if body.get("prompt_logprobs") is not None:
                    value = self.prompt_logprob or (lambda prefix, token: -(token % 7) / 4)
                    choice["prompt_logprobs"] = [None] + [
                        {str(t): {"logprob": value(prompt[:i], t), "rank": 1, "decoded_token": f"t{t}"}}
                        for i, t in enumerate(prompt)
                        if i > 0
                    ]
                choices.append(choice)
            return JSONResponse(
                {
                    "id": "cmpl-fake",
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": choices,
                    "usage": {"prompt_tokens": len(prompt), "completion_tokens": 0, "total_tokens": 0},
                }
            )

        return app


def _random_ids(prompt_ids: list[int], index: int, rng: Any) -> tuple[str, list[int]]:
    ids = [rng.randrange(100, 1000) for _ in range(rng.randrange(3, 8))]
    return "x" * len(ids), ids


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RunningServer:
    """Start the fake server in a background thread: `with RunningServer(FakeTeacher()) as s: s.url`."""

    def __init__(self, state: FakeTeacher | FakeVLLMServer) -> None:
        self.state = state
        state.port = state.port or free_port()
        app = state.app() if isinstance(state, FakeVLLMServer) else build_app(state)
        config = uvicorn.Config(
            app, host="127.0.0.1", port=state.port, log_level="error", backlog=4096, limit_concurrency=10_000
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.state.port}/v1"

    def __enter__(self) -> RunningServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self.server.started:
            raise RuntimeError("fake server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


if __name__ == "__main__":  # handy by hand: python -m tests.fake_openai_server 8130
    import sys

    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8130
    uvicorn.run(build_app(FakeTeacher(port=port)), host="127.0.0.1", port=port)
