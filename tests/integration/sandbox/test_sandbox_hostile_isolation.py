"""Hostile programs against the isolation, one group per class of docs/sandbox.md's table (root acting on
sandbox paths, inherited state, timing, the parent trusting replies, sandbox_error on demand, host
resources, lenient verdicts, the fallback).

Each program here got a false pass, broke a neighbour, crashed or hung the harness, or changed the
host on an earlier sandbox. Cross-sample attacks run on a one-worker pool so that the
attacker and its victim meet on the same worker. Every test also checks what the first battery
checks: no process, file or IPC object of the program is left, and the pool keeps working.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sandbox.executor import SandboxLimits, SandboxPool, execute_many, execute_program
from sandbox.judge import plan_assert, stdout_matches
from tests.integration.sandbox.test_sandbox_hostile_cheating import (
    ALWAYS_EQ,
    ASSERT_TASK,
    CALL_TASK,
    CONTROL,
    STDIN_TASK,
    _descendants,
    _processes_of_uid,
)
from tests.task_factory import assert_task, call_task, stdin_task
from utils.dataset_loader import Task

LIMITS = SandboxLimits(test_timeout=1.0, memory_mb=256, file_size_mb=4, output_bytes=1 << 20)
AS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not AS_ROOT, reason="the namespace sandbox needs root")


@pytest.fixture()
def pool():
    # one pool per test: an attack that breaks a worker must not decide the next test's outcome
    with SandboxPool(workers=1, limits=LIMITS) as p:
        yield p


def _sysv_ipc() -> set[str]:
    found = set()
    for kind in ("shm", "sem", "msg"):
        try:
            lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
        except OSError:
            continue
        found |= {f"{kind}:{line.split()[1]}" for line in lines if line.split()}
    return found


def run(pool: SandboxPool, code: str, task: Task, limit_s: float = 30.0):
    """Run one program with a hard wall-clock bound in the test (a hang is a failure, not a stuck suite)."""
    ipc_before = _sysv_ipc()
    with ThreadPoolExecutor(1) as executor:
        future = executor.submit(execute_program, textwrap.dedent(code), task, limits=LIMITS, pool=pool)
        result = future.result(timeout=limit_s)
    # an ended program is reaped by its zygote asynchronously (see test_sandbox_hostile_cheating.run_hostile):
    # wait a bounded time for the teardown
    deadline = time.monotonic() + 3.0
    while any(_descendants_of_program(w) for w in pool._all) and time.monotonic() < deadline:
        time.sleep(0.05)
    for worker in pool._all:
        assert not _descendants_of_program(worker), "processes left behind"
    assert _sysv_ipc() == ipc_before, "System V IPC objects left behind on the host"
    return result


def _descendants_of_program(worker) -> list[int]:
    """Processes of the program: the worker's descendants that run as the sandbox uid (or any, without one)."""
    uid = worker.info.get("uid")
    if uid is not None:  # every process a program starts runs as this uid (harness processes are root)
        return _processes_of_uid(uid)
    helpers = set(worker.info.get("helper_pids", []))
    return [p for p in _descendants(worker.process.pid) if p not in helpers]


def assert_pool_healthy(pool: SandboxPool) -> None:
    for kind in ("assert", "stdin", "call"):
        code, task = CONTROL[kind]
        result = run(pool, code, task)
        assert result.passed, (kind, result)


# ------------------------------------------------------------------------------------------
# class 1: root acting on paths the sandboxed user controls
# ------------------------------------------------------------------------------------------


@pytest.fixture()
def host_dir():
    """A folder that the worker (root) could reach but the program must never touch."""
    folder = Path("/var/cache") / f"tgrpo-hostile-{secrets.token_hex(4)}"
    folder.mkdir(parents=True)
    (folder / "keep.txt").write_text("keep")
    (folder / "sub").mkdir()
    (folder / "sub" / "keep2.txt").write_text("keep")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@needs_root
