"""Correctness of the sandbox verdicts: references pass, wrong variants fail, comparison rules."""

from __future__ import annotations

import json

import pytest

from sandbox.executor import (
    SandboxIsolationWarning,
    SandboxLimits,
    SandboxPool,
    execute_many,
    execute_program,
    wrap_like_apps,
)
from sandbox.judge import plan_assert
from tests.cli_helpers import run_script
from tests.conftest import SHARED_DATA
from tests.task_factory import assert_task, call_task, stdin_task
from utils.dataset_loader import EMBEDDED_APPS, EMBEDDED_MBPP, load_apps, load_mbpp

LIMITS = SandboxLimits(test_timeout=2.0)


@pytest.fixture(scope="module")
def fixtures():
    return load_mbpp(EMBEDDED_MBPP)[0] + load_apps(EMBEDDED_APPS)[0]


def test_wrap_like_apps_makes_top_level_return_legal():
    code = "from math import *\nn = int(input())\nif n < 0:\n    print(-1)\n    return\nprint(floor(sqrt(n)))"
    compile(wrap_like_apps(code), "<w>", "exec")


# ---------------------------------------------------------------- verdicts through the sandbox


def test_every_fixture_reference_passes(pool, fixtures):
    results = execute_many([(t.reference_solutions[0], t) for t in fixtures], pool, LIMITS, include_challenge=True)
    failures = [(t.task_id, r.status, r.error) for t, r in zip(fixtures, results, strict=True) if not r.passed]
    assert not failures
    assert all(r.tests_passed == r.tests_total > 0 for r in results)


WRONG_VARIANTS = [
    ("+", "-"),
    ("return a + b", "return a * b"),
    ("max(", "min("),
    ("print(a + b)", "print(a - b)"),
    ("[::-1]", ""),
    ("% 2 == 0", "% 2 == 1"),
    ("sorted(", "list("),
    ("best = max(best, cur)", "best = cur"),
]


def test_small_wrong_variants_fail(pool, fixtures):
    mutated = []
    for task in fixtures:
        code = task.reference_solutions[0]
        for old, new in WRONG_VARIANTS:
            if old in code:
                mutated.append((code.replace(old, new, 1), task))
                break
    assert len(mutated) >= 15
    results = execute_many(mutated, pool, LIMITS)
    survivors = [(t.task_id, r.status) for (_, t), r in zip(mutated, results, strict=True) if r.passed]
    # a mutation that keeps every test green would be a weak fixture; there should be none
    assert not survivors


def test_results_keep_input_order_and_ids(pool, fixtures):
    items = [(fixtures[0].reference_solutions[0], fixtures[0]), ("def nope(: pass", fixtures[1]), (None, fixtures[2])]
    results = execute_many(items, pool, LIMITS, sample_ids=["a", "b", "c"])
    assert [r.sample_id for r in results] == ["a", "b", "c"]
    assert [r.status for r in results] == ["passed", "syntax_error", "no_code"]
    assert results[1].error.startswith("line 1") and results[2].pass_fraction == 0.0


def test_partial_credit_and_statuses(pool):
    task = assert_task("t/1", "f", "assert f(1) == 1", "assert f(2) == 4", "assert f(3) == 9")
    half = execute_program("def f(x):\n    return x * x if x < 3 else 0\n", task, limits=LIMITS, pool=pool)
    assert (half.passed, half.tests_passed, half.status) == (False, 2, "wrong_answer")
    assert half.pass_fraction == pytest.approx(2 / 3)
    assert [o.passed for o in half.test_outcomes] == [True, True, False]
    crash = execute_program("def f(x):\n    return 1 // (x - x)\n", task, limits=LIMITS, pool=pool)
    assert crash.status == "runtime_error" and "ZeroDivisionError" in crash.error and crash.tests_passed == 0


def test_mbpp_setup_code_runs_after_the_program(pool):
    setup = "s = Box()\ns.add(1)\ns.add(2)"
    task = assert_task("t/2", "size", "assert size(s) == 2", test_setup_code=setup, test_imports=("import math",))
    code = (
        "class Box:\n    def __init__(self):\n        self.items = []\n"
        "    def add(self, x):\n        self.items.append(x)\n"
        "def size(b):\n    return len(b.items) if math.pi > 3 else 0\n"
    )
    assert execute_program(code, task, limits=LIMITS, pool=pool).passed


