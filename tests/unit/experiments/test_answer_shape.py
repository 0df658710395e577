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


PREFIX = "```python\nvalue = input().strip()  # the first line\n"


@pytest.mark.parametrize(
    ("continuation", "echoes"),
    [
        ("print(value)\n```", False),  # goes on from the prefix
        ("value = input().strip()  # the first line\nprint(value)\n```", True),  # writes the prefix's line again
        ("    value = input().strip()  # the first line\n```", True),  # indented the same line is the same line
        ("```python\nprint(value)\n```", False),  # a short line (the fence) written again is not an echo
    ],
)
def test_a_guided_sample_that_writes_its_prefix_again_is_an_echo(continuation: str, echoes: bool) -> None:
    assert frame.echoes_prefix(PREFIX, continuation) is echoes


def test_each_rollout_row_carries_its_guidance_and_the_programs_shape(tmp_path) -> None:
    import json

    logged = [
        {"step": 1, "task_id": "apps/4", "text": PREFIX + "print(value)\n```", "finish_reason": "stop",
         "correctness": 1.0, "teacher_prefix_tokens": 12, "teacher_prefix": PREFIX},
        {"step": 1, "task_id": "apps/4", "text": PREFIX + "value = input().strip()  # the first line\n",
         "finish_reason": "length", "correctness": 0.0, "teacher_prefix_tokens": 12, "teacher_prefix": PREFIX},
        {"step": 2, "task_id": "mbpp/1", "text": "<think>use input()</think>\n```python\ndef f(x):\n    return x\n```",
         "finish_reason": "stop", "correctness": None, "teacher_prefix_tokens": 0, "teacher_prefix": ""},
    ]  # fmt: skip
    (tmp_path / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in logged))
    assert frame.rollout_rows(tmp_path) == [
        [1, "apps/4", 12, 1, "stop", 1, 0],
        [1, "apps/4", 12, 0, "length", 1, 1],
        [2, "mbpp/1", 0, 0, "stop", 0, 0],  # the thinking's "input()" is not the program
    ]
    examples = frame.rollout_examples(tmp_path, {"apps_format": "apps/", "mbpp_format": "mbpp/"})
    assert [(e["stratum"], e["kind"], e["step"]) for e in examples] == [
        ("apps_format", "guided, passed", 1),
        ("apps_format", "guided, failed", 1),
    ]
    assert examples[0]["teacher_prefix"] == PREFIX and examples[0]["text"].startswith(PREFIX)
    assert frame.rollout_rows(tmp_path / "none") == []  # a run folder without the log (older phase 3)