def test_c1_workdir_swapped_for_a_symlink_to_a_host_folder(pool, host_dir):
    # the program moves its own working directory away and leaves a symlink to a host folder in its place
    code = f"""
    import ctypes, os
    libc = ctypes.CDLL(None)
    here = os.getcwd()
    libc.rename(here.encode(), (here + '-moved').encode())
    libc.symlink(b'{host_dir}', here.encode())
    print(0)
    """
    run(pool, code, STDIN_TASK)
    run(pool, *CONTROL["stdin"])  # the next job's cleanup must not follow it either
    assert (host_dir / "keep.txt").exists() and (host_dir / "sub" / "keep2.txt").exists()


@needs_root
def test_c1_symlinks_planted_in_the_workdir(pool, host_dir):
    code = f"""
    import ctypes, os
    libc = ctypes.CDLL(None)
    os.mkdir('d')
    libc.symlink(b'{host_dir}', b'd/link')
    libc.symlink(b'{host_dir}/keep.txt', b'file_link')
    libc.symlink(b'{host_dir}', b'dirlink')
    print(0)
    """
    run(pool, code, STDIN_TASK)
    assert_pool_healthy(pool)
    assert (host_dir / "keep.txt").read_text() == "keep" and (host_dir / "sub" / "keep2.txt").exists()


def test_c1_deep_directory_tree_does_not_break_the_worker(pool):
    code = """
    import os
    for _ in range(3000):
        os.mkdir('d')
        os.chdir('d')
    print(0)
    """
    assert run(pool, code, STDIN_TASK).status == "wrong_answer"
    assert_pool_healthy(pool)


# ------------------------------------------------------------------------------------------
# class 2: what children inherit (file descriptors, the worker's heap, scratch space)
# ------------------------------------------------------------------------------------------


FORGE_REPLY = """
import json, os, stat, struct
reply = {"id": None, "setup_error": None, "output_tail": "", "wall_time": 0.0,
         "tests": [{"status": "done", "exit_code": 0, "stdout": "3", "time": 0.0}]}
data = json.dumps(reply).encode()
for fd in range(4, 64):
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.write(fd, struct.pack(">I", len(data)) + data)
    except OSError:
        pass
print(-1)
"""

PARTIAL_FRAME = """
import os, stat, struct
for fd in range(4, 64):
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.write(fd, struct.pack(">I", 1000) + b'{"id"')
    except OSError:
        pass
print(-1)
"""

FRESH_PROCESS = """
import json
from sandbox.executor import SandboxLimits, SandboxPool, execute_program
from utils.dataset_loader import Task
task = Task(
    task_id="t/one", source="t", problem="p", test_type="stdin", tests=({{"input": "1 2\\n", "output": "3\\n"}},)
)
with SandboxPool(workers=1, limits=SandboxLimits(test_timeout=1.0)) as pool:
    first = execute_program({code!r}, task, pool=pool)
    after = execute_program("a, b = map(int, input().split())\\nprint(a + b)", task, pool=pool)
print(json.dumps([first.status, after.status]))
"""


def _in_fresh_process(code: str) -> list[str]:
    # a fresh interpreter: the parent's pipes to the worker get the low fd numbers that the old
    # worker let its children inherit (what a real pipeline run looks like, unlike pytest's)
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT

    script = FRESH_PROCESS.format(code=textwrap.dedent(code))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_c2_forged_reply_on_an_inherited_worker_pipe():
    first, after = _in_fresh_process(FORGE_REPLY)
    assert first == "wrong_answer" and after == "passed"  # and no later verdict on this worker shifted


def test_c2_partial_frame_on_an_inherited_worker_pipe():
    first, after = _in_fresh_process(PARTIAL_FRAME)  # the old parent waited forever for the rest
    assert first == "wrong_answer" and after == "passed"


HEAP_SEARCH = """
import gc, re
needle = 'SIBLING' + '-SECRET-'
found = ''
def look(text):
    global found
    i = text.find(needle)
    if i >= 0 and not found:
        found = re.match(r'[A-Z0-9-]+', text[i:]).group(0)
for obj in gc.get_objects():
    for ref in gc.get_referents(obj) + [obj]:
        if isinstance(ref, str) and needle in ref:
            look(ref)
if not found:
    try:
        with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb') as mem:
            for line in maps:
                addr, perms = line.split()[:2]
                if 'rw' not in perms:
                    continue
                lo, hi = (int(x, 16) for x in addr.split('-'))
                if hi - lo > 1 << 28:
                    continue
                try:
                    mem.seek(lo)
                    blob = mem.read(hi - lo)
                except OSError:
                    continue
                i = blob.find(needle.encode())
                if i >= 0:
                    look(blob[i:i + 80].decode('ascii', 'replace'))
                    break
    except OSError:
        pass
"""