def test_call_based_solution_class_and_typing_names(pool):
    task = call_task("t/3", "twice", ([[1, 2]], [2, 4]), ([[]], [[]]))
    code = (
        "class Solution:\n    def twice(self, xs: List[int]) -> Tuple[int, ...]:\n"
        "        return tuple(2 * x for x in xs)\n"
    )
    assert execute_program(code, task, limits=LIMITS, pool=pool).passed


def test_stdin_reads_all_input_forms(pool):
    task = stdin_task("t/4", ("3\n1 2 3\n", "6\n"))
    for code in (
        "import sys\nprint(sum(map(int, sys.stdin.read().split()[1:])))",
        "n = int(input())\nprint(sum(map(int, input().split())))",
        "data = open(0).read().split()\nprint(sum(map(int, data[1:])))",
        "import sys\nprint(sum(map(int, sys.stdin.buffer.read().split()[1:])))",
        "def main():\n    input()\n    print(sum(map(int, input().split())))\nif __name__ == '__main__':\n    main()",
    ):
        result = execute_program(code, task, limits=LIMITS, pool=pool)
        assert result.passed, (code, result)


def test_timeout_then_later_tests_still_run(pool):
    task = assert_task("t/5", "f", "assert f(0) == 0", "assert f(1) == 1", "assert f(2) == 2")
    code = "def f(x):\n    while x == 1:\n        pass\n    return x\n"
    result = execute_program(code, task, limits=SandboxLimits(test_timeout=0.5), pool=pool)
    assert [o.status for o in result.test_outcomes] == ["passed", "timeout", "passed"]
    assert result.status == "timeout" and result.tests_passed == 2


def test_sandbox_error_is_distinct_and_the_pool_recovers():
    with SandboxPool(workers=1, limits=LIMITS) as single:
        task = call_task("t/6", "f", ([], 1))
        single._all[0].process.kill()  # the harness dies, not the program
        single._all[0].process.wait()
        broken = execute_program("def f():\n    return 1\n", task, limits=LIMITS, pool=single)
        assert broken.status == "sandbox_error" and broken.tests_passed == 0
        assert execute_program("def f():\n    return 1\n", task, limits=LIMITS, pool=single).passed


def test_basic_isolation_mode_still_judges_correctly():
    with pytest.warns(SandboxIsolationWarning), SandboxPool(workers=1, limits=LIMITS, isolate=False) as basic:
        task = stdin_task("t/7", ("2\n", "4\n"))
        assert basic.isolation == "basic"
        assert execute_program("print(int(input()) * 2)", task, limits=LIMITS, pool=basic).passed
        assert execute_program("print(int(input()) * 3)", task, limits=LIMITS, pool=basic).status == "wrong_answer"


