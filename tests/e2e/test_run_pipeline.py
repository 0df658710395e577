"""scripts/run_pipeline.sh's handling of its local teacher, with every phase and the teacher replaced by stubs.

The script runs from a copy in a temporary folder, so its data/ and outputs/ land there; `PYTHON` points at a
stub that dispatches on the script name (tests/pipeline_stub.py).
"""

from __future__ import annotations

import http.server
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.pipeline_stub import Health

ROOT = Path(__file__).resolve().parents[2]
STUB = Path(__file__).resolve().parents[1] / "pipeline_stub.py"

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="run_pipeline.sh needs curl")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def setup(tmp_path: Path, **env: str) -> tuple[Path, dict[str, str]]:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "data").mkdir()
    shutil.copy(ROOT / "scripts" / "run_pipeline.sh", tmp_path / "scripts" / "run_pipeline.sh")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STUB}" "$@"\n')
    python.chmod(0o755)
    full = dict(os.environ, PYTHON=str(python), STUB_LOG=str(tmp_path / "stub.log"), **env)
    return tmp_path / "scripts" / "run_pipeline.sh", full


def pids_alive(tmp_path: Path) -> list[int]:
    alive = []
    for line in (tmp_path / "stub.log").read_text().splitlines():
        name, pid = line.split()
        if name == "teacher":
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                continue
            alive.append(int(pid))
    return alive


def test_refuses_a_teacher_it_did_not_start(tmp_path: Path) -> None:
    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        script, env = setup(tmp_path, TEACHER_PORT=str(port))
        done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
    assert done.returncode != 0
    assert f"port {port}" in done.stdout + done.stderr
    assert not (tmp_path / "stub.log").exists()  # no phase ran


def test_teacher_that_ignores_sigterm_is_killed_within_seconds(tmp_path: Path) -> None:
    script, env = setup(tmp_path, TEACHER_PORT=str(free_port()), STUB_TEACHER_IGNORES_TERM="1")
    started = time.monotonic()
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - started < 45
    assert pids_alive(tmp_path) == []
    phase2 = next(line for line in (tmp_path / "stub.log").read_text().splitlines() if line.startswith("phase2"))
    assert phase2


@pytest.mark.parametrize(("engine", "in_flight"), [("transformers", 1), ("kv", 32)])
def test_local_teacher_gets_what_its_engine_batches_and_no_retries(tmp_path: Path, engine: str, in_flight: int) -> None:
    """`transformers serve` generates one request at a time; the kv engine (its /health says so) batches them."""
    extra = {"STUB_TEACHER_ENGINE": "kv"} if engine == "kv" else {}
    script, env = setup(tmp_path, TEACHER_PORT=str(free_port()), **extra)
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    args = (tmp_path / "phase2_args").read_text()
    assert f"teacher.max_concurrent_requests={in_flight}" in args.split()
    assert "teacher.max_retries=0" in args
    assert "teacher.request_timeout=350" in args  # 30 s + 2 s per token of the stub's max_tokens (160)
    assert f"the local teacher takes {in_flight} request(s) at a time" in done.stdout


@pytest.mark.parametrize("through", ["script", "make run"])
def test_ctrl_c_stops_everything_with_rc_130(tmp_path: Path, through: str) -> None:
    script, env = setup(tmp_path, TEACHER_PORT=str(free_port()), STUB_PHASE2_SLEEP="60")
    if through == "make run":  # the Makefile's own target, its installer step taken as done
        shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
        command = ["make", "--no-print-directory", "-o", "install", "run", f"PY={env['PYTHON']}"]
    else:
        command = ["bash", str(script)]
    proc = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        # a terminal's shell starts with Ctrl-C's default disposition, whatever this test process inherited (a
        # shell that starts with SIGINT ignored can never trap it)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (tmp_path / "stub.log").exists() and "phase2" in (tmp_path / "stub.log").read_text():
            break
        time.sleep(0.2)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal does on Ctrl-C: the whole foreground group
    output, _ = proc.communicate(timeout=45)
    # make passes the interrupt on by dying of SIGINT itself (a shell shows 130 for it)
    assert proc.returncode in ((130,) if through == "script" else (130, -signal.SIGINT)), output
    assert b"interrupted: make run stopped (rc 130)" in output
    assert pids_alive(tmp_path) == []
    assert b"Traceback" not in output