def test_c2_sibling_output_in_the_worker_heap(pool):
    secret = f"SIBLING-SECRET-{secrets.token_hex(6).upper()}"
    victim = f"print('{secret}')\n"
    run(pool, victim, STDIN_TASK)
    thief = HEAP_SEARCH + "print(found)\n"
    task = stdin_task("t/heap", ("", secret))
    result = run(pool, thief, task)
    assert result.status == "wrong_answer", result


def test_c2_sibling_code_in_the_worker_heap(pool):
    secret = f"SIBLING-SECRET-{secrets.token_hex(6).upper()}"
    victim = f"def add(a, b):\n    return '{secret}'\n"
    run(pool, victim, CALL_TASK)
    thief = HEAP_SEARCH + "def add(a, b):\n    return found\n"
    task = call_task("t/heap2", "add", ([1, 2], secret))
    result = run(pool, thief, task)
    assert result.status == "wrong_answer", result


@pytest.mark.parametrize("folder", ["/tmp", "/dev/shm", "/var/tmp"])
def test_c2_scratch_space_is_fresh_for_every_program(pool, folder):
    marker = f"CKPT-{secrets.token_hex(6)}"
    writer = f"open('{folder}/ckpt.txt', 'w').write('{marker}')\nprint(0)\n"
    run(pool, writer, STDIN_TASK)
    reader = f"import os\np = '{folder}/ckpt.txt'\nprint(open(p).read() if os.path.exists(p) else 'none')\n"
    task = stdin_task("t/ckpt", ("", marker))
    assert run(pool, reader, task).status == "wrong_answer"


# ------------------------------------------------------------------------------------------
# class 3: timing believed from the program
# ------------------------------------------------------------------------------------------


SLOW_TASK = assert_task("t/slow", "add", "assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(0, 5) == 5")


# A test is charged its CPU time where the host has a CPU cgroup (wall clock only as a backstop), so the
# "work" these programs spread across tests is CPU work: sleeping is no work and costs no test time.
SPIN = """
def spin(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
"""


def test_c3_background_thread_pools_time_across_tests(pool):
    # the third test needs 2.2 s of work, started at import time and spread over the first two tests
    code = """
    import threading, time
    answers = {}
    def work():
        spin(2.2)
        answers[(0, 5)] = 5
    threading.Thread(target=work, daemon=True).start()
    def add(a, b):
        if (a, b) == (0, 5):
            while (a, b) not in answers:
                time.sleep(0.01)
            return answers[(a, b)]
        spin(0.9)
        return a + b
    """.replace("import threading, time", "import threading, time" + SPIN.replace("\n", "\n    "))
    result = run(pool, code, SLOW_TASK)
    assert result.test_outcomes[2].status == "timeout", result


def test_c3_forged_progress_messages_reset_the_test_clock(pool):
    # a thread reports each test as finished just before its deadline; the real work takes 2.7 s
    code = """
    import json, os, struct, threading, time
    def send(msg):
        data = json.dumps(msg).encode()
        os.write(3, struct.pack('>I', len(data)) + data)
    def forger():
        for i, v in enumerate((3, 4, 5)):
            spin(0.9)
            send({'k': 'val', 'i': i, 'v': v})
        spin(0.2)
        os._exit(0)
    threading.Thread(target=forger).start()
    def add(a, b):
        spin(10)
        return a + b
    """.replace(
        "import json, os, struct, threading, time",
        "import json, os, struct, threading, time" + SPIN.replace("\n", "\n    "),
    )
    result = run(pool, code, SLOW_TASK)
    assert not result.passed and result.status == "timeout", result


