"""What a prompt shows of a task's tests (`utils.shown_tests`), and that the rewards and the feedback
environment read that one set: correctness comes from the hidden tests only."""

from __future__ import annotations

from config import build_config
from environments.code_env import visible_tests
from rollouts.completion import RolloutCompletion
from tests.task_factory import assert_task, call_task, stdin_task
from training.scoring import score_rollouts
from training.setup import scoring_sections
from utils.prompts import get_unified_prompt
from utils.shown_tests import example_blocks, hidden_tests_task, no_hidden_test_ids, shown_test_indices

STATEMENT = (
    "Print the sum of the integers on the input line (at most 4 of them, each 1 to 9).\n\n"
    "-----Examples-----\nInput\n3 4\n\nOutput\n7\n\n"
    "Input\n1 1\n\nOutput\n2\n\n-----Note-----\nIn the first example 3 + 4 = 7."
)
# the first two tests are the statement's examples; the third and fifth are hidden although their values
# (4, 1) are substrings of the statement; the fourth repeats an example with other spacing
SUM = stdin_task(
    "t/sum",
    ("3 4\n", "7\n"),
    ("1 1\n", "2\n"),
    ("1 2\n", "3\n"),
    ("3   4", "7"),
    ("4\n", "4\n"),
    problem=STATEMENT,
)
LEETCODE = call_task(
    "t/kth",
    "findKthPositive",
    ([[2, 3, 4, 7, 11], 5], 9),
    ([[1, 2, 3, 4], 2], 6),
    ([[1, 2], 1], 3),
    problem=(
        "Find the kth missing positive integer.\n\nExample 1:\nInput: arr = [2,3,4,7,11], k = 5\nOutput: 9\n"
        "Explanation: the missing ones are [1,5,6,8,9,...].\n\nExample 2:\nInput: arr = [1,2,3,4], k = 2\nOutput: 6\n"
    ),
)


def _answer(code: str) -> RolloutCompletion:
    return RolloutCompletion(f"<think>\nx\n</think>\n\n```python\n{code}\n```", (1, 2), (3,), "stop")


def test_stdin_examples_are_shown_by_content_and_duplicates_with_them():
    assert example_blocks(STATEMENT) == [("3 4\n", "7\n"), ("1 1\n", "2\n")]
    assert shown_test_indices(SUM, 1) == {0, 1, 3}


def test_call_examples_are_shown_by_their_arguments_and_result():
    assert shown_test_indices(LEETCODE, 1) == {0, 1}
    codewars = call_task("t/p", "is_prime", ([2], [True]), ([9], [False]), problem="is_prime(2) == true\nis_prime(4)")
    assert shown_test_indices(codewars, 1) == {0}


def test_mbpp_shows_the_printed_asserts_and_their_repeats():
    task = assert_task("t/a", "f", "assert f(1) == 2", "assert f(2) == 3", "assert  f(1)  ==  2")
    assert shown_test_indices(task, 1) == {0, 2}
    prompt = get_unified_prompt(task, 1)
    assert "assert f(1) == 2" in prompt and "f(2)" not in prompt
    assert hidden_tests_task(task, 1).tests == ("assert f(2) == 3",)


def test_feedback_never_runs_a_hidden_test_whose_values_the_statement_mentions():
    shown = visible_tests(SUM, 1)
    assert shown is not None and [t["input"] for t in shown.tests] == ["3 4\n", "1 1\n", "3   4"]


def test_a_program_that_prints_the_examples_earns_nothing(tmp_path, pool):
    config = build_config("cpu", overrides=[f"paths.output_dir={tmp_path}", "grpo.correctness_reward=fraction"])
    examples = "import sys\nprint({'3 4': 7, '1 1': 2}.get(' '.join(sys.stdin.read().split()), 0))"
    honest = "print(sum(map(int, input().split())))"
    groups, _ = score_rollouts(
        [SUM], ["prompt"], [[_answer(examples), _answer(honest)]], pool, **scoring_sections(config)
    )
    assert [s.reward.correctness for s in groups[0]] == [0.0, 1.0]


def test_a_task_whose_prompt_shows_every_test_gives_no_correctness_signal(tmp_path, pool):
    every = stdin_task("t/all", ("3 4\n", "7\n"), ("1 1\n", "2\n"), problem=STATEMENT)
    assert no_hidden_test_ids([every, SUM], 1) == ["t/all"]
    config = build_config("cpu", overrides=[f"paths.output_dir={tmp_path}", "grpo.correctness_reward=binary"])
    examples = "import sys\nprint({'3 4': 7, '1 1': 2}.get(' '.join(sys.stdin.read().split()), 0))"
    groups, _ = score_rollouts([every], ["prompt"], [[_answer(examples)]], pool, **scoring_sections(config))
    assert groups[0][0].reward.correctness is None and groups[0][0].reward.total is None


def test_self_sft_never_imitates_a_sample_of_a_task_without_hidden_tests(tmp_path, pool):
    from training.sft_sources import best_passing_sample

    every = stdin_task("t/all2", ("3 4\n", "7\n"), ("1 1\n", "2\n"), problem=STATEMENT)
    config = build_config("cpu", overrides=[f"paths.output_dir={tmp_path}", "grpo.correctness_reward=binary"])
    examples = "import sys\nprint({'3 4': 7, '1 1': 2}.get(' '.join(sys.stdin.read().split()), 0))"
    groups, _ = score_rollouts([every], ["prompt"], [[_answer(examples)]], pool, **scoring_sections(config))
    assert groups[0][0].result.passed and best_passing_sample(groups[0]) is None