def test_command_line_rescoring(tmp_path, fixtures):
    from utils.dataset_loader import write_tasks

    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, fixtures[:2])
    samples = tmp_path / "samples.jsonl"
    rows = [
        {
            "task_id": fixtures[0].task_id,
            "completion": f"<think>easy</think>\n```python\n{fixtures[0].reference_solutions[0]}\n```",
        },
        {"task_id": fixtures[1].task_id, "code": "def nothing():\n    pass\n"},
        {"task_id": fixtures[0].task_id, "completion": "<think>cut off"},
    ]
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "results.jsonl"
    rescore = ("-m", "sandbox.executor", "--tasks", str(tasks), "--output", str(out))
    proc = run_script(*rescore, "--samples", str(samples), "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["status"] for x in lines] == ["passed", "runtime_error", "no_code"]
    assert {
        "passed",
        "tests_passed",
        "tests_total",
        "pass_fraction",
        "status",
        "error",
        "wall_time",
        "test_outcomes",
    } <= set(lines[0])
    assert "3 samples" in proc.stdout and "1 passed" in proc.stdout
    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text(json.dumps({"task_id": "mbpp/does-not-exist", "code": "pass"}) + "\n")
    bad = run_script(*rescore, "--samples", str(unknown), timeout=60)
    assert bad.returncode == 1 and "is not in" in bad.stderr


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/data not present")
def test_real_mbpp_and_apps_references(pool):
    mbpp = load_mbpp(SHARED_DATA / "mbpp.jsonl")[0]
    apps = load_apps(SHARED_DATA / "apps_sample.jsonl")[0]
    plans = [plan_assert(a) for t in mbpp for a in t.tests]
    untrusted = [p for p in plans if not p.trusted]
    assert len(plans) == 2922 and len(untrusted) == 0  # MBPP 596's sys.getsizeof runs in a program-free process
    # 10 s per test: MBPP 123's reference needs 4.4 s on a 2-core machine, more than the 4 s default
    big = SandboxLimits(test_timeout=10.0)
    results = execute_many([(t.reference_solutions[0], t) for t in mbpp], pool, big, include_challenge=True)
    assert [t.task_id for t, r in zip(mbpp, results, strict=True) if not r.passed] == []
    results = execute_many([(t.reference_solutions[0], t) for t in apps], pool, big)
    failed = sorted(t.metadata["original_id"] for t, r in zip(apps, results, strict=True) if not r.passed)
    # exactly the 7 problems whose statements accept several answers (DATA_NOTES.md); 2036, 2038,
    # 2046 and 2382 pass only because their top-level `return` is wrapped like the APPS harness does
    assert failed == [33, 2023, 2029, 2378, 2386, 2398, 2400]


def test_programs_may_import_numpy_and_write_files_in_their_workdir(pool):
    # numpy is not preloaded (it doubles fork cost) but importable; the working directory is writable
    task = stdin_task("t/8", ("1 2 3\n", "6\n"))
    code = (
        "import numpy as np\nopen('scratch.txt', 'w').write('x')\n"
        "print(int(np.array(input().split(), dtype=int).sum()))"
    )
    assert execute_program(code, task, limits=LIMITS, pool=pool).passed


CTRL_C_SCRIPT = """
import os, signal, time
from sandbox.executor import execute_program
from sandbox.pool import SandboxLimits, SandboxPool
from tests.task_factory import call_task

signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what Ctrl-C means; its workers must not
task = call_task("t/ctrl-c", "f", ([], 1))
with SandboxPool(workers=1, limits=SandboxLimits()) as pool:
    assert execute_program("def f():\\n    return 1\\n", task, limits=SandboxLimits(), pool=pool).passed
    os.killpg(os.getpgrp(), signal.SIGINT)  # what a terminal's Ctrl-C sends: the whole foreground group
    time.sleep(1.0)
    print("after", execute_program("def f():\\n    return 1\\n", task, limits=SandboxLimits(), pool=pool).status)
    probe = "import signal\\ndef f():\\n    return int(signal.getsignal(2) is signal.default_int_handler)\\n"
    print("program's handler", execute_program(probe, task, limits=SandboxLimits(), pool=pool).status)
"""


def test_ctrl_c_to_the_process_group_leaves_the_workers_silent_and_serving():
    # Ctrl-C reaches every process of the terminal's group: the sandbox workers and their zygotes too.
    import subprocess
    import sys

    from tests.conftest import ROOT

    proc = subprocess.run(
        [sys.executable, "-c", CTRL_C_SCRIPT],
        cwd=ROOT,  # `-c` puts the working directory on sys.path
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,  # its own group: the signal must not reach pytest
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "after passed" in proc.stdout
    assert "program's handler passed" in proc.stdout  # a program still sees Python's default Ctrl-C handler
    assert "KeyboardInterrupt" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_a_pool_from_the_config_owns_its_limits_and_what_runs_on_it_takes_them():
    """One set of limits: the config section's reach the pool, and the environments and scoring take the pool's."""
    import dataclasses

    from config import SandboxConfig, build_config
    from environments.code_env import run_tool_program
    from sandbox.pool import SandboxLimits, SandboxPool

    defaults = SandboxConfig()
    assert (defaults.timeout_per_test, defaults.memory_limit_mb) == (
        SandboxLimits().test_timeout,
        SandboxLimits().memory_mb,
    ), "the config's defaults and the sandbox's are one set"
    section = build_config("cpu").sandbox
    tight = dataclasses.replace(section, timeout_per_test=0.5)
    with SandboxPool.from_config(tight, workers=1) as pool:
        assert pool.limits == SandboxLimits(test_timeout=0.5, memory_mb=section.memory_limit_mb)
        assert pool.size == 1
        output, ok = run_tool_program("import time\ntime.sleep(5)\nprint('late')", pool)
    assert not ok and "late" not in output and "time" in output.lower()


# ------------------------------------------------------------------------------- binary reward: stop early


def test_a_binary_run_stops_at_the_first_failing_test(pool):
    task = call_task("t/stop", "f", ([1], 1), ([2], 2), ([3], 3), ([4], 4))
    code = "def f(x):\n    if x >= 2:\n        raise ValueError(x)\n    return x"
    stopped = execute_program(code, task, pool=pool, limits=LIMITS, stop_at_first_failure=True)
    assert [o.status for o in stopped.test_outcomes] == ["passed", "runtime_error", "not_run", "not_run"]
    assert stopped.status == "runtime_error" and stopped.tests_passed == 1
    every = execute_program(code, task, pool=pool, limits=LIMITS)  # the fraction reward runs them all
    assert [o.status for o in every.test_outcomes] == ["passed"] + ["runtime_error"] * 3


def test_a_binary_stdin_run_does_not_rerun_the_tests_after_a_timeout(pool):
    task = stdin_task("t/hang", ("1\n", "1\n"), ("2\n", "2\n"), ("3\n", "3\n"), ("4\n", "4\n"))
    code = "n = int(input())\nwhile n == 2:\n    pass\nprint(n)"
    stopped = execute_program(code, task, pool=pool, limits=SandboxLimits(test_timeout=1.0), stop_at_first_failure=True)
    assert [o.status for o in stopped.test_outcomes] == ["passed", "timeout", "not_run", "not_run"]
    every = execute_program(code, task, pool=pool, limits=SandboxLimits(test_timeout=1.0))
    assert [o.status for o in every.test_outcomes] == ["passed", "timeout", "passed", "passed"]


# ------------------------------------------------------------------------ task data that cannot judge


def test_an_expected_side_that_errs_makes_the_test_unjudgeable_not_wrong(pool):
    task = assert_task("t/bad-expected", "f", "assert f(1) == math.factorial(-1)", test_imports=("import math",))
    result = execute_program("def f(x):\n    return x", task, pool=pool, limits=LIMITS)
    assert result.status == "sandbox_error" and result.unjudgeable, (result.status, result.error)
    assert "expected side" in (result.error or "")


def test_an_unjudgeable_task_gives_no_signal_even_after_the_retry(tmp_path, pool):
    from config import build_config
    from rollouts.completion import RolloutCompletion
    from training.scoring import score_rollouts
    from training.setup import scoring_sections

    task = assert_task(
        "t/bad-expected2",
        "f",
        "assert f(0) == 0",
        "assert f(1) == math.factorial(-1)",
        test_imports=("import math",),
    )
    config = build_config("cpu", overrides=[f"paths.output_dir={tmp_path}", "grpo.correctness_reward=binary"])
    answer = RolloutCompletion("<think>x</think>\n```python\ndef f(x):\n    return x\n```", (1,), (2,), "stop")
    groups, metrics = score_rollouts([task], ["p"], [[answer]], pool, **scoring_sections(config))
    assert groups[0][0].reward.correctness is None and metrics["sandbox/error_confirmed"] == 0.0


def test_phase_one_computes_each_expected_side_once_and_names_those_that_fail(pool):
    from sandbox.executor import expected_side_failures

    bad = assert_task("t/bad", "f", "assert f(1) == math.factorial(-1)", test_imports=("import math",))
    good = assert_task("t/good", "f", "assert f(1) == math.factorial(3)", test_imports=("import math",))
    failures = expected_side_failures([bad, good], pool)
    assert list(failures) == ["t/bad"] and "expected side of test 0" in failures["t/bad"]


@pytest.mark.parametrize(
    "test",
    [
        "assert f(1) == int('x')",  # evaluated in the judging process, not in a program-free one
        "assert f(1) == 1 / 0",
        "assert f(1) == [1, 2][5]",
        "assert f(1) in {1: 2}['k']",
        "assert (f(1), 1) == (1, sorted([1, 'a'])[0])",
    ],
)
def test_an_expected_side_that_fails_in_the_judge_itself_is_unjudgeable(pool, test):
    result = execute_program("def f(x):\n    return x", assert_task("t/bad-here", "f", test), pool=pool, limits=LIMITS)
    assert result.status == "sandbox_error" and result.unjudgeable, (result.status, result.error)


def test_a_program_side_that_fails_in_the_judge_is_the_programs(pool):
    task = assert_task("t/prog-fails", "f", "assert f(1) + 1 == 3", "assert f(1)[5] == 1")
    result = execute_program("def f(x):\n    return 'a'", task, pool=pool, limits=LIMITS)
    assert result.status in ("wrong_answer", "runtime_error") and result.tests_passed == 0, (
        result.status,
        result.error,
    )
