"""Whole programs judged by the sandbox and by APPS's own harness semantics side by side
(`tests/apps_reference.py`: its import block before the program, run in a plain interpreter, its accept rule
with the statements' tolerance): the same verdict for both modes, stdin and call."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sandbox.executor import execute_program
from tests.apps_reference import APPS_IMPORTS, apps_accepts
from tests.task_factory import call_task, stdin_task

STDIN = [
    # (program, input, expected): names APPS's import block binds, and one it does not
    ("print(int(np.sum(np.array(list(map(int, input().split()))))))", "1 2 3\n", "6\n"),
    ("d = deque([1, 2]); d.appendleft(0); print(*d)", "\n", "0 1 2\n"),
    ("print(gcd(12, 18), floor(2.5), log2(8))", "\n", "6 2 3.0\n"),
    ("print(comb(5, 2))", "\n", "10\n"),  # math.comb: not in APPS's block, a NameError in both
    ("print(reduce(lambda a, b: a + b, [1, 2]))", "\n", "3\n"),  # functools.reduce: not in the block
    ("heappush(h := [], 3); heappush(h, 1); print(heappop(h))", "\n", "1\n"),
    ("print('%.6f' % 0.0000001234)", "\n", "0.0000001234\n"),
    ("print(1, 2); print(3)", "\n", "1\n2 3\n"),
]

CALL = [
    # (program, fn_name, args, expected)
    ("def f(xs: List[int]) -> int:\n    return int(np.prod(xs))", "f", [[2, 3]], 6),
    ("def f(n):\n    return comb(n, 2)", "f", [5], 10),  # `from math import *` is no part of APPS's block
    ("def f(xs):\n    return list(accumulate(xs))", "f", [[1, 2, 3]], [1, 3, 6]),
    ("def f(xs):\n    return list(pairwise(xs))", "f", [[1, 2]], [[1, 2]]),  # itertools.pairwise: not imported
    ("def f(s):\n    return Counter(s).most_common(1)[0][0]", "f", ["abb"], "b"),
]


def _apps_stdin(program: str, given: str, expected: str) -> bool:
    run = subprocess.run(
        [sys.executable, "-c", APPS_IMPORTS + program], input=given, capture_output=True, text=True, timeout=60
    )
    return run.returncode == 0 and apps_accepts(run.stdout, expected, statement_tolerance=True)


def _apps_call(program: str, fn_name: str, args: list, expected: object) -> bool:
    driver = (
        f"{APPS_IMPORTS}{program}\nimport json as _j\nout = {fn_name}(*_j.loads({json.dumps(json.dumps(args))}))\n"
        "out = list(out) if isinstance(out, tuple) else out\n"
        f"exp = _j.loads({json.dumps(json.dumps(expected))})\n"
        "print(out == exp or (isinstance(exp, list) and bool(exp) and out == exp[0]))"
    )
    run = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=60)
    return run.returncode == 0 and run.stdout.strip() == "True"


@pytest.mark.parametrize(("program", "given", "expected"), STDIN)
def test_stdin_programs_get_apps_verdict(pool, program, given, expected):
    ours = execute_program(program, stdin_task("t/p", (given, expected)), pool=pool)
    assert ours.passed == _apps_stdin(program, given, expected), (ours.status, ours.error)


@pytest.mark.parametrize(("program", "fn_name", "args", "expected"), CALL)
def test_call_programs_get_apps_verdict(pool, program, fn_name, args, expected):
    ours = execute_program(program, call_task("t/c", fn_name, (args, expected)), pool=pool)
    assert ours.passed == _apps_call(program, fn_name, args, expected), (ours.status, ours.error)
