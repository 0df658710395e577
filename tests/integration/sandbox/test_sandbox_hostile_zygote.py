"""Hostile programs against the zygote design: namespaces, spares, the memory cgroup, the value codec,
the judge's reference leaves and the multi-turn environment.

Each group names its class; a program that found a weakness on c225caf says so in its docstring and
was fixed at the root (docs/sandbox.md, class table). The other programs held and stay as regression
tests. Helpers (`run`, `assert_pool_healthy`) check what the earlier batteries check after every
program: no process or IPC object of it is left, and the pool keeps working.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sandbox.executor import (
    SandboxIsolationWarning,
    SandboxLimits,
    SandboxPool,
    execute_many,
    execute_program,
    plan_tests,
    untrusted_task_ids,
)
from tests.conftest import SHARED_DATA
from tests.integration.sandbox.test_sandbox_hostile_cheating import ASSERT_TASK
from tests.integration.sandbox.test_sandbox_hostile_isolation import LIMITS, assert_pool_healthy, needs_root, run
from tests.task_factory import assert_task, call_task, stdin_task
from utils.dataset_loader import load_apps, load_mbpp


@pytest.fixture()
def pool():
    # one pool per test: an attack that breaks a worker must not decide the next test's outcome
    with SandboxPool(workers=1, limits=LIMITS) as p:
        yield p


# ------------------------------------------------------------------------------------------
# item 2 / class 5: output inflation must be output_limit, never sandbox_error
# ------------------------------------------------------------------------------------------


def assert_nothing_carried(pool, planter: str, prober: str, name: str) -> None:
    """`planter` leaves the answer (7) wherever it can; `prober`, the next program on the same pool, prints
    what it finds there or "none": it must find nothing and must not pass."""
    task = stdin_task(name, ("1\n", "7\n"))
    run(pool, planter, task)
    result = run(pool, prober, task)
    assert not result.passed and "none" in (result.error or ""), result


def test_inflated_stdout_is_an_output_limit_not_a_sandbox_error(pool):
    """Found on c225caf: stdout bytes that are not UTF-8 decode to U+FFFD, which the reply's JSON
    writes as 6 bytes each; 70 tests x 1 MiB of 0xff passed the raw-byte budget and made a 420 MB
    reply, over the pool's message limit: sandbox_error (no signal) on demand."""
    task = stdin_task("t/inflate", *[("1\n", "2\n") for _ in range(70)])
    code = "import sys\nsys.stdout.buffer.write(b'\\xff' * (1 << 20))\n"
    result = run(pool, code, task, limit_s=120)
    statuses = {o.status for o in result.test_outcomes}
    assert result.status != "sandbox_error" and "sandbox_error" not in statuses, result.error
    assert "output_limit" in statuses and not result.passed
    assert_pool_healthy(pool)


def test_shared_reference_bomb_is_an_output_limit(pool):
    """Found on c225caf: a value of 2**40 leaves built from 40 shared lists encodes without bound in
    the child (encoding time and memory, a timeout); the encoder now stops at the output limit."""
    code = "def add(a, b):\n    x = [0]\n    for _ in range(40):\n        x = [x, x]\n    return x\n"
    task = call_task("t/bomb", "add", ([1, 2], 3))
    result = run(pool, code, task)
    assert result.status == "output_limit", result


def test_control_characters_count_at_their_encoded_size(pool):
    """Found on c225caf: 512 Ki NUL characters are 3 MiB once escaped in JSON, three times the
    output limit (1 MiB here), yet came back as a value; a value is bounded by its encoded size."""
    code = "def add(a, b):\n    return '\\x00' * (1 << 19)\n"
    result = run(pool, code, call_task("t/nul", "add", ([1, 2], 3)))
    assert result.status == "output_limit", result


def test_a_correct_huge_int_passes(pool):
    """Found on c225caf (type confusion in the codec, a false fail): an int over Python's 4300-digit
    string limit could not be encoded, so a correct program got runtime_error."""
    big = 7**6000
    code = "def power(b, e):\n    return b ** e\n"
    result = run(pool, code, call_task("t/bigint", "power", ([7, 6000], big)))
    assert result.passed, result
    wrong = run(pool, code.replace("b ** e", "b ** e + 1"), call_task("t/bigint", "power", ([7, 6000], big)))
    assert wrong.status == "wrong_answer", wrong


