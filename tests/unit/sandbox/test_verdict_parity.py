"""The stdin rule against APPS's own verdict (`tests/apps_reference.py`, a restatement of its harness):
equal wherever the rule is meant to agree, and different only in the deliberate differences that
docs/sandbox.md lists (its token-set bug, its numpy tolerance in place of the statements' own)."""

from __future__ import annotations

import pytest

from sandbox.judge import stdout_matches
from tests.apps_reference import apps_accepts
from tests.task_factory import stdin_task
from utils.shown_tests import shown_test_indices

PARITY = [
    ("3\n", "3"),
    ("3", "3\n\n"),
    ("1 2 \n3  \n", "1 2\n3"),
    ("1 2\r\n3\r\n", "1 2\n3\n"),
    ("\n\n1\n\n2\n", "1\n2\n"),  # blank lines are dropped on both sides
    ("  1\n2", "1\n2"),
    ("YES\n", "YES"),
    ("yes\n", "YES"),
    ("4 5 2 3 1\n", "4 5 2 3 1 "),
    ("1 2\n3\n", "1\n2 3\n"),  # line structure: one line too many tokens
    ("1\n2\n", "1 2\n"),  # one expected line printed as two
    ("1 2\n", "1\n2\n"),
    ("2 1", "1 2"),
    ("0.000000\n", "0.0000001234\n"),  # '%.6f' of an answer under 1e-6: absolute error 1.2e-7
    ("0.500000\n", "0.4999996\n"),
    ("0.499999\n", "0.5\n"),
    ("123456.7\n", "123456.8\n"),  # relative error 8e-7
    ("100.0002\n", "100.0\n"),  # relative error 2e-6: over the statements' bound
    ("1.000002\n", "1.0\n"),
    ("3.0\n", "3\n"),  # an expected integer wants an integer
    ("1.5 2\n", "1.5000001 2\n"),
]


@pytest.mark.parametrize(("stdout", "expected"), PARITY)
def test_the_stdin_rule_is_apps_with_the_statements_tolerance(stdout, expected):
    assert stdout_matches(stdout, expected) == apps_accepts(stdout, expected, statement_tolerance=True)


# the deliberate differences from APPS's harness as it is (docs/sandbox.md, "APPS's bugs refused")
DELIBERATE = [
    ("2 1", "1 2", "token sets: order"),
    ("1 1 2", "1 2", "token sets: repetition"),
    ("3.0\n", "3\n", "numpy tolerance on an expected integer"),
    ("100.0002\n", "100.0\n", "numpy's relative 1e-5 where statements say 1e-6"),
]


@pytest.mark.parametrize(("stdout", "expected", "why"), DELIBERATE)
def test_apps_harness_bugs_stay_refused(stdout, expected, why):
    assert apps_accepts(stdout, expected, set_rule=True), why
    assert not stdout_matches(stdout, expected), why


def test_the_shown_rule_reads_numbers_with_the_stdin_rule():
    """An example printed with '%.6f' shows the test whose answer is that number to the statements' tolerance."""
    problem = "Example\nInput\n5\nOutput\n0.000000\n"
    task = stdin_task("t/f", ("5\n", "0.0000001234\n"), problem=problem)
    assert shown_test_indices(task, 1) == {0}
