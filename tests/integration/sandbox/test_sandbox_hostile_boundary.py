"""What crosses the trust boundary: text, reports, frames and source that reach the trusted side.

Each test runs a program (or feeds the judging side directly) and checks that what leaves the sandbox
is valid, bounded and the program's own verdict: valid UTF-8 text, strictly validated reports, frames
counted before they are parsed, no program compiled in the judging process, no socket name carried to
the next program, CPU time charged to the program that used it, and an expected side computed where
no program runs (with what a program can send into those program-free processes). Helpers (`run`,
`assert_pool_healthy`) check after every program that nothing of it is left and that the pool keeps
working.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from sandbox.executor import SandboxPool
from tests.integration.sandbox.test_sandbox_hostile_isolation import LIMITS, assert_pool_healthy, needs_root, run
from tests.integration.sandbox.test_sandbox_hostile_zygote import assert_nothing_carried
from tests.task_factory import assert_task, call_task, stdin_task


@pytest.fixture()
def pool():
    with SandboxPool(workers=1, limits=LIMITS) as p:
        yield p


def assert_valid_text(result) -> None:
    """Every string of a result is valid UTF-8 (what the sample writers and tokenizers need)."""
    json.dumps(result.to_dict(), ensure_ascii=False).encode("utf-8")


# ------------------------------------------------------------------------------------------
# valid Unicode out of the sandbox
# ------------------------------------------------------------------------------------------

SURROGATE_PROGRAMS = {
    "message": "def add(a, b):\n    raise ValueError('bad \\udc80 text')\n",
    "opaque_module_name": "class X:\n    pass\nX.__module__ = '\\udc80'\ndef add(a, b):\n    return [X()]\n",
    "setup_error": "raise ValueError('\\ud800')\ndef add(a, b):\n    return a + b\n",
    "opaque_type_name": "class X:\n    pass\nX.__qualname__ = 'X\\udfff'\ndef add(a, b):\n    return X()\n",
    "assertion": "def add(a, b):\n    assert False, '\\udc80'\n",
}


@pytest.mark.parametrize("name", sorted(SURROGATE_PROGRAMS))
def test_lone_surrogates_in_call_results_come_out_as_valid_text(pool, name):
    for task in (assert_task("t/s", "add", "assert add(1, 2) == 3"), call_task("t/s", "add", ([1, 2], 3))):
        result = run(pool, SURROGATE_PROGRAMS[name], task)
        assert not result.passed and result.status != "sandbox_error", result
        assert_valid_text(result)


def test_lone_surrogates_in_a_stdin_program_come_out_as_valid_text(pool):
    task = stdin_task("t/s", ("1\n", "1\n"))
    for code in ("raise ValueError('\\udc80')\n", "import sys\nsys.exit('\\udc80')\n"):
        result = run(pool, code, task)
        assert result.status == "runtime_error", result
        assert_valid_text(result)


def test_tool_output_is_valid_text(pool):
    from environments.code_env import run_tool_program

    output, ok = run_tool_program("print('a')\nraise ValueError('\\udc81')\n", pool)
    assert not ok
    output.encode("utf-8")
    assert output.startswith("a\n")
    assert_pool_healthy(pool)


# ------------------------------------------------------------------------------------------
# no sandbox_error on demand: every report is validated per job type
# ------------------------------------------------------------------------------------------

FORGE = (
    "import json, os, struct\n"
    "def forge(report):\n"
    "    body = json.dumps(report).encode()\n"
    "    os.write(3, struct.pack('>I', len(body)) + body)\n"
)
CALL_FORGERIES = [
    {"k": "done", "i": 0, "stdout": 5},  # a stdin report in a calls job, with a field the supervisor fills itself
    {"k": "done", "i": 0, "stdout": "3", "exit": 0},
    {"k": "err", "i": 0, "type": ["x"], "msg": {"a": 1}},
    {"k": "setup_err", "type": 1, "msg": None, "phase": ["test"]},
    {"k": "val", "i": 0},  # no value at all
]
STDIN_FORGERIES = [
    {"k": "done", "i": 0, "exit": "0", "error": [1]},
    {"k": "done", "i": 0, "exit": 0, "error": None, "stdout": 7},
    {"k": "val", "i": 0, "v": 3},  # a calls report in a stdin job
    {"k": "big", "i": 0},
]


@pytest.mark.parametrize("report", CALL_FORGERIES, ids=lambda r: json.dumps(r)[:40])
def test_malformed_call_reports_are_the_programs_failure(pool, report):
    code = FORGE + f"forge({report!r})\nos._exit(0)\ndef add(a, b):\n    return a + b\n"
    for task in (assert_task("t/f", "add", "assert add(1, 2) == 3"), call_task("t/f", "add", ([1, 2], 3))):
        result = run(pool, code, task)
        assert not result.passed and result.status == "runtime_error", result


@pytest.mark.parametrize("report", STDIN_FORGERIES, ids=lambda r: json.dumps(r)[:40])
def test_malformed_stdin_reports_are_the_programs_failure(pool, report):
    code = FORGE + f"forge({report!r})\nprint(3)\nos._exit(0)\n"
    result = run(pool, code, stdin_task("t/f", ("1\n", "3\n")))
    assert not result.passed and result.status == "runtime_error", result


# ------------------------------------------------------------------------------------------
# no untrusted code compiled in the trusted process
# ------------------------------------------------------------------------------------------


def _keyword_names(n: int) -> list[str]:
    import itertools
    import keyword
    import string

    first, rest = string.ascii_letters + "_", string.ascii_letters + string.digits + "_"
    names = (a + "".join(b) for size in (1, 2) for a in first for b in itertools.product(rest, repeat=size))
    return list(itertools.islice((name for name in names if not keyword.iskeyword(name)), n))


def test_the_judging_process_never_compiles_a_program(pool):
    """A 200 KB program of one call with 33,000 keyword arguments takes the compiler ~9 s (its
    duplicate-keyword check is quadratic), holding the interpreter lock: compiled in the judging
    process, it froze every other thread of the trainer. Only the program's own process compiles it."""
    import threading
    import time

    code = "f(" + ",".join(f"{name}=0" for name in _keyword_names(33_000)) + ")\n"
    assert len(code) < 200_000
    task = assert_task("t/kw", "f", "assert f() == 1")
    gaps, done = [0.0], threading.Event()

    def ticker() -> None:  # another thread of the judging process: how long is it kept from running?
        last = time.monotonic()
        while not done.is_set():
            time.sleep(0.01)
            now = time.monotonic()
            gaps[0], last = max(gaps[0], now - last), now

    thread = threading.Thread(target=ticker)
    thread.start()
    try:
        result = run(pool, code, task, limit_s=60)
    finally:
        done.set()
        thread.join()
    assert gaps[0] < 3.0, gaps  # ~9 s when the compile ran here (a busy machine adds scheduling gaps)
    assert result.status in ("timeout", "runtime_error"), result


