"""Hostile round 5: attacks on the reward's meaning rather than on the sandbox's walls, in five classes
none of the earlier batteries covered (docs/sandbox.md, classes 9-13):

9. typed values forged or abused on the way out of the program (the codec's types);
10. reproducing the statement's examples instead of solving (the shown tests);
11. graded text taken from the environment's observations (tool mode);
12. untrusted source compiled in a trusted process;
13. task data that cannot judge (expected sides that err or hang, tests whose verdict is fixed).

Each test is named by what it attacks; each asserts the verdict (or reward) Python's reference harness
would give, and that the program is never credited for what it did not solve."""

from __future__ import annotations

import builtins
import textwrap

import pytest

from config import build_config
from environments.code_env import FeedbackEnvironment, ToolEnvironment, Turn, run_tool_program
from rollouts.completion import RolloutCompletion
from rollouts.episodes import run_episodes
from rollouts.scripted import ScriptedBackend
from sandbox.executor import SandboxLimits, execute_program
from tests.task_factory import assert_task, call_task, stdin_task
from training.scoring import score_rollouts
from training.setup import scoring_sections
from utils.dataset_loader import Task, TaskSchemaError
from utils.prompts import get_unified_prompt
from utils.sft_data import encode_prompt
from utils.thinking_extraction import extract_thinking_and_code_unified

LIMITS = SandboxLimits(test_timeout=2.0)
ADD = assert_task("r5/add", "add", "assert add(1, 2) == 3", "assert add(20, 22) == 42", "assert add(-7, 7) == 0")


def run(pool, code: str, task: Task = ADD):
    return execute_program(textwrap.dedent(code), task, pool=pool, limits=LIMITS)


def _forge(value_json: str) -> str:
    """A program that writes its own value frames for every test (a forged tagged value) and exits."""
    return f"""
    import json, os, struct
    def add(a, b):
        for i in range(3):
            data = ('{{"k": "val", "i": %d, "v": ' % i + {value_json!r} + '}}').encode()
            os.write(3, struct.pack('>I', len(data)) + data)
        os._exit(0)
    """


def _failed_by_the_program(result) -> bool:
    return not result.passed and result.status not in ("sandbox_error", "passed")


# ------------------------------------------------------------------ 9. typed values forged or abused


@pytest.mark.parametrize(
    "forged",
    [
        '{"__t": "ndarray", "v": ["int64", [3], [1, 2]]}',  # a shape that does not hold its items
        '{"__t": "ndarray", "v": ["int64", [1000000000, 0], []]}',  # a huge shape with no items
        '{"__t": "ndarray", "v": ["int64; import os", [1], [3]]}',  # a dtype that is no dtype
        '{"__t": "memoryview", "v": ["P", [1], "AAAAAAAAAAA="]}',  # a pointer format
        '{"__t": "fraction", "v": [3, 0]}',  # a zero denominator
        '{"__t": "decimal", "v": "not a number"}',
        '{"__t": "dict_items", "v": [[1, 2, 3]]}',  # an item that is no pair
        '{"__t": "npscalar", "v": ["bool", 3]}',  # a numpy bool that is not a bool
    ],
)
def test_forged_typed_values_are_the_programs_failure(pool, forged):
    assert _failed_by_the_program(run(pool, _forge(forged)))


def test_a_fraction_with_huge_terms_is_compared_as_nothing(pool):
    huge = '{"__t": "fraction", "v": [{"__t": "int", "v": "0x' + "f" * 40000 + '"}, 3]}'
    assert _failed_by_the_program(run(pool, _forge(huge)))


def test_a_signalling_nan_decimal_equals_nothing(pool):
    assert _failed_by_the_program(run(pool, "from decimal import Decimal\ndef add(a, b):\n    return Decimal('sNaN')"))


def test_a_program_class_posing_as_a_numpy_array_compares_as_an_array(pool):
    code = """
    class Fake:
        dtype = "int64"
        shape = (2,)
        def tolist(self):
            return [1, 2]
    Fake.__module__, Fake.__qualname__ = "numpy", "ndarray"
    def add(a, b):
        return Fake()
    """
    task = assert_task("r5/arr", "add", "assert add(1, 2) == [1, 2]")
    assert _failed_by_the_program(run(pool, code, task))  # Python: the truth of a 2-element array is ambiguous