def test_c3_stdin_thread_carries_work_into_later_tests(pool):
    # stdin tests: a thread started by the first test keeps computing while later tests run
    code = """
    import builtins, sys, threading, time
    if not hasattr(builtins, 'bank'):
        builtins.bank = {}
        def work():
            spin(2.2)
            builtins.bank['0 5'] = 5
        threading.Thread(target=work, daemon=True).start()
    line = sys.stdin.readline().strip()
    if line == '0 5':
        while line not in builtins.bank:
            time.sleep(0.01)
        print(builtins.bank[line])
    else:
        spin(0.9)
        a, b = map(int, line.split())
        print(a + b)
    """.replace(
        "import builtins, sys, threading, time", "import builtins, sys, threading, time" + SPIN.replace("\n", "\n    ")
    )
    result = run(pool, code, STDIN_TASK)
    assert result.test_outcomes[2].status == "timeout", result


# ------------------------------------------------------------------------------------------
# class 4: the trusted parent believing the worker's replies
# ------------------------------------------------------------------------------------------


def _forge_val(value_source: str) -> str:
    return f"""
    import json, os, struct
    def add(a, b):
        data = json.dumps({{'k': 'val', 'i': 0, 'v': {value_source}}}).encode()
        for i in range(3):
            data = json.dumps({{'k': 'val', 'i': i, 'v': {value_source}}}).encode()
            os.write(3, struct.pack('>I', len(data)) + data)
        os._exit(0)
    """


def test_c4_set_holding_a_hashable_dict_subclass(pool):
    code = """
    class HashDict(dict):
        def __hash__(self):
            return 1
    def add(a, b):
        return {HashDict(x=1)}
    """
    result = run(pool, code, CALL_TASK)
    assert result.status == "wrong_answer", result
    assert_pool_healthy(pool)


def test_c4_malformed_tag(pool):
    result = run(pool, _forge_val("{'__t': 'tuple', 'v': 5}"), ASSERT_TASK)
    assert not result.passed and result.status != "sandbox_error", result
    result = run(pool, _forge_val("{'__t': 'dict', 'v': [[1]]}"), CALL_TASK)
    assert not result.passed and result.status != "sandbox_error", result
    assert_pool_healthy(pool)


def test_c4_deeply_nested_value(pool):
    # deep enough for the worker to forward, too deep for the parent's json decoder
    result = run(pool, _forge_val("eval('[' * 5000 + ']' * 5000)"), ASSERT_TASK)
    assert not result.passed and result.status != "sandbox_error", result
    assert_pool_healthy(pool)


def test_c4_one_bad_program_does_not_lose_the_batch(pool):
    code = (
        "class HashDict(dict):\n    def __hash__(self):\n        return 1\ndef add(a, b):\n    return {HashDict(x=1)}\n"
    )
    good, task = CONTROL["call"]
    with ThreadPoolExecutor(1) as executor:
        results = executor.submit(execute_many, [(good, task), (code, CALL_TASK), (good, task)], pool).result(
            timeout=60
        )
    assert [r.status for r in results] == ["passed", "wrong_answer", "passed"]


# ------------------------------------------------------------------------------------------
# class 5: programs choosing sandbox_error
# ------------------------------------------------------------------------------------------


def test_c5_exit_status_of_a_harness_failure(pool):
    result = run(pool, "import os\nos._exit(125)\n", ASSERT_TASK)
    assert result.status == "runtime_error", result
    result = run(pool, "import os\nos._exit(125)\n", STDIN_TASK)
    assert result.status == "runtime_error", result


def test_c5_real_time_signal(pool):
    code = "import os, signal\nos.kill(os.getpid(), signal.SIGRTMIN + 3)\nimport time\ntime.sleep(5)\n"
    result = run(pool, code, STDIN_TASK)
    assert result.status in ("runtime_error", "timeout"), result


@pytest.mark.slow
def test_c5_too_deep_result_frame(pool):
    code = """
    import os, struct
    def add(a, b):
        data = b'{"k": "val", "i": 0, "v": ' + b'[' * 200000 + b']' * 200000 + b'}'
        os.write(3, struct.pack('>I', len(data)) + data)
        import time
        time.sleep(30)
    """
    result = run(pool, code, ASSERT_TASK)
    assert result.status != "sandbox_error" and not result.passed, result
    assert_pool_healthy(pool)


