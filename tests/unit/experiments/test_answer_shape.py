"""What an answer looks like beside its score: whether the graded program reads standard input (an APPS-format
task is solved only by one), read from its syntax tree, not its text."""

from __future__ import annotations

import pytest

from experiments import frame


@pytest.mark.parametrize(
    "code",
    [
        "n = int(input())\nprint(n * 2)",
        "import sys\ndata = sys.stdin.read().split()\nprint(len(data))",
        "import sys\nfor line in sys.stdin:\n    print(line)",
        "from sys import stdin\nprint(stdin.readline())",
        "print(open(0).read())",
        "import fileinput\nfor line in fileinput.input():\n    print(line)",
        "def main():\n    a, b = map(int, input().split())\n    print(a + b)\nmain()",
        "n = int(input()\nprint(n)",  # does not parse: read as text
    ],
)
def test_a_program_that_reads_stdin_is_seen(code: str) -> None:
    assert frame.reads_stdin(code)


@pytest.mark.parametrize(
    "code",
    [
        "def f(x):\n    return x[::-1]",
        "# read it with input()\ndef f(x):\n    return x",  # a comment is not a read
        'def prompt():\n    return "call input() here"',  # nor a string
        "def f(stdin_text):\n    return stdin_text.split()",
        "with open('data.txt') as handle:\n    print(handle.read())",
        "",
    ],
)
def test_a_program_that_does_not_read_stdin_is_not(code: str) -> None:
    assert not frame.reads_stdin(code)


def test_each_evidence_row_carries_the_programs_shape() -> None:
    rows = [
        {"task_id": "apps/1", "sample_idx": 0, "passed": True, "status": "passed", "finish_reason": "stop",
         "num_tokens": 12, "code": "print(input())"},
        {"task_id": "mbpp/2", "sample_idx": 0, "passed": False, "status": "no_code", "finish_reason": "length",
         "num_tokens": 96, "code": None},
    ]  # fmt: skip
    evidence = frame.sample_rows(rows)
    column = frame.SAMPLE_COLUMNS.index("reads_stdin")
    assert [row[column] for row in evidence] == [1, 0]
    assert all(len(row) == len(frame.SAMPLE_COLUMNS) for row in evidence)