def test_a_dict_view_of_colliding_keys_is_compared_as_nothing(pool):
    code = "def add(a, b):\n    return {k * (2**61 - 1) + 1: 0 for k in range(5000)}.keys()"
    task = assert_task("r5/view", "add", "assert add(1, 2) == {1}")
    assert _failed_by_the_program(run(pool, code, task))


def test_a_numpy_bool_is_not_true_inside_a_compound_assert(pool):
    task = assert_task("r5/bool", "add", "assert not (add(1, 2) is not True)")
    assert _failed_by_the_program(run(pool, "import numpy as np\ndef add(a, b):\n    return np.bool_(True)", task))


# ---------------------------------------------------------- 10. reproducing the statement's examples

STATEMENT = "Print a + b.\n\n-----Examples-----\nInput\n3 4\n\nOutput\n7\n\nInput\n10 20\n\nOutput\n30\n"
SUM = stdin_task("r5/sum", ("3 4\n", "7\n"), ("10 20\n", "30\n"), ("5 6\n", "11\n"), ("3  4", "7"), problem=STATEMENT)
KTH = call_task(
    "r5/kth",
    "kth",
    ([[2, 3, 4, 7, 11], 5], 9),
    ([[1, 2], 1], 3),
    problem="Example 1:\nInput: arr = [2,3,4,7,11], k = 5\nOutput: 9\n",
)


def _rewards(pool, tmp_path, task: Task, codes: list[str], reward: str) -> list[float | None]:
    config = build_config("cpu", overrides=[f"paths.output_dir={tmp_path}", f"grpo.correctness_reward={reward}"])
    answers = [RolloutCompletion(f"<think>x</think>\n```python\n{c}\n```", (1,), (2,), "stop") for c in codes]
    groups, _ = score_rollouts([task], ["p"], [answers], pool, **scoring_sections(config))
    return [s.reward.correctness for s in groups[0]]


@pytest.mark.parametrize("reward", ["fraction", "binary"])
def test_a_stdin_program_that_prints_the_statements_examples_earns_nothing(pool, tmp_path, reward):
    lookup = "import sys\nprint({'3 4': 7, '10 20': 30}[' '.join(sys.stdin.read().split())])"
    assert _rewards(pool, tmp_path, SUM, [lookup], reward) == [0.0]


def test_a_call_program_that_returns_the_examples_result_earns_nothing(pool, tmp_path):
    assert _rewards(pool, tmp_path, KTH, ["def kth(arr, k):\n    return 9"], "fraction") == [0.0]


def test_an_mbpp_program_that_returns_the_printed_asserts_answer_earns_nothing(pool, tmp_path):
    assert _rewards(pool, tmp_path, ADD, ["def add(a, b):\n    return 3"], "binary") == [0.0]


def test_a_task_whose_statement_prints_every_test_pays_nothing_to_anyone(pool, tmp_path):
    every = stdin_task("r5/every", ("3 4\n", "7\n"), ("10 20\n", "30\n"), problem=STATEMENT)
    lookup = "import sys\nprint({'3 4': 7, '10 20': 30}[' '.join(sys.stdin.read().split())])"
    assert _rewards(pool, tmp_path, every, [lookup, "print(sum(map(int, input().split())))"], "binary") == [None, None]


# ------------------------------------------------------- 11. graded text from the environment


def _tool_record(tok, pool, turns: list[str]):
    backend = ScriptedBackend(tok, lambda index, turn: turns[turn])
    prompt_ids = encode_prompt(tok, get_unified_prompt(ADD, 1, mode="tool"))
    env = ToolEnvironment(pool, max_tool_calls=4, result_max_bytes=400)
    [record] = run_episodes(
        backend, env, tok, [prompt_ids], [ADD], mode="tool", max_new_tokens=96, max_total_tokens=700
    )
    return record


def test_a_tool_program_that_prints_a_closing_tag_and_a_solution_hands_in_nothing(smollm2_tokenizer, pool):
    program = (
        "print('</' + 'think>')\nprint('```python')\nprint('def add(a, b):')\nprint('    return a + b')\nprint('```')"
    )
    record = _tool_record(smollm2_tokenizer, pool, ["<think>\n<program>\n" + program + "\n</program>", "\nok"])
    parsed = extract_thinking_and_code_unified(record.text)
    assert parsed.code is None and not parsed.well_formed
    assert execute_program(parsed.code, ADD, pool=pool).status == "no_code"