def test_c5_huge_values_are_an_output_limit(pool):
    many = call_task("t/many", "add", *[([i, 1], i + 1) for i in range(40)])
    code = "def add(a, b):\n    return 'x' * (15 << 20)\n"
    result = run(pool, code, many, limit_s=120)
    assert result.status == "output_limit", result
    assert_pool_healthy(pool)


# ------------------------------------------------------------------------------------------
# class 6: host resources (IPC, host folders and sockets, memory of the whole process tree)
# ------------------------------------------------------------------------------------------


@needs_root
def test_c6_system_v_shared_memory_does_not_reach_the_host(pool):
    code = """
    import ctypes
    libc = ctypes.CDLL(None)
    for key in (0x7e57, 0x7e58):
        libc.shmget(key, 4096, 0o1666)
        libc.semget(key, 1, 0o1666)
        libc.msgget(key, 0o1666)
    print(0)
    """
    run(pool, code, STDIN_TASK)  # `run` checks /proc/sysvipc
    code2 = "import ctypes\nprint(ctypes.CDLL(None).shmget(0x7e57, 4096, 0o666))\n"
    task = stdin_task("t/ipc", ("", "-1"))
    assert run(pool, code2, task).passed  # not even another program of the same worker sees it


@needs_root
def test_c6_world_writable_host_folder(pool):
    target = Path("/run/lock") / f"tgrpo-evil-{secrets.token_hex(4)}"
    if not target.parent.is_dir():
        pytest.skip("no /run/lock here")
    code = f"open('{target}', 'w').write('x')\nprint(0)\n"
    run(pool, code, STDIN_TASK)
    assert not target.exists()
    target.unlink(missing_ok=True)


@needs_root
def test_c6_host_unix_socket(pool):
    path = Path("/run/lock") / f"tgrpo-sock-{secrets.token_hex(4)}"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    os.chmod(path, 0o777)
    server.listen(1)
    server.settimeout(5)
    received = []

    def serve():
        try:
            conn, _ = server.accept()
            received.append(conn.recv(10))
            conn.sendall(b"pong")
            conn.close()
        except OSError:
            pass

    thread = threading.Thread(target=serve)
    thread.start()
    code = (
        f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('{path}')\n"
        "s.sendall(b'stolen')\nprint(s.recv(10).decode())\n"
    )
    task = stdin_task("t/sock", ("", "pong"))
    result = run(pool, code, task)
    server.close()
    thread.join()
    path.unlink(missing_ok=True)
    assert received == [] and not result.passed


@needs_root
def test_c6_memory_of_forked_children_counts_together(pool):
    # four processes of 200 MB each: each is under the 256 MB limit, together far over it
    code = """
    import ctypes, os, time
    libc = ctypes.CDLL(None)
    r, w = os.pipe()
    kids = []
    for _ in range(4):
        pid = libc.fork()
        if pid == 0:
            block = bytearray(200 << 20)
            for i in range(0, len(block), 4096):
                block[i] = 1
            os.write(w, b'k')
            time.sleep(3)
            libc._exit(0)
        kids.append(pid)
    got = b''
    while len(got) < 4:
        got += os.read(r, 4)
    print(7)
    """
    task = stdin_task("t/mem", ("", "7"))
    result = run(pool, code, task, limit_s=60)
    assert not result.passed, result


@needs_root
def test_c6_memfds_count_against_the_memory_limit(pool):
    # memfds are not mapped, so the address-space limit does not see them
    code = """
    import os
    fds = []
    for _ in range(150):
        fd = os.memfd_create('x')
        os.write(fd, b'y' * (3 << 20))
        fds.append(fd)
    print(7)
    """
    task = stdin_task("t/memfd", ("", "7"))
    result = run(pool, code, task, limit_s=60)
    assert not result.passed, result


# ------------------------------------------------------------------------------------------
# class 7: lenient verdicts
# ------------------------------------------------------------------------------------------


def test_c7_integers_compare_exactly():
    assert not stdout_matches("1000000000", "1000000007")
    assert not stdout_matches("123456789012", "123456789013")
    assert stdout_matches("0.3333333", "0.333333333") and stdout_matches("1e3", "1000.0")


