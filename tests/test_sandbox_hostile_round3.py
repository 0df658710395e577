"""The third hostile battery (issue 29): the two round-2 weaknesses and an adversarial round against
the zygote design (namespaces, spares, cgroup, protocol codec, judge, multi-turn environment).

Each group names its class; a program that found a weakness on c225caf says so in its docstring and
was fixed at the root (docs/sandbox.md, class table). The other programs held and stay as regression
tests. Helpers (`run`, `assert_pool_healthy`) check what the earlier batteries check after every
program: no process or IPC object of it is left, and the pool keeps working.
"""

from __future__ import annotations

import pytest

from sandbox.executor import SandboxIsolationWarning, SandboxPool, execute_program, plan_tests, untrusted_task_ids
from tests.conftest import SHARED_DATA
from tests.task_factory import assert_task, call_task, stdin_task
from tests.test_sandbox_hostile_round2 import LIMITS, assert_pool_healthy, run
from utils.dataset_loader import load_apps, load_mbpp


@pytest.fixture()
def pool():
    # one pool per test: an attack that breaks a worker must not decide the next test's outcome
    with SandboxPool(workers=1, limits=LIMITS) as p:
        yield p


# ------------------------------------------------------------------------------------------
# item 2 / class 5: output inflation must be output_limit, never sandbox_error
# ------------------------------------------------------------------------------------------


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
    # issue 29 measurement: on c225caf MBPP 596's 3 asserts (sys.getsizeof) ran whole in the child;
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
    task = stdin_task("t/keyring", ("1\n", "7\n"))
    run(pool, KEYRING_WRITE, task)
    result = run(pool, KEYRING_READ, task)
    assert not result.passed and "none" in (result.error or ""), result


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
        execute_program(KEYRING_WRITE, task, LIMITS, basic)
        result = execute_program(KEYRING_READ, task, LIMITS, basic)
        assert not result.passed and "none" in (result.error or ""), result
