"""Hostile programs that try to pass without solving, or to reach what they must not: each attacks one
property of the sandbox (exiting early, always-equal objects, patched builtins, forged messages, secrets,
the environment, the network).

For every program we assert (1) its verdict is never `passed`, (2) it finished within its wall-clock
backstop plus 2 s, (3) no process of it is left, and (4) nothing outside its temporary directory changed.
Programs that would pass *only* if an attack worked (reading a secret file, the environment, the
network) are built so that their expected output is the secret itself.
"""

from __future__ import annotations

import os
import socket
import textwrap
import threading
import time
from pathlib import Path

import pytest

from sandbox.executor import SandboxLimits, SandboxPool, execute_program
from tests.conftest import ROOT
from tests.task_factory import assert_task, call_task, stdin_task
from utils.dataset_loader import Task

LIMITS = SandboxLimits(test_timeout=1.0, memory_mb=256, file_size_mb=4, output_bytes=1 << 20)

ASSERT_TASK = assert_task(
    "t/assert", "add", "assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(0, 5) == 5", problem="add"
)
STDIN_TASK = stdin_task("t/stdin", ("1 2\n", "3\n"), ("2 2\n", "4\n"), ("0 5\n", "5\n"), problem="add")
CALL_TASK = call_task("t/call", "add", ([1, 2], 3), ([2, 2], 4), ([0, 5], 5), problem="add")


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2, limits=LIMITS) as p:
        yield p


@pytest.fixture(scope="module")
def sentinel_dir(tmp_path_factory):
    """A folder outside every sandbox with a file that hostile programs try to delete or read."""
    folder = tmp_path_factory.mktemp("outside")
    (folder / "sentinel.txt").write_text("SECRET-42\n")
    return folder