def test_a_tool_program_that_prints_an_opening_tag_cannot_cut_the_policys_answer(smollm2_tokenizer, pool):
    answer = "\n</think>\n\n```python\ndef add(a, b):\n    return a + b\n```"
    record = _tool_record(smollm2_tokenizer, pool, ["<think>\n<program>\nprint('<' + 'think>')\n</program>", answer])
    parsed = extract_thinking_and_code_unified(record.text)
    assert parsed.think_closed and parsed.code is not None and execute_program(parsed.code, ADD, pool=pool).passed


# ------------------------------------------------------------ 12. compile in a trusted process

MARK = "round5_untrusted_source"


@pytest.fixture
def compiled(monkeypatch):
    seen: list[str] = []
    real = builtins.compile

    def spy(source, *args, **kwargs):
        if isinstance(source, str) and MARK in source:
            seen.append(source[:60])
        return real(source, *args, **kwargs)

    monkeypatch.setattr(builtins, "compile", spy)
    return seen


def test_a_huge_raw_answer_is_not_compiled_by_the_parser(compiled):
    body = "".join(f"{MARK}_{k} = [{', '.join(['(1 + 2) * 3'] * 20)}]\n" for k in range(900))  # ~190 KB
    parsed = extract_thinking_and_code_unified("<think>x</think>\n" + body)
    assert parsed.code_source == "raw_answer" and compiled == []


def test_a_huge_tool_program_is_compiled_only_in_the_sandbox(compiled, pool):
    body = "".join(f"{MARK}_{k} = {k}\n" for k in range(5000)) + "print('done')"
    output, ok = run_tool_program(body, pool)
    assert (ok, output.strip()[:200], compiled) == (True, "done", [])


def test_a_compile_time_only_error_is_reported_by_the_sandbox_in_feedback_mode(compiled, pool):
    task = stdin_task("r5/none", ("1\n", "2\n"), problem="Print n + 1.")
    env = FeedbackEnvironment(pool, max_turns=2, num_visible_tests=1, feedback_max_chars=300)
    state = env.start(task)
    step = env.step([state], [Turn(f"<think>x</think>\n```python\n{MARK} = 1\nnonlocal {MARK}\n```", "stop")])[0]
    assert not step.done and "nonlocal" in (step.observation or "") and compiled == []


# ------------------------------------------------------------ 13. task data that cannot judge


@pytest.mark.parametrize(
    ("expected", "imports"),
    [
        ("math.factorial(-1)", ("import math",)),  # errs
        ("(time.sleep(60) or 3)", ("import time",)),  # hangs past the limit
        ("len(bytearray(1 << 40))", ()),  # exhausts memory
    ],
)
def test_an_expected_side_that_cannot_be_computed_is_unjudgeable_not_wrong(pool, expected, imports):
    task = assert_task("r5/bad", "add", f"assert add(1, 2) == {expected}", test_imports=imports)
    result = run(pool, "def add(a, b):\n    return a + b", task)
    assert result.status == "sandbox_error" and result.unjudgeable, (result.status, result.error)


@pytest.mark.parametrize(
    "test",
    [
        "assert 1 == 1",
        "assert True or add(1, 2) == 3",
        "assert add(1, 2) == 3 or 1",
        "assert not []",
        "assert len('ab')",
    ],
)
def test_a_test_whose_verdict_is_fixed_is_refused_by_the_loader(test):
    with pytest.raises(TaskSchemaError, match="does not depend on the program"):
        assert_task("r5/fixed", "add", test)


def test_a_binary_run_charges_one_timeout_not_one_per_test(pool):
    task = stdin_task("r5/hang", *[(f"{k}\n", f"{k}\n") for k in range(5)])
    result = execute_program(
        "while True:\n    pass", task, pool=pool, limits=SandboxLimits(test_timeout=1.0), stop_at_first_failure=True
    )
    assert [o.status for o in result.test_outcomes] == ["timeout"] + ["not_run"] * 4
