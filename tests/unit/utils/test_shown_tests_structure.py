"""The shown-test rule by structure (`utils.shown_tests`): an assert is the same test however it is spelled,
an example is read however the statement lays it out, and an input is the example's only when it is the
same text token for token."""

from __future__ import annotations

import pytest

from tests.task_factory import assert_task, call_task, stdin_task
from utils.shown_tests import shown_test_indices, substring_only_counts


@pytest.mark.parametrize(
    "respelled",
    [
        "assert  f( 2 )==4",  # spacing
        "assert 4 == f(2)",  # swapped sides
        "assert (f(2)) == 4",  # parentheses
        "assert f(2) == 4, 'message'",  # a message
        "assert f(2) == (4)",
    ],
)
def test_a_respelled_printed_assert_is_shown(respelled):
    task = assert_task("t/a", "f", "assert f(2) == 4", respelled, "assert f(3) == 9")
    assert shown_test_indices(task, 1) == {0, 1}


def test_a_different_assert_stays_hidden():
    task = assert_task("t/a", "f", "assert f(2) == 4", "assert f(2) != 4", "assert f(4) == 2")
    assert shown_test_indices(task, 1) == {0}


@pytest.mark.parametrize(
    "problem",
    [
        "Example\nInput\n```\n3 4\n```\nOutput\n```\n7\n```\n",
        "Example\nInput\n<pre>3 4</pre>\nOutput\n<pre>\n7\n</pre>\n",
        "Example input:\n3 4\nExpected output:\n7\n",
        "Sample Input 1\n3 4\nSample Output 1\n7\n",
    ],
)
def test_stdin_examples_in_every_layout_are_read(problem):
    task = stdin_task("t/s", ("3 4\n", "7\n"), ("1 1\n", "2\n"), problem=problem)
    assert shown_test_indices(task, 1) == {0}


def test_an_input_is_shown_only_token_for_token():
    """An example's input 0.5 does not show the test whose input is 0.5000001 (tolerance is for outputs)."""
    task = stdin_task("t/f", ("0.5\n", "1\n"), ("0.5000001\n", "1\n"), problem="Input\n0.5\nOutput\n1\n")
    assert shown_test_indices(task, 1) == {0}


def test_a_codewars_result_on_the_next_line_is_read():
    problem = "Is n prime?\n\nExamples:\n\nis_prime(7)\ntrue\n\nis_prime(8)\nfalse\n"
    task = call_task("t/p", "is_prime", ([7], [True]), ([8], [False]), ([9], [False]), problem=problem)
    assert shown_test_indices(task, 1) == {0, 1}


def test_the_substring_report_names_what_only_the_looser_rule_finds():
    """A test whose texts the statement holds outside an example block (prose) is counted, per source."""
    prose = "For 3 4 the answer is 7; for 1 1 it is 2.\n\nExample\nInput\n1 1\nOutput\n2\n"
    task = stdin_task("t/r", ("3 4\n", "7\n"), ("1 1\n", "2\n"), ("5 5\n", "10\n"), problem=prose)
    assert shown_test_indices(task, 1) == {1}
    assert substring_only_counts([task], 1) == {"t": {"tests": 3, "example_rule": 1, "substring_only": 1}}
