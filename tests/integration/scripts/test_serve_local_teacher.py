"""The local teacher's kv engine for real: `python -m scripts.serve_local_teacher` on the embedded models, asked
through the project's own client (clients.openai_compat) and through plain HTTP."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from clients.openai_compat import TeacherClient
from tests.cli_helpers import run_script, start_script
from utils.prompts import build_chat_messages, get_unified_prompt
from utils.student_model import EMBEDDED_MODELS, resolve_model_path

PROMPT = build_chat_messages(get_unified_prompt("Write a Python function add(a, b) that returns a + b."))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Teacher:
    """A running `serve_local_teacher` whose output lines are collected as they come."""

    def __init__(self, *flags: str, ready_within: float = 180) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.lines: list[str] = []
        self.process = start_script(
            "-m",
            "scripts.serve_local_teacher",
            "--port",
            str(self.port),
            *flags,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        deadline = time.monotonic() + ready_within
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2)
                return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise AssertionError("the teacher did not answer:\n" + "\n".join(self.lines))

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30) as answer:
            return json.loads(answer.read())

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        request = urllib.request.Request(
            f"{self.url}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def batch_lines(self) -> list[str]:
        return [line for line in self.lines if line.startswith("batch ")]

    def batch_lines_once(self, count: int, within: float = 10) -> list[str]:
        """The batch lines once `count` have been read: the server logs a batch after answering its requests, and
        the reader thread gets the line some time after the client got its answers."""
        deadline = time.monotonic() + within
        while len(self.batch_lines()) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.batch_lines()

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self.reader.join(timeout=10)  # every line it wrote, read
        return code


@pytest.fixture(scope="module")
def teacher() -> Iterator[Teacher]:
    """The embedded SmolLM2-135M-Instruct on the kv engine; a 0.5 s batch window, so that requests sent together
    share a batch however busy the machine is."""
    server = Teacher("--engine", "kv", "--batch_window_ms", "500")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def served() -> str:
    return resolve_model_path(EMBEDDED_MODELS[0])


def client(teacher: Teacher, served: str, **settings) -> TeacherClient:
    return TeacherClient(teacher.url, served, enable_thinking=False, max_retries=0, **settings)


def test_models_lists_the_folder_as_the_served_name(teacher, served):
    [card] = teacher.get("/v1/models")["data"]
    assert card["id"] == served and card["max_model_len"] > 0
    assert teacher.get("/health")["engine"] == "kv"

    async def listed():
        async with client(teacher, served) as c:
            return await c.list_models()

    assert asyncio.run(listed()) == [served]


def test_a_chat_completion_through_the_projects_client(teacher, served):
    async def ask():
        async with client(teacher, served, temperature=0.7, top_p=0.8, max_tokens=24, presence_penalty=1.5) as c:
            return await c.complete(PROMPT)

    response = asyncio.run(ask())
    assert response.ok and response.text and response.finish_reason in ("stop", "length")
    usage = response.usage
    assert 0 < usage["completion_tokens"] <= 24 and usage["prompt_tokens"] > 20
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert any(line.startswith("note: presence_penalty is not applied") for line in teacher.lines)


def test_two_concurrent_requests_are_one_batch(teacher, served):
    before = len(teacher.batch_lines())

    async def ask_two():
        async with client(teacher, served, temperature=0.7, top_p=0.8, max_tokens=8) as c:
            return await asyncio.gather(c.complete(PROMPT), c.complete(PROMPT))

    responses = asyncio.run(ask_two())
    assert all(r.ok and r.text for r in responses)
    new = teacher.batch_lines_once(before + 1)[before:]
    assert len(new) == 1 and " rows=2 requests=2 " in new[0], new


def test_max_tokens_ends_with_length(teacher, served):
    status, body = teacher.post(
        "/chat/completions", {"model": served, "messages": PROMPT, "max_tokens": 5, "temperature": 0}
    )
    assert status == 200
    [choice] = body["choices"]
    assert choice["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 5


@pytest.mark.slow
def test_n_gives_that_many_choices_and_counts_their_tokens(teacher, served):
    status, body = teacher.post(
        "/chat/completions", {"model": served, "messages": PROMPT, "max_tokens": 4, "n": 3, "temperature": 0}
    )
    assert status == 200 and [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert len({c["message"]["content"] for c in body["choices"]}) == 1  # greedy: three times the same
    assert body["usage"]["completion_tokens"] == 12


def test_a_stop_string_ends_with_stop_and_is_left_out(teacher, served):
    greedy = {"model": served, "messages": PROMPT, "max_tokens": 16, "temperature": 0}
    status, body = teacher.post("/chat/completions", greedy)
    full = body["choices"][0]["message"]["content"]
    stop = full.split()[2]  # a word the greedy answer writes after its start (SmolLM2: "```python\ndef add(a, b):")
    status, body = teacher.post("/chat/completions", {**greedy, "stop": [stop]})
    assert status == 200
    [choice] = body["choices"]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    assert stop not in choice["message"]["content"] and full.startswith(choice["message"]["content"])
    assert body["usage"]["completion_tokens"] < 16


@pytest.mark.slow
def test_text_completions_stop_and_the_client_restores_the_stop_string(teacher, served):
    """Tool mode's path: /v1/completions with stop, as vLLM answers it (stop string left out, named in
    stop_reason), which the client puts back."""
    prompt = "def add(a, b):\n    return a + b\n\n\ndef"

    async def greedy(stop):
        async with client(teacher, served, temperature=0.0) as c:
            return await c.complete_text(prompt, stop, 16)

    full = asyncio.run(greedy([]))
    assert full.ok and full.finish_reason == "length" and full.text
    stop = full.text.strip()[:3]
    cut = asyncio.run(greedy([stop]))
    assert cut.finish_reason == "stop" and cut.stop_string == stop and cut.text.endswith(stop)


def test_what_it_cannot_serve_is_refused_in_the_clients_terms(teacher, served):
    status, body = teacher.post("/chat/completions", {"model": "Qwen/Qwen3-32B-FP8", "messages": PROMPT})
    assert status == 404 and "does not exist" in body["error"]["message"]
    status, body = teacher.post("/completions", {"model": served, "prompt": "x", "prompt_logprobs": 0})
    assert status == 400 and "prompt_logprobs" in body["error"]["message"]
    status, body = teacher.post("/chat/completions", {"model": served, "messages": PROMPT, "max_tokens": 10**6})
    assert status == 400 and "maximum context length" in body["error"]["message"]


@pytest.mark.slow
def test_a_burst_is_one_batch_a_seed_repeats_and_sigterm_stops_the_server():
    """The tiny random model: a burst of 12 requests through the client (more connections at once than a listen
    backlog of 5 takes) is one batch; a seeded request gives the same answer twice; SIGTERM ends the server."""
    tiny = Teacher("--model", EMBEDDED_MODELS[1], "--engine", "kv", "--batch_window_ms", "200")
    served = resolve_model_path(EMBEDDED_MODELS[1])
    try:

        async def burst():
            async with TeacherClient(tiny.url, served, max_tokens=4, max_retries=0, enable_thinking=False) as c:
                return await asyncio.gather(*[c.complete([{"role": "user", "content": f"hi {i}"}]) for i in range(12)])

        assert all(r.ok for r in asyncio.run(burst()))
        batches = [line.split(" prompt_tokens")[0] for line in tiny.batch_lines_once(1)]
        assert batches == ["batch 1: rows=12 requests=12"]
        body = {"model": served, "prompt": "hello", "max_tokens": 6, "seed": 11}
        first, second = tiny.post("/completions", body)[1], tiny.post("/completions", body)[1]
        assert first["choices"][0]["text"] == second["choices"][0]["text"]
    finally:
        code = tiny.stop(signal.SIGTERM)
    assert code == 0 and tiny.lines[-1].startswith("stopped (SIGTERM; 3 batches served")


@pytest.mark.slow
def test_a_model_the_kv_engine_cannot_run_is_refused_by_name(gelu_model_dir):
    proc = run_script(
        "-m", "scripts.serve_local_teacher", "--model", str(gelu_model_dir), "--engine", "kv", timeout=120
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: the kv engine cannot serve {gelu_model_dir}: the kv-cache sampler does not implement hidden_act "
        "'gelu'. Use --engine transformers."
    )


@pytest.mark.slow
def test_auto_falls_back_to_transformers_serve_with_one_line(gelu_model_dir):
    fallback = Teacher("--model", str(gelu_model_dir))
    try:
        note = (
            f"note: the kv engine cannot serve {gelu_model_dir} (the kv-cache sampler does not implement hidden_act "
            "'gelu'); falling back to `transformers serve`"
        )
        assert note in fallback.lines
        following = fallback.lines[fallback.lines.index(note) + 1]
        assert following.startswith(f"serving {gelu_model_dir} with `transformers serve`")
        assert "engine" not in fallback.get("/health")  # transformers serve's own /health answers
    finally:
        fallback.stop()