@pytest.mark.parametrize(
    "code, task",
    [
        ("def add(a, b)\n    return a + b\n", assert_task("t/syn", "add", "assert add(1, 2) == 3")),
        ("def add(a, b)\n    return a + b\n", call_task("t/syn", "add", ([1, 2], 3))),
        ("print(int(input()) +)\n", stdin_task("t/syn", ("1\n", "2\n"))),
        ("x = 1\x00\n", stdin_task("t/syn", ("1\n", "2\n"))),
    ],
    ids=["assert", "call", "stdin", "null-byte"],
)
def test_syntax_errors_come_from_the_programs_own_process(pool, code, task):
    result = run(pool, code, task)
    assert result.status == "syntax_error" and result.error and "line" in result.error, result
    assert all(o.status == "runtime_error" for o in result.test_outcomes)


def test_top_level_return_is_still_wrapped_like_the_apps_harness(pool):
    code = "n = int(input())\nif n > 0:\n    print(n * 2)\n    return\nprint(0)\n"
    assert run(pool, code, stdin_task("t/ret", ("2\n", "4\n"), ("0\n", "0\n"))).passed


# ------------------------------------------------------------------------------------------
# no state between programs: each program has its own network namespace
# ------------------------------------------------------------------------------------------

SOCKET_PLANT = """
import array, socket
# a datagram socket bound to an abstract name that encodes the answer, kept alive past its program by
# a message on its own queue that carries its own fd (an in-flight reference the kernel frees late)
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(b"\\0tgrpo-carry-7")
s.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [s.fileno()]))], 0, b"\\0tgrpo-carry-7")
print(0)
"""
SOCKET_PROBE = """
import socket
found = "none"
for digit in range(10):
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(b"\\0tgrpo-carry-%d" % digit)
        found = str(digit)
    except OSError:
        pass
print(found)
"""


@needs_root
def test_abstract_socket_carries_nothing_to_the_next_program(pool):
    """An abstract unix socket that holds a reference to itself outlives its program; in a network
    namespace shared by a worker's programs its name carried the answer to the next program."""
    assert_nothing_carried(pool, SOCKET_PLANT, SOCKET_PROBE, "t/abstract")