def test_the_preflight_leaves_the_teacher_out_and_checks_it_once_it_answers(tmp_path: Path) -> None:
    script, env = setup(tmp_path, TEACHER_PORT=str(free_port()))
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    order = [line.split()[0] for line in (tmp_path / "stub.log").read_text().splitlines()]
    assert order[:5] == ["test_all:skip", "phase1_prepare_data", "teacher", "test_all:only", "phase2"], order


def test_each_step_and_the_end_say_how_long_the_run_has_taken(tmp_path: Path) -> None:
    script, env = setup(tmp_path, TEACHER_PORT=str(free_port()))
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    headers = [line for line in done.stdout.splitlines() if line.startswith("== ")]
    assert len(headers) == 5 and all(re.search(r"\[\d+ min \d\d s\] ==$", h) for h in headers), headers
    assert re.search(r"^make run took \d+ min \d\d s$", done.stdout, re.MULTILINE), done.stdout[-500:]


def test_the_phases_wait_passively_for_their_threads_unless_told_otherwise(tmp_path: Path) -> None:
    # spinning OpenMP threads make a busy machine several times slower; a user's own setting is kept
    script, env = setup(tmp_path, TEACHER_PORT=str(free_port()))
    env.pop("OMP_WAIT_POLICY", None)
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "phase3_omp").read_text() == "PASSIVE"
    (tmp_path / "own").mkdir()
    script, env = setup(tmp_path / "own", TEACHER_PORT=str(free_port()), OMP_WAIT_POLICY="ACTIVE")
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "own" / "phase3_omp").read_text() == "ACTIVE"


def test_a_second_run_in_the_folder_is_refused_before_it_writes_anything(tmp_path: Path) -> None:
    import fcntl

    script, env = setup(tmp_path, TEACHER_PORT=str(free_port()))
    lock = (tmp_path / "data" / ".tgrpo-pipeline.lock").open("a+")
    lock.write("pid 4242, started 2026-01-01 00:00:00")
    lock.flush()
    fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # the first run, still going
    try:
        done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    finally:
        lock.close()
    assert done.returncode == 1, done.stdout + done.stderr
    assert "another make run is using this folder" in done.stderr and "pid 4242" in done.stderr
    assert "--output_dir" not in done.stderr  # make run has no such flag
    assert not (tmp_path / "stub.log").exists()  # no preflight, no phase ran
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [".tgrpo-pipeline.lock"]
    # once the first run has ended, the lock is free
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_taken_teacher_port_is_refused_before_the_preflight_and_phase_1(tmp_path: Path) -> None:
    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        script, env = setup(tmp_path, TEACHER_PORT=str(port))
        done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
    assert done.returncode == 1
    assert f"something already answers on port {port}" in done.stderr
    assert not (tmp_path / "stub.log").exists()  # neither the preflight nor phase 1 ran


def test_a_teacher_that_died_in_phase_2_is_named_and_reaches_the_summary(tmp_path: Path) -> None:
    import json

    script, env = setup(tmp_path, TEACHER_PORT=str(free_port()), STUB_PHASE2_KILLS_TEACHER="1")
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warning: the local teacher this run started (pid " in done.stderr
    assert "died during phase 2; its log: data/local_teacher.log" in done.stderr
    args = json.loads((tmp_path / "summary_args").read_text())
    assert args[args.index("--warn") + 1].startswith("the local teacher this run started")


def test_the_printed_total_counts_from_when_make_began(tmp_path: Path) -> None:
    script, env = setup(tmp_path, TEACHER_PORT=str(free_port()), RUN_STARTED=str(int(time.time()) - 600))
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^make run took 1[01] min \d\d s$", done.stdout, re.MULTILINE), done.stdout[-300:]


def test_make_says_what_it_installs_and_passes_its_start_to_the_run(tmp_path: Path) -> None:
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    for name in ("requirements.txt", "requirements-cpu.txt", "requirements-dev.txt"):
        (tmp_path / name).write_text("")
    dry = subprocess.run(
        ["make", "--no-print-directory", "-n", "run", "VENV=venv"], cwd=tmp_path, capture_output=True, text=True
    )
    assert dry.returncode == 0, dry.stderr
    assert "Installing into venv: torch (CPU build)" in dry.stdout and "~1 min on a quiet machine" in dry.stdout
    assert re.search(r"RUN_STARTED=\d{10} ", dry.stdout), dry.stdout