@pytest.mark.parametrize(
    "asserts",
    [
        ("assert add(1, 2) == 3 and add(2, 2) == 4", "assert add(0, 5) == 5 and True"),
        ("assert (add(1, 2) == 3) is True", "assert (add(0, 5) == 5) == True"),
        ("assert not (add(1, 2) != 3)", "assert add(1, 2) == 3 or add(2, 2) == 4"),
    ],
)
def test_c7_compound_asserts_are_judged_in_the_parent(pool, asserts):
    task = assert_task("t/compound", "add", *asserts)
    result = run(pool, ALWAYS_EQ, task)
    assert result.tests_passed == 0, result
    honest = run(pool, "def add(a, b):\n    return a + b\n", task)
    assert honest.passed, honest
    for source in asserts:
        assert plan_assert(source).trusted


def test_c7_trainer_pool_hides_the_task_files(tmp_path, monkeypatch):
    # the pool a training run builds must hide what phase 4's hides: the run's task files
    import torch

    from tests.trainer_helpers import ScriptedRollout, small_tasks, teacher_examples, tiny_config
    from training import setup
    from utils.student_model import attach_lora, load_student

    created = {}

    class RecordingPool:
        size, isolation = 1, "recorded"

        @classmethod
        def from_config(cls, section, **kwargs):  # how a run builds its pool
            created.update(kwargs)
            return cls()

        def close(self):
            pass

    monkeypatch.setattr(setup, "SandboxPool", RecordingPool)
    config = tiny_config(tmp_path / "out")
    torch.manual_seed(0)
    model, tokenizer = load_student(config.student.model_name, "float32", device="cpu")
    model = attach_lora(model, config.lora.r, config.lora.lora_alpha, 0.0, config.lora.target_modules)
    tasks = small_tasks()
    rollout = ScriptedRollout(tokenizer, {t.problem: t for t in tasks})
    setup.build_run(
        config,
        tasks=tasks,
        teacher_examples=teacher_examples(tasks),
        output_dir=tmp_path / "out",
        model=model,
        tokenizer=tokenizer,
        rollout=rollout,
    )
    hidden = {str(p) for p in created.get("secret_paths", ())}
    assert {str(config.paths.train_file), str(config.paths.val_file), str(config.paths.data_dir)} <= hidden


@needs_root
def test_c5_nothing_outlives_pool_close():
    # the program clears its parent-death signal and detaches a sleeper; the pool is closed mid-run
    code = """
    import ctypes, time
    libc = ctypes.CDLL(None)
    libc.prctl(1, 0, 0, 0, 0)
    if libc.fork() == 0:
        libc.prctl(1, 0, 0, 0, 0)
        libc.setsid()
        time.sleep(60)
    time.sleep(60)
    """
    pool = SandboxPool(workers=1, limits=SandboxLimits(test_timeout=30.0))
    uid = pool._all[0].info["uid"]
    cgroup = pool._all[0].info.get("memory_cgroup")
    thread = threading.Thread(target=lambda: execute_program(textwrap.dedent(code), STDIN_TASK, pool=pool))
    thread.start()
    time.sleep(1.0)
    pool.close()
    time.sleep(0.2)
    assert not _processes_of_uid(uid), "a program outlived pool.close()"
    assert not cgroup or not os.path.exists(cgroup), "the worker's cgroup was left behind"
    thread.join(timeout=60)


def test_programs_run_when_the_python_environment_lives_below_tmp(tmp_path):
    """A checkout cloned into /tmp with its .venv (as CI may do): each program's fresh /tmp tmpfs must
    not hide the interpreter's folders. The old code re-bound them from fds opened in the zygote's
    mount namespace, which the kernel refuses (EINVAL): every program became a sandbox_error."""
    assert str(tmp_path).startswith("/tmp/")
    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    script = (
        "from sandbox.executor import execute_program\n"
        "from utils.dataset_loader import Task\n"
        "task = Task(task_id='t/1', source='mbpp', problem='p', test_type='assert',\n"
        "            tests=('assert add(1, 2) == 3',), fn_name='add')\n"
        "print(execute_program('def add(a, b):\\n    return a + b\\n', task).status)\n"
    )
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-c", script],
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "passed", proc.stderr[-2000:]