@needs_root
def test_a_fresh_network_namespace_per_program_carries_nothing_either():
    with SandboxPool(workers=1, limits=LIMITS, network="per_program") as per_program:
        assert_nothing_carried(per_program, SOCKET_PLANT, SOCKET_PROBE, "t/abstract")


@needs_root
def test_programs_open_unix_sockets_only(pool):
    """Programs have no network; an inet socket could still bind a port or move the namespace's counters,
    state the next program could read. Only AF_UNIX sockets open (a seccomp filter)."""
    code = (
        "import socket\nout = []\n"
        "for family in (socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK):\n"
        "    try:\n        socket.socket(family, socket.SOCK_DGRAM)\n        out.append('open')\n"
        "    except OSError:\n        out.append('refused')\n"
        "a, b = socket.socketpair()\na.send(b'x')\nout.append(b.recv(1).decode())\nprint(*out)\n"
    )
    assert run(pool, code, stdin_task("t/inet", ("", "refused refused refused x"))).passed


@needs_root
def test_abstract_socket_carries_nothing_from_a_tool_call_to_the_graded_answer(pool):
    from environments.code_env import run_tool_program

    run_tool_program(textwrap.dedent(SOCKET_PLANT), pool)
    result = run(pool, SOCKET_PROBE, stdin_task("t/abstract", ("1\n", "7\n")))
    assert not result.passed and "none" in (result.error or ""), result


# ------------------------------------------------------------------------------------------
# CPU fairness: a program's busy children do not decide its neighbour's verdict
# ------------------------------------------------------------------------------------------

CPU_HOG = """
import ctypes, time
libc = ctypes.CDLL(None)
for _ in range(30):  # 30 busy children, each in its own session (the process limit is 32)
    if libc.fork() == 0:
        libc.setsid()
        while True:
            pass
time.sleep(30)
"""
HONEST = """
import time
start = time.process_time()
n = 0
while time.process_time() - start < 0.4:  # 0.4 s of CPU, well inside the 1 s limit
    n += 1
print(3)
"""


@pytest.mark.slow
@needs_root
def test_busy_children_do_not_time_out_the_neighbour():
    """30 busy children of one program made an honest program on the other worker time out (2 of 2
    runs): wall-clock limits turned a neighbour's load into a wrong verdict. Each worker is now a CPU
    cgroup of its own (equal weights), and a test's time is charged as its CPU time, wall clock only
    as the backstop."""
    import threading
    import time

    from sandbox.executor import execute_program

    honest_task = stdin_task("t/honest", ("1\n", "3\n"))
    with SandboxPool(workers=2, limits=LIMITS) as pool:
        hog = threading.Thread(
            target=execute_program,
            args=(textwrap.dedent(CPU_HOG), stdin_task("t/hog", *[("", "0")] * 8)),
            kwargs={"limits": LIMITS, "pool": pool},
        )
        hog.start()  # 8 tests: it runs (and is killed) 9 times in 9 s
        time.sleep(0.5)  # the hog's children are running
        results = [execute_program(textwrap.dedent(HONEST), honest_task, limits=LIMITS, pool=pool) for _ in range(2)]
        hog.join()
    assert [r.status for r in results] == ["passed", "passed"], results


# ------------------------------------------------------------------------------------------
# the expected side never runs where the program can touch it
# ------------------------------------------------------------------------------------------