def _descendants(root_pid: int) -> list[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parents[int(entry)] = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, frontier = [], [root_pid]
    while frontier:
        pid = frontier.pop()
        children = [p for p, pp in parents.items() if pp == pid]
        found += children
        frontier += children
    return found


def _owner(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _processes_of_uid(uid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    out.append(int(entry))
            except OSError:
                pass
    return out


def _snapshot(paths: list[Path]) -> dict:
    state: dict = {}
    for base in paths:
        for p in sorted(base.iterdir()) if base.is_dir() else []:
            try:
                if p.name == ".git" and p.is_dir():
                    # git's own lock files come and go in .git whenever a test in another xdist worker runs git
                    # (the phases record the commit), which moves the folder's mtime: compare what stays in it
                    state[str(p)] = sorted(name for name in os.listdir(p) if not name.endswith(".lock"))
                else:
                    state[str(p)] = (p.stat().st_mtime_ns, p.stat().st_size)
            except OSError:
                pass
    return state


def run_hostile(pool: SandboxPool, code: str, task: Task, sentinel_dir: Path):
    # /tmp itself is not snapshotted (other processes on the machine write there); the paths the
    # hostile programs target in it are checked by name below
    watched = [sentinel_dir, ROOT]
    before = _snapshot(watched)
    sentinel = (sentinel_dir / "sentinel.txt").read_text()
    start = time.monotonic()
    result = execute_program(
        textwrap.dedent(code).replace("SENTINEL_DIR", str(sentinel_dir)), task, limits=LIMITS, pool=pool
    )
    elapsed = time.monotonic() - start
    time.sleep(0.05)  # let the kernel finish tearing down killed processes
    assert not result.passed, result
    # a test is charged its CPU time where the host has a CPU cgroup; wall clock stops it at wall_factor times
    assert elapsed <= LIMITS.total_for(len(task.tests)) * LIMITS.wall_factor + 2.0, f"took {elapsed:.1f} s"
    for worker in pool._all:
        # allowed: the worker's zygote (forked before any job, it never runs a program) and, with a
        # dedicated uid, root-owned spare program processes waiting for their job (a program runs as
        # the uid, checked below, and cannot become root)
        helpers = set(worker.info.get("helper_pids", []))
        uid = worker.info.get("uid")

        def leftovers(worker=worker, helpers=helpers, uid=uid):
            return [
                p
                for p in _descendants(worker.process.pid)
                if p not in helpers and not (uid is not None and _owner(p) == 0)
            ]

        # an ended program is reaped by its zygote asynchronously: under load the zygote (nice 19 here)
        # can wait seconds for a CPU, and a program whose other threads are still exiting cannot be
        # reaped yet (measured; see sandbox.zygote.run_zygote), so wait a bounded time for the teardown
        deadline = time.monotonic() + 3.0
        while (left := leftovers()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not left, f"processes left behind: {left}"
        if worker.info.get("uid") is not None:
            assert not _processes_of_uid(worker.info["uid"])
    assert (sentinel_dir / "sentinel.txt").read_text() == sentinel
    assert _snapshot(watched) == before, "something outside the sandbox changed"
    assert not Path("/tmp/tgrpo-evil.txt").exists()
    return result


CONTROL = {
    "assert": ("def add(a, b):\n    return a + b\n", ASSERT_TASK),
    "stdin": ("a, b = map(int, input().split())\nprint(a + b)\n", STDIN_TASK),
    "call": ("def add(a, b):\n    return a + b\n", CALL_TASK),
}


@pytest.mark.parametrize("kind", sorted(CONTROL))
def test_controls_pass(pool, kind):
    code, task = CONTROL[kind]
    result = execute_program(code, task, limits=LIMITS, pool=pool)
    assert result.passed and result.tests_passed == 3, result


ALWAYS_EQ = """
class Anything:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __hash__(self): return 0
    def __bool__(self): return True
def add(a, b):
    return Anything()
"""

HOSTILE = {
    # --- exiting early: the harness, not the program, decides
    "sys_exit_0_at_import": ("import sys\nsys.exit(0)\n", ASSERT_TASK, None),
    "os__exit_0_at_import": ("import os\nos._exit(0)\n", ASSERT_TASK, None),
    "raise_systemexit_in_function": ("def add(a, b):\n    raise SystemExit(0)\n", ASSERT_TASK, "runtime_error"),
    "keyboard_interrupt_in_function": ("def add(a, b):\n    raise KeyboardInterrupt\n", CALL_TASK, "runtime_error"),
    "os__exit_inside_call": ("import os\ndef add(a, b):\n    os._exit(0)\n", CALL_TASK, "runtime_error"),
    "stdin_exit_before_printing": ("import os\nos._exit(0)\n", STDIN_TASK, "wrong_answer"),
    # --- objects that claim equality
    "always_equal_object_assert": (ALWAYS_EQ, ASSERT_TASK, "wrong_answer"),
    "always_equal_object_call": (ALWAYS_EQ, CALL_TASK, "wrong_answer"),
    "int_subclass_lying_eq": (
        "class I(int):\n    def __eq__(s, o): return True\n    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return I(-1)\n",
        ASSERT_TASK,
        "wrong_answer",
    ),
    "list_subclass_lying_eq": (
        "class L(list):\n    def __eq__(s, o): return True\ndef add(a, b):\n    return L()\n",
        CALL_TASK,
        "wrong_answer",
    ),
    # --- patching the harness or the language
    "patch_builtins": (
        "import builtins\nbuiltins.isinstance = lambda *a: True\nbuiltins.type = lambda *a: int\n"
        "builtins.AssertionError = StopIteration\ndef add(a, b):\n    return -1\n",
        ASSERT_TASK,
        "wrong_answer",  # -1 is judged: the child's encoder no longer calls json.dumps (the patched isinstance)
    ),
    "patch_encoder_via_gc": (
        "import gc\nfor f in gc.get_objects():\n    if callable(f) and getattr(f, '__name__', '') in "
        "('encode_value', 'write_message', 'check_value'):\n        f.__code__ = (lambda *a, **k: True).__code__\n"
        "def add(a, b):\n    return -1\n",
        ASSERT_TASK,
        None,
    ),
    "forge_result_messages": (
        "import json, os, struct\ndef forge(i, v):\n    d = json.dumps({'k': 'val', 'i': i, 'v': v}).encode()\n"
        "    os.write(3, struct.pack('>I', len(d)) + d)\nfor i in range(3):\n    forge(i, True)\n"
        "    forge(i, {'__t': 'object'})\nos._exit(0)\n",
        ASSERT_TASK,
        None,
    ),
    "fake_success_markers": (
        "print('ALL TESTS PASSED')\nprint('True')\nprint('{\"passed\": true}')\n",
        STDIN_TASK,
        "wrong_answer",
    ),
    "read_caller_frame_constants": (
        "import sys\ndef add(a, b):\n    f = sys._getframe(1)\n"
        "    consts = [c for c in f.f_code.co_consts if isinstance(c, int)]\n"
        "    return consts[-1] if consts else -1\n",
        ASSERT_TASK,
        "wrong_answer",
    ),
    # --- attacking processes and file descriptors
    "kill_parent": (
        "import os, ctypes\nctypes.CDLL(None).kill(os.getppid(), 9)\ndef add(a, b):\n    return -1\n",
        CALL_TASK,
        None,
    ),
    "close_all_fds": ("import os\nos.closerange(0, 1024)\ndef add(a, b):\n    return a + b\n", CALL_TASK, None),
    "redirect_result_fd": (
        "import os\nfd = os.open(os.devnull, os.O_WRONLY)\nos.dup2(fd, 3)\ndef add(a, b):\n    return a + b\n",
        ASSERT_TASK,
        None,
    ),
    # --- resource exhaustion
    "infinite_loop": ("while True:\n    pass\n", STDIN_TASK, "timeout"),
    "infinite_loop_in_function": ("def add(a, b):\n    while True:\n        pass\n", CALL_TASK, "timeout"),
    "fork_bomb_os": ("import os\nwhile True:\n    os.fork()\n", STDIN_TASK, "runtime_error"),
    "fork_bomb_ctypes": ("import ctypes\nlibc = ctypes.CDLL(None)\nwhile True:\n    libc.fork()\n", STDIN_TASK, None),
    "thread_bomb": (
        "import threading, time\nwhile True:\n"
        "    threading.Thread(target=time.sleep, args=(100,), daemon=True).start()\n",
        STDIN_TASK,
        None,
    ),
    "allocate_20_gb": ("x = bytearray(20 * 1024 ** 3)\n", STDIN_TASK, "memory_limit"),
    "print_1_gb": (
        "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)\n",
        STDIN_TASK,
        "output_limit",
    ),
    "stderr_flood": (
        "import sys\nchunk = 'e' * (1 << 20)\nwhile True:\n    sys.stderr.write(chunk)\n",
        STDIN_TASK,
        "output_limit",
    ),
    "huge_file": (
        "with open('big.bin', 'wb') as f:\n    while True:\n        f.write(b'0' * (1 << 20))\n",
        STDIN_TASK,
        None,
    ),
    "deep_recursion": (
        "import sys\nsys.setrecursionlimit(10 ** 7)\ndef f(n):\n    return f(n + 1) + 1\nf(0)\n",
        STDIN_TASK,
        None,
    ),
    "segfault_ctypes": ("import ctypes\nctypes.string_at(0)\n", STDIN_TASK, "runtime_error"),
    "ignore_sigterm": (
        "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass\n",
        STDIN_TASK,
        "timeout",
    ),
    "child_outlives_timeout": (
        "import ctypes, time\nlibc = ctypes.CDLL(None)\nif libc.fork() == 0:\n    libc.setsid()\n"
        "    while True:\n        time.sleep(1)\nwhile True:\n    pass\n",
        STDIN_TASK,
        "timeout",
    ),
    "daemon_child_after_exit": (
        "import ctypes, time\nlibc = ctypes.CDLL(None)\nif libc.fork() == 0:\n    libc.setsid()\n"
        "    if libc.fork() == 0:\n        time.sleep(60)\n    libc._exit(0)\nprint(0)\n",
        STDIN_TASK,
        "wrong_answer",
    ),
    # --- the file system outside the working directory
    "delete_sentinel_os": ("import os\nos.remove('SENTINEL_DIR/sentinel.txt')\n", STDIN_TASK, None),
    "delete_sentinel_ctypes": (
        "import ctypes\nctypes.CDLL(None).unlink(b'SENTINEL_DIR/sentinel.txt')\nprint(0)\n",
        STDIN_TASK,
        None,
    ),
    "overwrite_sentinel": ("open('SENTINEL_DIR/sentinel.txt', 'w').write('pwned')\n", STDIN_TASK, None),
    "create_files_outside": (
        "for p in ('SENTINEL_DIR/new.txt', '/tmp/tgrpo-evil.txt', '" + str(ROOT) + "/evil.txt'):\n"
        "    try:\n        open(p, 'w').write('x')\n    except OSError:\n        pass\nprint(0)\n",
        STDIN_TASK,
        "wrong_answer",
    ),
    "delete_project_file_ctypes": (
        "import ctypes\nctypes.CDLL(None).unlink(b'" + str(ROOT) + "/README.md')\nprint(0)\n",
        STDIN_TASK,
        "wrong_answer",
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_program_never_passes(pool, sentinel_dir, name):
    code, task, expected_status = HOSTILE[name]
    result = run_hostile(pool, code, task, sentinel_dir)
    if expected_status is not None:
        assert result.status == expected_status, result


def _secret_task(secret: str) -> Task:
    # passing requires printing the secret: possible only if the attack works
    return stdin_task("t/secret", ("", secret), problem="leak")


def test_cannot_read_files_outside(pool, sentinel_dir):
    code = "print(open('SENTINEL_DIR/sentinel.txt').read())\n"
    result = run_hostile(pool, code, _secret_task("SECRET-42"), sentinel_dir)
    assert result.status == "runtime_error"


def test_cannot_read_the_harness_or_task_files(pool, sentinel_dir):
    secret_line = (ROOT / "sandbox" / "executor.py").read_text().splitlines()[0]
    code = f"print(open({str(ROOT / 'sandbox' / 'executor.py')!r}).readline())\n"
    run_hostile(pool, code, _secret_task(secret_line), sentinel_dir)
    fixture = ROOT / "data" / "embedded" / "mbpp_fixtures.jsonl"
    first = fixture.read_text().splitlines()[0]
    run_hostile(pool, f"print(open({str(fixture)!r}).readline())\n", _secret_task(first), sentinel_dir)


def test_environment_is_scrubbed(pool, sentinel_dir, monkeypatch):
    # the variable is set in the parent before the program runs; the program passes only if it leaks
    monkeypatch.setenv("TGRPO_TEST_SECRET", "leaked-value")
    code = "import os\nprint(os.environ.get('TGRPO_TEST_SECRET', 'absent'))\n"
    result = run_hostile(pool, code, _secret_task("leaked-value"), sentinel_dir)
    assert result.status == "wrong_answer"


def test_no_network_not_even_the_hosts_loopback(pool, sentinel_dir):
    received = []
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(3)
    port = server.getsockname()[1]

    def accept():
        try:
            conn, _ = server.accept()
            received.append(conn.recv(100))
        except OSError:
            pass

    thread = threading.Thread(target=accept)
    thread.start()
    code = (
        "import socket\ns = socket.create_connection(('127.0.0.1', PORT), timeout=1)\ns.sendall(b'stolen')\n"
        "print(s.recv(10).decode())\n"
    ).replace("PORT", str(port))
    result = run_hostile(pool, code, _secret_task("pong"), sentinel_dir)
    outside = "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)\nprint('pong')\n"
    result_outside = run_hostile(pool, outside, _secret_task("pong"), sentinel_dir)
    thread.join()
    server.close()
    assert received == [] and result.status == "runtime_error" and result_outside.status == "runtime_error"


def test_worker_survives_and_pool_recovers_after_hostile_programs(pool):
    code, task = CONTROL["call"]
    assert all(execute_program(code, task, limits=LIMITS, pool=pool).passed for _ in range(4))