# ------------------------------------------------------------------------------------------
# item 1 / class 7: no verdict from inside the program's process
# ------------------------------------------------------------------------------------------

SIZE_TASK = assert_task(  # the shape of MBPP 596: both sides of the comparison are computed
    "t/size",
    "tuple_size",
    'assert tuple_size(("A", 1, "B", 2)) == sys.getsizeof(("A", 1, "B", 2))',
    "assert tuple_size((1, 2, 3)) == sys.getsizeof((1, 2, 3))",
)


def test_patched_reference_function_is_no_false_pass(pool):
    """Found on c225caf (the round-2 false pass): `f(x) == sys.getsizeof(x)` ran whole in the
    program's process, so a program that replaced sys.getsizeof passed without solving the task.
    The reference side is now computed in a fresh process that never ran the program."""
    code = "import sys\nsys.getsizeof = lambda x: 7\ndef tuple_size(t):\n    return 7\n"
    result = run(pool, code, SIZE_TASK)
    assert result.status == "wrong_answer" and result.tests_passed == 0, result


def test_patched_builtin_under_a_reference_leaf_is_no_false_pass(pool):
    """Found on c225caf: the same through a builtin the program patches for the test's own use."""
    task = assert_task("t/rng", "count", "assert count(5) == len(list(range(5)))")
    code = "import builtins\nbuiltins.range = lambda n: [0]\ndef count(n):\n    return 1\n"
    result = run(pool, code, task)
    assert result.status == "wrong_answer", result
    assert run(pool, "def count(n):\n    return n\n", task).passed  # the reference side is range(5) itself


def test_reference_side_passes_a_correct_program(pool):
    code = "import sys\ndef tuple_size(t):\n    return sys.getsizeof(t)\n"
    result = run(pool, code, SIZE_TASK)
    assert result.passed and result.untrusted_tests == 0, result


def test_a_test_judged_inside_the_program_gives_no_reward(pool):
    """An assert this process cannot split (a comparison inside a generator) still runs in the child;
    its verdict is marked, and the training rewards give such a result no signal (None)."""
    from training.rewards import binary_correctness, fraction_correctness
    from utils.thinking_extraction import extract_thinking_and_code_unified

    task = assert_task("t/gen", "double", "assert all(double(x) == 2 * x for x in range(3))")
    code = "import builtins\nbuiltins.all = lambda it: True\ndef double(x):\n    return 0\n"
    result = run(pool, code, task)
    assert result.untrusted_tests == 1, result
    parsed = [extract_thinking_and_code_unified("```python\n" + code + "```")]
    assert binary_correctness([result], parsed) == [None]
    assert fraction_correctness([result], parsed) == [None]


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/data not present")
def test_real_mbpp_and_apps_have_no_test_judged_inside_the_program():
    # measured on c225caf: MBPP 596's 3 asserts (sys.getsizeof) ran whole in the child;
    # now every one of MBPP's 2938 asserts (challenge tests included) is judged outside it, and only
    # 596 needs the program-free reference run. APPS has no asserts (153 stdin/call tasks).
    mbpp = load_mbpp(SHARED_DATA / "mbpp.jsonl")[0]
    apps = load_apps(SHARED_DATA / "apps_sample.jsonl")[0]
    plans = [plan_tests(t, include_challenge=True) for t in mbpp]
    assert sum(p.total for p in plans) == 2938 and untrusted_task_ids(mbpp, include_challenge=True) == []
    assert [t.task_id for t, p in zip(mbpp, plans, strict=True) if p.reference_job] == ["mbpp/596"]
    assert untrusted_task_ids(apps) == [] and all(plan_tests(t).reference_job is None for t in apps)


# ------------------------------------------------------------------------------------------
# class 2: state surviving between programs through anything still shared
# ------------------------------------------------------------------------------------------

