"""The third hostile battery (issue 29): the two round-2 weaknesses and an adversarial round against
the zygote design (namespaces, spares, cgroup, protocol codec, judge, multi-turn environment).

Each group names its class; a program that found a weakness on c225caf says so in its docstring and
was fixed at the root (docs/sandbox.md, class table). The other programs held and stay as regression
tests. Helpers (`run`, `assert_pool_healthy`) check what the earlier batteries check after every
program: no process or IPC object of it is left, and the pool keeps working.
"""

from __future__ import annotations

import pytest

from sandbox.executor import SandboxPool
from tests.task_factory import call_task, stdin_task
from tests.test_sandbox_hostile_round2 import LIMITS, assert_pool_healthy, run


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
