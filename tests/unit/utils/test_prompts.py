import json
from pathlib import Path

import pytest

from tests.task_factory import assert_task, call_task, stdin_task
from utils.prompts import (
    CODE_FENCE,
    PROGRAM_CLOSE,
    PROGRAM_OPEN,
    PYTHON_FENCE,
    RESULT_CLOSE,
    RESULT_OPEN,
    SYSTEM_PROMPT_UNIFIED,
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_EXAMPLE,
    build_chat_messages,
    get_unified_prompt,
)
from utils.thinking_extraction import extract_thinking_and_code_unified

MBPP = assert_task(
    "mbpp/2",
    "similar_elements",
    "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))",
    "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))",
    "assert set(similar_elements((11, 12, 14, 13),(17, 15, 14, 13))) == set((13, 14))",
    source="mbpp",
    problem="Write a function to find the shared elements from the given two lists.",
)


def test_mbpp_prompt_shows_problem_function_name_and_only_the_visible_asserts():
    prompt = get_unified_prompt(MBPP, num_visible_tests=1)
    assert prompt.startswith("Solve the following problem:\n\n" + MBPP.problem)
    assert "`similar_elements`" in prompt
    assert MBPP.tests[0] in prompt and MBPP.tests[1] not in prompt and MBPP.tests[2] not in prompt
    assert all(t in get_unified_prompt(MBPP, num_visible_tests=3) for t in MBPP.tests)
    assert not any(t in get_unified_prompt(MBPP, num_visible_tests=0) for t in MBPP.tests)


def test_prompt_shows_the_answer_format_with_the_shared_constants():
    prompt = get_unified_prompt(MBPP)
    fmt = prompt[prompt.index("Format:") :]
    assert fmt.index(THINK_OPEN) < fmt.index(THINK_CLOSE) < fmt.index(PYTHON_FENCE) < fmt.rindex(CODE_FENCE)
    # described in words: the project's own parser finds no program in it
    assert extract_thinking_and_code_unified(fmt[len("Format:\n") :]).code is None


def test_stdin_and_call_prompts():
    stdin = stdin_task("apps/1", ("1 2\n", "3\n"), source="apps", problem="Print the sum of two integers.")
    p = get_unified_prompt(stdin)
    assert "standard input" in p and "standard output" in p and "1 2" not in p.split("Format:")[0].split("integers.")[1]
    call = call_task(
        "apps/2",
        "reverseWords",
        (["a b"], "b a"),
        source="apps",
        problem="Reverse the words.",
        starter_code="\nclass Solution:\n    def reverseWords(self, s: str) -> str:\n        ",
    )
    p = get_unified_prompt(call)
    assert "class Solution:\n    def reverseWords(self, s: str) -> str:" in p
    assert "method of class `Solution` named `reverseWords`" in p
    plain = {
        "problem": "Check primes.",
        "test_type": "call",
        "fn_name": "is_prime",
        "starter_code": "def is_prime(n):\n\t",
        "tests": [],
    }
    assert "a function named `is_prime`" in get_unified_prompt(plain)


def test_plain_string_problem():
    p = get_unified_prompt("  Add two numbers.  ")
    assert p.startswith("Solve the following problem:\n\nAdd two numbers.\n\n") and PYTHON_FENCE in p


def test_chat_messages_always_carry_the_system_prompt():
    messages = build_chat_messages("hi")
    assert messages == [{"role": "system", "content": SYSTEM_PROMPT_UNIFIED}, {"role": "user", "content": "hi"}]
    assert build_chat_messages("hi", system_prompt=None) == [{"role": "user", "content": "hi"}]


# ------------------------------------------------------------------ multi-turn modes

GOLDEN = Path(__file__).resolve().parents[2] / "data" / "single_turn_prompts.json"


def _golden_tasks() -> dict:
    from utils.dataset_loader import load_apps, load_humaneval, load_mbpp

    root = Path(__file__).resolve().parents[3] / "data" / "embedded"
    tasks = (
        load_mbpp(root / "mbpp_fixtures.jsonl")[0] + load_apps(root / "apps_fixtures.jsonl")[0] + load_humaneval()[0]
    )
    return {t.task_id: t for t in tasks}


def test_single_turn_prompts_are_byte_identical_to_the_pre_multi_turn_ones():
    # tests/data/single_turn_prompts.json was written by get_unified_prompt before the modes existed
    cases = json.loads(GOLDEN.read_text())
    tasks = _golden_tasks()
    assert len(cases) == 97
    for case in cases:
        task = tasks[case["task"]] if case["task"] else case["problem"]
        assert get_unified_prompt(task, case["num_visible_tests"]) == case["prompt"]
        assert get_unified_prompt(task, case["num_visible_tests"], mode="single") == case["prompt"]


def test_each_mode_appends_its_instructions_to_the_single_turn_prompt():
    single = get_unified_prompt(MBPP)
    tool = get_unified_prompt(MBPP, mode="tool")
    feedback = get_unified_prompt(MBPP, mode="feedback")
    assert tool.startswith(single + "\n\n") and feedback.startswith(single + "\n\n")
    extra = tool[len(single) :]
    for tag in (PROGRAM_OPEN, PROGRAM_CLOSE, RESULT_OPEN, RESULT_CLOSE):
        assert tag in extra
    assert TOOL_EXAMPLE in extra and PROGRAM_OPEN not in feedback and "tests shown" in feedback
    with pytest.raises(ValueError, match="unknown mode 'tools'"):
        get_unified_prompt(MBPP, mode="tools")


def test_the_one_shot_tool_example_parses_like_a_real_answer():
    parsed = extract_thinking_and_code_unified(TOOL_EXAMPLE)
    assert parsed.well_formed and parsed.code.startswith("def sum_to(n):")
    # the program sits inside the thinking, where no graded code is ever taken from
    assert PROGRAM_OPEN in parsed.thinking and RESULT_CLOSE in parsed.thinking
    assert TOOL_EXAMPLE.count(PROGRAM_OPEN) == TOOL_EXAMPLE.count(PROGRAM_CLOSE) == 1


def test_the_format_example_has_no_code_block_a_student_can_copy():
    # a fenced placeholder in the prompt is copied after the answer by small students and then graded
    from utils.code_parser import find_code_blocks

    for task in (MBPP, "Add two numbers."):
        prompt = get_unified_prompt(task)
        fmt = prompt[prompt.index("Format:") :]
        assert find_code_blocks(fmt) == []
        assert THINK_OPEN in fmt and THINK_CLOSE in fmt and PYTHON_FENCE in fmt