KEYRING_WRITE = """
import ctypes, platform
libc = ctypes.CDLL(None, use_errno=True)
ADD_KEY = {"x86_64": 248, "aarch64": 217}[platform.machine()]
for ring in (-4, -5, -3):  # user, user-session, session keyrings
    libc.syscall(ADD_KEY, b"user", b"tgrpo-round3", b"7", 1, ring)
print(0)
"""
KEYRING_READ = """
import ctypes, platform
libc = ctypes.CDLL(None, use_errno=True)
REQUEST_KEY, KEYCTL = {"x86_64": (249, 250), "aarch64": (218, 219)}[platform.machine()]
found = b"none"
key = libc.syscall(REQUEST_KEY, b"user", b"tgrpo-round3", None, 0)
if key > 0:
    buf = ctypes.create_string_buffer(16)
    n = libc.syscall(KEYCTL, 11, key, buf, 16)  # KEYCTL_READ
    found = buf.raw[: max(n, 0)]
print(found.decode())
"""


def test_kernel_keyring_carries_nothing_between_programs(pool):
    """Found on c225caf: the kernel's per-uid user keyring is shared by every program of a worker (one
    uid) and outlives them, and no namespace of the sandbox covers it: a program stored an answer
    there and the next program read it back and passed. Programs now cannot reach the keyring
    system calls at all (a seccomp filter set before the program runs)."""
    assert_nothing_carried(pool, KEYRING_WRITE, KEYRING_READ, "t/keyring")


# ------------------------------------------------------------------------------------------
# class 8: the documented fallback when namespaces are unavailable
# ------------------------------------------------------------------------------------------


def test_basic_isolation_is_loud():
    """Found on c225caf: a pool that fell back to basic isolation (no namespaces: not root, or a
    container that refuses them) said so only in `pool.isolation` and the preflight; the trainer and
    phase 4 ran untrusted code with weaker isolation without a word. The pool now warns, with the
    reason, whenever it runs programs without the namespaces or without the memory cgroup."""
    with (
        pytest.warns(SandboxIsolationWarning, match="basic"),
        SandboxPool(workers=1, limits=LIMITS, isolate=False) as basic,
    ):
        assert basic.isolation == "basic"
        # and basic mode keeps the keyrings shut too (its uid is the user's own: their keys)
        task = stdin_task("t/keyring", ("1\n", "7\n"))
        execute_program(KEYRING_WRITE, task, limits=LIMITS, pool=basic)
        result = execute_program(KEYRING_READ, task, limits=LIMITS, pool=basic)
        assert not result.passed and "none" in (result.error or ""), result


ABSTRACT_SOCKET_SERVER = """
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind("\\0tgrpo-round3")
server.listen(8)
if libc.fork() == 0:  # a background server, as the program's own process
    libc.setsid()
    while True:
        conn, _ = server.accept()
        conn.sendall(b"7")
        conn.close()
print(0)
"""
ABSTRACT_SOCKET_CLIENT = """
import socket
try:
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect("\\0tgrpo-round3")
    print(c.recv(8).decode())
except OSError as exc:
    print("none", exc)
"""


@needs_root  # basic mode has no namespaces or sandbox uid (docs/sandbox.md, rows 2 and 6)
def test_abstract_socket_server_does_not_outlive_its_program(pool):
    # held on c225caf: abstract unix sockets live in the worker's network namespace, which every
    # program of the worker shares, but the server dies with its program's PID namespace
    assert_nothing_carried(pool, ABSTRACT_SOCKET_SERVER, ABSTRACT_SOCKET_CLIENT, "t/abstract")


POSIX_MQ = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
try:
    libc.mq_open
except AttributeError:
    libc = ctypes.CDLL("librt.so.1", use_errno=True)
libc.mq_open.restype = ctypes.c_int
q = libc.mq_open(b"/tgrpo-round3", os.O_CREAT | os.O_RDWR | os.O_NONBLOCK, 0o666, None)
buf = ctypes.create_string_buffer(8192)
n = libc.mq_receive(q, buf, 8192, None) if q >= 0 else -1
if n > 0:
    print(buf.raw[:n].decode())
