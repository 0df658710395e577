"""A scriptable OpenAI-compatible chat server on 127.0.0.1, for tests and benchmarks.

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

SHAPES = ("inline", "reasoning", "reasoning_content", "template_opened", "truncated", "no_thinking")


@dataclass
class FakeTeacher:
    model: str = "fake-teacher"
    shape: str = "inline"  # one of SHAPES, or: empty_choices, no_message, garbage, error400
    delay: float = 0.0  # seconds before answering
    fail_first: int = 0  # answer this many requests with `fail_status` first
    fail_status: int = 500
    retry_after: str | None = None  # sent as the Retry-After header of the failed answers
    answers: dict[str, str] = field(default_factory=dict)  # substring of the prompt -> code to answer with
    default_code: str = "def solution():\n    return None"
    requests: list[dict] = field(default_factory=list)
    port: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def code_for(self, prompt: str) -> str:
        for needle, code in self.answers.items():
            if needle in prompt:
                return code
        return self.default_code

    def body(self, payload: dict) -> dict | None:
        prompt = payload["messages"][-1]["content"]
        code = self.code_for(prompt)
        answer = f"```python\n{code}\n```"
        message: dict[str, Any] = {"role": "assistant"}
        finish = "stop"
        if self.shape == "inline":
            message["content"] = f"<think>\nI will solve it step by step.\n</think>\n\n{answer}"
        elif self.shape == "reasoning":
            message.update(content=answer, reasoning="I will solve it step by step.")
        elif self.shape == "reasoning_content":
            message.update(content=answer, reasoning_content="I will solve it step by step.")
        elif self.shape == "template_opened":
            message["content"] = f"I will solve it step by step.\n</think>\n\n{answer}"
        elif self.shape == "truncated":
            message["content"] = "<think>\nI will solve it step by step, first"
            finish = "length"
        elif self.shape == "no_thinking":
            message["content"] = answer
        elif self.shape == "empty_choices":
            return {"id": "x", "object": "chat.completion", "created": 0, "model": self.model, "choices": []}
        elif self.shape == "no_message":
            return {"id": "x", "object": "chat.completion", "created": 0, "model": self.model,
                    "choices": [{"index": 0, "finish_reason": "stop"}]}
        return {"id": "x", "object": "chat.completion", "created": int(time.time()), "model": self.model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30}}


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
        if state.shape == "error400":
            return JSONResponse({"error": {"message": "bad request"}}, 400)
        if state.shape == "garbage":
            return PlainTextResponse("this is not json", 200)
        return JSONResponse(state.body(payload))  # skips FastAPI's slow generic encoder

    return app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RunningServer:
    """Start the fake server in a background thread: `with RunningServer(FakeTeacher()) as s: s.url`."""

    def __init__(self, state: FakeTeacher) -> None:
        self.state = state
        state.port = state.port or free_port()
        config = uvicorn.Config(build_app(state), host="127.0.0.1", port=state.port, log_level="error",
                                backlog=4096, limit_concurrency=10_000)
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


if __name__ == "__main__":  # handy by hand: python tests/fake_openai_server.py 8130
    import sys

    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8130
    uvicorn.run(build_app(FakeTeacher(port=port)), host="127.0.0.1", port=port)