STAR_TASK = assert_task("t/star", "area", "assert area(1) == pi", test_imports=("from math import *",))
SETUP_TASK = assert_task(
    "t/setup",
    "unshift",
    'assert unshift(shift("abc")) == "abc"',
    test_setup_code="def shift(s):\n    return s[1:] + s[:1]\n",
)
LIBRARY_TASK = assert_task(
    "t/lib", "halves", "assert np.allclose(halves(4), [1.0, 0.5, 0.25, 0.2])", test_imports=("import numpy as np",)
)
EXPECTED_SIDE_CASES = {
    # a name the test's star import binds is rebound by the program in the namespace they share
    "star_import": (
        STAR_TASK,
        "import math\ndef area(r):\n    return math.pi * r * r\n",
        "pi = 7\ndef area(r):\n    return 7\n",
    ),
    # the setup's helper is compiled through builtins.compile, which the program replaces first
    "setup_helper": (
        SETUP_TASK,
        "def unshift(s):\n    return s[-1:] + s[:-1]\n",
        "import builtins\n_compile = builtins.compile\n"
        "def compile(source, name, *args, **kwargs):\n"
        "    if name == '<setup>':\n"
        "        source = source.replace('s[1:] + s[:1]', 's')\n"
        "    return _compile(source, name, *args, **kwargs)\n"
        "builtins.compile = compile\n"
        "def unshift(s):\n    return s\n",
    ),
    # the library function that compares is patched, or its literal read from the harness's frame
    "library_call": (
        LIBRARY_TASK,
        "def halves(n):\n    return [1.0, 0.5, 0.25, 0.2][:n]\n",
        "import numpy as np\nnp.allclose = lambda *a, **k: True\ndef halves(n):\n    return [0.0] * n\n",
    ),
    "library_call_frame": (
        LIBRARY_TASK,
        "def halves(n):\n    return [1.0, 0.5, 0.25, 0.2][:n]\n",
        "import sys\ndef halves(n):\n"
        "    frame = sys._getframe(1)\n"
        "    return [c for c in frame.f_code.co_consts if isinstance(c, tuple)][0]\n",
    ),
}


@pytest.mark.parametrize("name", sorted(EXPECTED_SIDE_CASES))
def test_the_expected_side_is_computed_program_free(pool, name):
    task, honest, hostile = EXPECTED_SIDE_CASES[name]
    assert run(pool, honest, task).passed
    result = run(pool, hostile, task)
    assert not result.passed, result


# ------------------------------------------------------------------------------------------
# charged time: what the CPU accounting could be gamed with
# ------------------------------------------------------------------------------------------

SPIN = "def spin(seconds):\n    end = time.thread_time() + seconds\n    while time.thread_time() < end:\n        pass\n"


@needs_root
@pytest.mark.parametrize(
    "code",
    [
        # four threads of 0.4 s each: 1.6 s of CPU in ~0.4-0.8 s of wall clock
        "import threading, time\n" + SPIN + "ts = [threading.Thread(target=spin, args=(0.4,)) for _ in range(4)]\n"
        "[t.start() for t in ts]\n[t.join() for t in ts]\nprint(3)\n",
        # the work done by a child in its own session, outside the program's own process
        "import ctypes, os, time\nlibc = ctypes.CDLL(None)\n" + SPIN + "pid = libc.fork()\n"
        "if pid == 0:\n    libc.setsid()\n    spin(1.5)\n    libc._exit(0)\nos.waitpid(pid, 0)\nprint(3)\n",
    ],
    ids=["threads", "child_in_its_own_session"],
)
def test_every_thread_and_process_of_the_program_is_charged(pool, code):
    result = run(pool, code, stdin_task("t/charged", ("", "3")))
    assert result.status == "timeout", result


@needs_root
def test_a_child_left_spinning_charges_nothing_to_the_next_program(pool):
    leave = (
        "import ctypes\nlibc = ctypes.CDLL(None)\n"
        "if libc.fork() == 0:\n    libc.setsid()\n    while True:\n        pass\nprint(3)\n"
    )
    assert run(pool, leave, stdin_task("t/left", ("", "3"))).passed
    honest = "import time\n" + SPIN + "spin(0.6)\nprint(3)\n"
    assert run(pool, honest, stdin_task("t/left", ("", "3"))).passed


# ------------------------------------------------------------------------------------------
# the data flow of the expected side: what a program can send into the program-free processes
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code, passes",
    [
        ("def halves(n):\n    return [0.5] * 300_000\n", False),  # a big value into np.allclose
        ("class X:\n    pass\ndef halves(n):\n    return X()\n", False),  # an object: opaque over there
        ("def halves(n):\n    return {'__t': 'object', 'type': 'numpy.ndarray'}\n", False),  # shaped like a tag
        # the right numbers in an object array: plain data once encoded, so the right answer
        ("import numpy as np\ndef halves(n):\n    return np.array([1.0, 0.5, 0.25, 0.2], dtype=object)\n", True),
    ],
    ids=["big", "opaque", "tag_shaped_dict", "object_array"],
)
def test_the_programs_values_in_a_program_free_process_decide_only_its_own_verdict(pool, code, passes):
    result = run(pool, code, LIBRARY_TASK)
    assert result.passed is passes and result.status != "sandbox_error", result
    assert_pool_healthy(pool)


def test_a_program_that_redefines_the_setup_helper_changes_only_its_own_names(pool):
    cheat = "def shift(s):\n    return s\ndef unshift(s):\n    return s\n"
    assert not run(pool, cheat, SETUP_TASK).passed