else:
    libc.mq_send(q, b"7", 1, 0)
    print("none")
"""


@needs_root  # basic mode has no namespaces or sandbox uid (docs/sandbox.md, rows 2 and 6)
def test_posix_message_queue_carries_nothing_between_programs(pool):
    # held on c225caf: POSIX message queues belong to the IPC namespace, fresh for every program
    assert_nothing_carried(pool, POSIX_MQ, POSIX_MQ, "t/mq")


@needs_root  # basic mode has no namespaces or sandbox uid (docs/sandbox.md, rows 2 and 6)
def test_reference_run_after_a_hostile_program_is_not_poisoned(pool):
    # found on c225caf (item 1's false pass, here with state left behind too); now: the program runs
    # before its task's reference job, on the same worker, and whatever it leaves (files in its scratch
    # space, patched modules) is gone or unreachable when the reference side is computed
    code = """
    import sys, ctypes
    for path in ("/tmp/sitecustomize.py", "/dev/shm/sitecustomize.py", "/var/tmp/sitecustomize.py"):
        try:
            open(path, "w").write("import sys; sys.getsizeof = lambda x: 7\\n")
        except OSError:
            pass
    sys.getsizeof = lambda x: 7
    def tuple_size(t):
        return 7
    """
    result = run(pool, code, SIZE_TASK)
    assert result.tests_passed == 0, result


# ------------------------------------------------------------------------------------------
# class 3: racing the supervisor's clocks and its reading of reports
# ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_program_in_a_c_call_past_the_deadline_times_out(pool):
    # held: a C call ignores Python's signal handling; the supervisor's deadline kills it regardless
    # (a SIGSTOP to itself was tried too: as PID 1 of its namespace the kernel ignores it)
    code = "import ctypes\ndef add(a, b):\n    ctypes.CDLL(None).sleep(30)\n    return a + b\n"
    result = run(pool, code, ASSERT_TASK)
    assert result.status == "timeout", result
    assert_pool_healthy(pool)


def test_late_forged_frames_do_not_replace_reports(pool):
    # held: after each test reported its wrong value, a thread forges the right ones; first report wins
    code = """
    import json, os, struct, threading, time
    def forge():
        time.sleep(0.1)
        for i, v in enumerate((3, 4, 5)):
            data = json.dumps({"k": "val", "i": i, "v": v}).encode()
            os.write(3, struct.pack(">I", len(data)) + data)
    def add(a, b):
        if a == 0:
            threading.Thread(target=forge).start()
        return -1
    """
    result = run(pool, code, ASSERT_TASK)
    assert result.tests_passed == 0 and result.status == "wrong_answer", result


def test_alarm_storm_interrupting_the_harness_send(pool):
    # held: a signal handler that raises fires every 10 microseconds, inside the harness's own sends;
    # torn frames and an early exit are the program's failure, never sandbox_error
    code = """
    import signal
    def boom(*args):
        raise KeyboardInterrupt
    signal.signal(signal.SIGALRM, boom)
    signal.setitimer(signal.ITIMER_REAL, 0.00001, 0.00001)
    def add(a, b):
        return "x" * 200000
    """
    result = run(pool, code, ASSERT_TASK)
    assert not result.passed and result.status != "sandbox_error", result
    assert_pool_healthy(pool)


# ------------------------------------------------------------------------------------------
# class 4: type confusion in the value codec, and the judging process's own resources
# ------------------------------------------------------------------------------------------


def test_range_is_not_a_list(pool):
    """Found on c225caf (a false fail): a range came back opaque, so a correct program failed a
    compound assert on it. A range now travels as a range (equal to a range, never to a list, as in
    Python), and only a short one is rebuilt in the judging process."""
    task = assert_task("t/range", "span", "assert span(3) == [0, 1, 2]", "assert list(span(3)) == [0, 1, 2]")
    result = run(pool, "def span(n):\n    return range(n)\n", task)
    assert [o.passed for o in result.test_outcomes] == [False, True], result
    # a compound assert: the range comes back as a value and list() runs in the judging process
    huge = assert_task("t/range2", "span", "assert len(span(3)) == 3 and list(span(3)) == [0, 1, 2]")
    assert run(pool, "def span(n):\n    return range(n)\n", huge).passed
    assert run(pool, "def span(n):\n    return range(10 ** 12)\n", huge).status == "wrong_answer"


def test_huge_ints_buy_no_quadratic_time_in_the_judge(pool):
    """Guards this round's codec (on c225caf such ints could not travel at all: runtime_error): ints
    now travel at any size (as hex), so a tree assert's arithmetic on two multi-million-bit ints would
    cost the judging process minutes; it refuses such operands."""
    big = SandboxPool(workers=1, limits=SandboxLimits(test_timeout=2.0, output_bytes=4 << 20))
    # a compound assert: its leaves come back as values and `//` runs in the judging process
    task = assert_task("t/div", "f", "assert f(1) // f(2) == 1 and f(0) == 0")
    code = "def f(n):\n    return n and ((1 << 10_000_000) - 1 if n == 1 else (1 << 5_000_000) - 3)\n"
    with big:
        result = execute_program(code, task, limits=big.limits, pool=big)
    assert result.status == "wrong_answer", result


@pytest.mark.slow
def test_many_small_nodes_are_an_output_limit(pool):
    """Found on c225caf: 40 values of 250,000 empty lists each (1 MB of JSON apiece, within the byte
    budget) became 10 million lists in the judging process, twice (reply and decoded value). A reply
    now carries at most a million JSON nodes; past that a test is the program's output_limit. Six such values
    (1.5 million nodes) pass that budget at the fourth, as forty did."""
    many = call_task("t/nodes", "add", *[([i, 1], i + 1) for i in range(6)])
    result = run(pool, "def add(a, b):\n    return [[]] * 250_000\n", many, limit_s=120)
    assert "output_limit" in {o.status for o in result.test_outcomes}, result.status
    assert result.status != "sandbox_error"


def test_huge_exception_type_name(pool):
    # held: an exception class named with 2 Mi characters (12 MB escaped) overflows the result channel
    code = "class E(Exception):\n    pass\nE.__name__ = 'é' * (1 << 21)\nraise E('x')\n"
    result = run(pool, code, ASSERT_TASK)
    assert result.status in ("output_limit", "runtime_error"), result
    assert_pool_healthy(pool)


@pytest.mark.slow
def test_flood_of_empty_frames(pool):
    # held: a million empty frames on the result channel: garbage, then the channel's byte limit
    code = "import os\nos.write(3, b'\\x00' * (4 << 20))\ndef add(a, b):\n    return a + b + 1\n"
    result = run(pool, code, ASSERT_TASK)
    assert not result.passed and result.status != "sandbox_error", result
    assert_pool_healthy(pool)


# ------------------------------------------------------------------------------------------
# class 7: reading a task's hidden tests
# ------------------------------------------------------------------------------------------

MEMORY_SEARCH = """
import gc
def add(a, b):
    target = str(int("918273644") + 1)  # not a constant of this code
    for obj in gc.get_objects():
        if isinstance(obj, (dict, list, tuple)):
            try:
                if any(v is target for v in (obj.values() if isinstance(obj, dict) else obj)):
                    continue
                if target in repr(obj)[:200000]:
                    return int(target)
            except Exception:
                pass
    return 0
"""


def test_the_expected_side_never_reaches_the_program(pool):
    """Found on c225caf: an assert whose expected side is computed (`math.floor(918273645.5)`) ran
    whole in the program's process, so the program found the expected value in the harness's job
    in its own memory and returned it. That side is now computed in the program-free process."""
    task = assert_task("t/hidden", "add", "assert add(1, 2) == math.floor(918273645.5)", test_imports=("import math",))
    result = run(pool, MEMORY_SEARCH, task)
    assert result.status == "wrong_answer", result


def test_a_literal_expected_value_never_reaches_the_program(pool):
    # held on c225caf: a literal expected value stays in the judging process
    task = assert_task("t/hidden2", "add", "assert add(1, 2) == 918273645")
    assert run(pool, MEMORY_SEARCH, task).status == "wrong_answer"


# ------------------------------------------------------------------------------------------
# class 6: host resources, neighbours and the shared installation
# ------------------------------------------------------------------------------------------


@needs_root
def test_python_installation_is_read_only(pool):
    # held: a program that could write a .pyc or sitecustomize into the interpreter the workers (and
    # the judging process) import from would run code outside the sandbox
    import json as json_module
    import site

    targets = [Path(json_module.__file__).parent / "__pycache__" / "tgrpo_round3.pyc"]
    targets += [Path(p) / "sitecustomize_tgrpo_round3.py" for p in site.getsitepackages()]
    code = f"""
    for p in {[str(t) for t in targets]!r}:
        try:
            open(p, "w").write("x")
            print("wrote", p)
        except OSError:
            pass
    print("done")
    """
    try:
        result = run(pool, code, stdin_task("t/ro", ("1\n", "done\n")))
        assert result.passed, result  # nothing was written
        assert not any(t.exists() for t in targets)
    finally:
        for t in targets:
            t.unlink(missing_ok=True)


@needs_root
def test_program_cannot_raise_its_own_memory_limit(pool):
    # held: the cgroup file system is not in the program's root, and the uid could not write it anyway
    code = """
    import os
    for line in open("/proc/self/cgroup"):
        path = "/sys/fs/cgroup/" + line.strip().split(":", 2)[2].lstrip("/")
        for name in ("memory.max", "memory.limit_in_bytes"):
            try:
                open(os.path.join(path, name), "w").write("max")
            except OSError:
                pass
    block = bytearray(600 << 20)
    def add(a, b):
        return a + b
    """
    result = run(pool, code, ASSERT_TASK)
    assert result.status == "memory_limit", result


@needs_root  # basic mode has no namespaces or sandbox uid (docs/sandbox.md, rows 2 and 6)
def test_kill_everything_spares_the_neighbour():
    # held: kill(-1, SIGKILL) from a program reaches only its own PID namespace (and, as its uid,
    # nothing of another worker): the program running beside it on the other worker still passes
    killer = "import ctypes, signal\nctypes.CDLL(None).kill(-1, signal.SIGKILL)\ndef add(a, b):\n    return a + b + 1\n"
    slow = "import time\ndef add(a, b):\n    time.sleep(0.3)\n    return a + b\n"
    with SandboxPool(workers=2, limits=LIMITS) as two:
        results = execute_many([(slow, ASSERT_TASK), (killer, ASSERT_TASK)] * 2, two, LIMITS)
        assert [r.passed for r in results] == [True, False, True, False], results
        assert_pool_healthy(two)


def test_tool_call_leaves_nothing_for_the_graded_program(pool):
    """Found on c225caf (the keyring channel, through the multi-turn tool environment): a `<program>`
    tool call runs on the same pool as the graded answer, so it could store an answer in the uid's
    keyring for the graded program to read back and pass."""
    from environments.code_env import run_tool_program

    output, _ = run_tool_program(textwrap.dedent(KEYRING_WRITE), pool)
    assert "0" in output
    result = run(pool, KEYRING_READ, stdin_task("t/tool", ("1\n", "7\n")))
    assert not result.passed and "none" in (result.error or ""), result


def test_an_architecture_without_the_keyring_filter_runs_programs_and_says_so(monkeypatch):
    """The filter's system-call numbers exist for x86_64 and aarch64 only; on any
    other machine building it raised inside the harness, before the ready byte, so every program of every
    task was a sandbox_error. There the harness now runs programs without the filter and the pool's
    isolation warning names what is missing."""
    import platform

    from sandbox import isolation
    from sandbox.pool import isolation_shortfall

    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    isolation.deny_keyrings()  # no filter for this machine: nothing installed, nothing raised
    full = {"isolation": "namespaces", "memory_cgroup": True}
    assert isolation_shortfall(full, machine="x86_64") is None
    assert "keyring" in (isolation_shortfall(full, machine="riscv64") or "")
