"""Which of a task's tests its prompt shows: the one definition the prompt, the feedback environment,
the rewards and phase 1's report share.

A test is *shown* when the prompt prints it as an example, judged by content, never by position:

- assert tasks (MBPP): the asserts `utils.prompts` prints (the first `num_visible_tests`);
- stdin tasks (APPS): the statement's example input block together with the output block that
  follows it (whitespace-separated tokens equal: the input exactly, the expected output as the
  start of the output block, which may go on with an explanation);
- call tasks (APPS `fn_name`): an example whose input holds exactly the call's arguments and whose
  output starts with its result (`Input: arr = [2,3], k = 5` / `Output: 9`, or a line
  `fn(2, 3) == 5`), compared as literal tokens (quotes, `true`/`True`, `1`/`1.0` normalized);

plus every test equal to a shown one after the same normalization (a duplicate of an example is
no hidden test). Everything else is *hidden*: correctness is scored on the hidden tests only, and a
task without one gives no correctness signal in training. A value the statement merely mentions
(a `7` somewhere in the text) does not make a test shown: only an example block does.

Pure text work on task data (no parsing of any program); this module imports nothing of the project,
so `utils.prompts` and `utils.dataset_loader` can both use it.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from collections.abc import Sequence
from typing import Any

from utils.output_rule import tokens_match

# a line that announces an example's input or output: "Input", "Sample Input 2", "-----Input-----",
# "Input:", "Example Output:" (what follows a colon on the same line is the block's first line)
_HEADER = re.compile(
    r"^\s*[-=*#\s]*(?:expected\s*)?(?:(?:sample|example)s?\s*)?(?:test\s*)?(?:case\s*)?(input|output)s?"
    r"(?:\s*(?:sample|example)s?)?\s*(?:#?\s*\d+)?\s*[-=*#]*\s*(?::(.*))?$",
    re.IGNORECASE,
)
# a line that ends an example block: another section ("-----Note-----", "Example 2:", "Explanation")
_SECTION = re.compile(r"^\s*(?:-{3,}|={3,}|#+\s|(?:examples?|notes?|explanation|constraints?)\b)", re.IGNORECASE)
# the literals of an example written in Python or JSON (names such as `arr =` are skipped)
_LITERAL = re.compile(
    r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[A-Za-z_]\w*|[\[\]{}()]'
)
_WORDS = {"true": "true", "false": "false", "null": "null", "none": "null"}


def printed_asserts(tests: Sequence[Any], num_visible_tests: int) -> list[Any]:
    """The asserts an assert-style prompt prints (`utils.prompts` prints exactly these)."""
    return list(tests)[: max(num_visible_tests, 0)]


def _squeeze(text: str) -> str:
    return " ".join(text.split())


_FENCE = re.compile(r"^\s*(?:```|~~~)[\w+-]*\s*$")
_PRE = re.compile(r"</?(?:pre|code)\b[^>]*>", re.IGNORECASE)


def _layout_free_lines(problem: str) -> list[str]:
    """The statement's lines without the layout around examples: code fences and `<pre>`/`<code>` tags
    (an example's block is the same text with or without them)."""
    text = _PRE.sub("\n", problem.replace("\r\n", "\n").replace("\r", "\n"))
    return [line for line in text.split("\n") if not _FENCE.match(line)]


def example_blocks(problem: str) -> list[tuple[str, str]]:
    """(input block, output text) per example of a statement: the lines after an input header ("Input",
    "Sample Input 2", "Example input:", "-----Input-----") up to the next output header ("Output",
    "Expected output:"), and the lines after that up to the next header or section; code fences and
    `<pre>` tags around them are layout, not text."""
    lines = _layout_free_lines(problem)
    headers = [(_HEADER.match(line), line) for line in lines]
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(lines):
        match = headers[i][0]
        if not match or match.group(1).lower() != "input":
            i += 1
            continue
        block = [match.group(2)] if match.group(2) else []
        j = i + 1
        while j < len(lines) and not headers[j][0]:
            block.append(lines[j])
            j += 1
        following = headers[j][0] if j < len(lines) else None
        if following is None or following.group(1).lower() != "output":
            i = j
            continue
        output = [following.group(2)] if following.group(2) else []
        k = j + 1
        while k < len(lines) and not headers[k][0] and not _SECTION.match(lines[k]):
            output.append(lines[k])
            k += 1
        out.append(("\n".join(block), "\n".join(output)))
        i = k
    return out


def _literal_tokens(text: str) -> list[str]:
    """The literals of `text` in one spelling: strings unquoted (and marked), numbers by value,
    true/false/null in lower case, brackets kept; other names (`arr`, `k`) and punctuation dropped."""
    tokens = []
    for token in _LITERAL.findall(text):
        if token[0] in "\"'":
            tokens.append("s:" + token[1:-1])
        elif token[0].isalpha() or token[0] == "_":
            if token.lower() in _WORDS:
                tokens.append(_WORDS[token.lower()])
        elif token in "[](){}":
            tokens.append("[" if token in "[(" else "]" if token in "])" else token)
        else:
            try:
                number = float(token)
                tokens.append(str(int(number)) if number.is_integer() and abs(number) < 2**53 else repr(number))
            except (ValueError, OverflowError):
                tokens.append(token)
    return tokens


def _value_tokens(value: Any) -> list[str]:
    """A call test's argument or result as literal tokens. APPS stores LeetCode's string arguments with
    their quotes (`"\\"abba\\""`): such a string counts as the string it spells."""
    if isinstance(value, str):
        inner = value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value
        return ["s:" + inner]
    return _literal_tokens(json.dumps(value))


def _args_tokens(args: Sequence[Any]) -> list[str]:
    return [token for arg in args for token in _value_tokens(arg)]


def _call_examples(problem: str, fn_name: str | None) -> list[tuple[list[str], list[str]]]:
    """(argument tokens, output tokens) of each call example of a statement."""
    examples = [(_literal_tokens(block), _literal_tokens(output)) for block, output in example_blocks(problem)]
    if fn_name:
        lines = _layout_free_lines(problem)
        for number, line in enumerate(lines):
            start = line.find(fn_name + "(")
            if start < 0:
                continue
            depth, k = 0, start + len(fn_name)
            for k in range(start + len(fn_name), len(line)):
                depth += {"(": 1, ")": -1}.get(line[k], 0)
                if depth == 0:
                    break
            result = _literal_tokens(line[k + 1 :])
            if not result:  # Codewars' layout: the call on its line, its result on the next non-empty one
                after = [x for x in lines[number + 1 :] if x.strip()]
                if after and fn_name + "(" not in after[0]:
                    result = _literal_tokens(after[0])
            examples.append((_literal_tokens(line[start + len(fn_name) + 1 : k]), result))
    return examples


def _assert_key(source: str) -> str:
    """An assert by its structure: the same key however it is spaced or parenthesized, with or without a
    message, with the sides of `==` or `!=` in either order; the text itself when it does not parse."""
    try:
        tree = ast.parse(source.strip())
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return _squeeze(source)
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        return ast.dump(tree)
    test = tree.body[0].test
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Eq, ast.NotEq)):
        sides = sorted((ast.dump(test.left), ast.dump(test.comparators[0])))
        return f"{type(test.ops[0]).__name__}:{sides[0]}:{sides[1]}"
    return ast.dump(test)


def _test_key(test: Any, test_type: str) -> Any:
    """A test's normalized form: equal keys are the same test."""
    if test_type == "assert":
        return _assert_key(test) if isinstance(test, str) else repr(test)
    if test_type == "stdin":
        return (tuple(str(test["input"]).split()), tuple(str(test["output"]).split()))
    return (tuple(_args_tokens(test["input"])), tuple(_value_tokens(test["output"])))


def _same_tokens(got: list[str], want: list[str]) -> bool:
    """A printed example's output tokens against a test's expected ones, by the judge's own rule
    (`utils.output_rule`): an example printed as `0.000000` shows the test whose output is `0.0000001234`."""
    return tokens_match(got, want)


def _starts_with(tokens: list[str], prefix: list[str]) -> bool:
    return bool(prefix) and _same_tokens(tokens[: len(prefix)], prefix)


def _printed(task: Any, test: Any, num_visible_tests: int, examples: list) -> bool:
    if task.test_type == "assert":
        return False  # decided by position in `shown_test_indices`: the prompt prints those asserts
    if task.test_type == "stdin":
        want_in, want_out = str(test["input"]).split(), str(test["output"]).split()
        return any(block.split() == want_in and _starts_with(output.split(), want_out) for block, output in examples)
    args = _args_tokens(test["input"])
    result = test["output"]
    outputs = [_value_tokens(result)]
    if isinstance(result, list) and len(result) == 1:  # Codewars wraps the result in a one-element list
        outputs.append(_value_tokens(result[0]))
    return any(got_args == args and any(_starts_with(got_out, o) for o in outputs) for got_args, got_out in examples)


def shown_test_indices(task: Any, num_visible_tests: int) -> frozenset[int]:
    """The indices of `task.tests` its prompt shows (see the module docstring)."""
    tests = list(task.tests)
    if task.test_type == "assert":
        shown = set(range(len(printed_asserts(tests, num_visible_tests))))
    else:
        examples: list = (
            example_blocks(task.problem) if task.test_type == "stdin" else _call_examples(task.problem, task.fn_name)
        )
        shown = {i for i, test in enumerate(tests) if _printed(task, test, num_visible_tests, examples)}
    keys = {_test_key(tests[i], task.test_type) for i in shown}
    return frozenset(i for i, test in enumerate(tests) if i in shown or _test_key(test, task.test_type) in keys)


def shown_tests_task(task: Any, num_visible_tests: int) -> Any | None:
    """The task restricted to its shown tests (None when it shows none): what the feedback environment runs."""
    shown = shown_test_indices(task, num_visible_tests)
    if not shown:
        return None
    return dataclasses.replace(task, tests=tuple(t for i, t in enumerate(task.tests) if i in shown), challenge_tests=())


def hidden_tests_task(task: Any, num_visible_tests: int) -> Any | None:
    """The task restricted to its hidden tests (its challenge tests kept), or None when every test is
    shown: what the training rewards score."""
    shown = shown_test_indices(task, num_visible_tests)
    if len(shown) == len(task.tests):
        return None
    return dataclasses.replace(task, tests=tuple(t for i, t in enumerate(task.tests) if i not in shown))


def shown_counts(tasks: Sequence[Any], num_visible_tests: int) -> dict[str, dict[str, int]]:
    """Per source: how many tasks show none, some or all of their tests, and the tests shown and hidden."""
    out: dict[str, dict[str, int]] = {}
    for task in tasks:
        shown = len(shown_test_indices(task, num_visible_tests))
        row = out.setdefault(
            task.source,
            {"tasks": 0, "none_shown": 0, "some_shown": 0, "all_shown": 0, "tests_shown": 0, "tests_hidden": 0},
        )
        row["tasks"] += 1
        row["none_shown" if shown == 0 else "all_shown" if shown == len(task.tests) else "some_shown"] += 1
        row["tests_shown"] += shown
        row["tests_hidden"] += len(task.tests) - shown
    return out


def no_hidden_test_ids(tasks: Sequence[Any], num_visible_tests: int) -> list[str]:
    """Tasks whose prompt shows every test: no correctness signal in training,
    and a pass@k on them is no evidence of solving (phases 1 and 4 list them)."""
    return [t.task_id for t in tasks if len(shown_test_indices(t, num_visible_tests)) == len(t.tests)]


def substring_only_counts(tasks: Sequence[Any], num_visible_tests: int) -> dict[str, dict[str, int]]:
    """Per source: the tests, those the example rule shows, and those a looser rule would also take for
    shown — the statement holds each of their texts (a stdin test's input and output, a call test's argument
    and result literals, as substrings) — but the example rule does not: the examples written in a form
    the rule does not read (prose, tables), the gap to look at. Assert tests have no such gap (the prompt
    prints them)."""
    out: dict[str, dict[str, int]] = {}
    for task in tasks:
        shown = shown_test_indices(task, num_visible_tests)
        row = out.setdefault(task.source, {"tests": 0, "example_rule": 0, "substring_only": 0})
        row["tests"] += len(task.tests)
        row["example_rule"] += len(shown)
        if task.test_type == "assert":
            continue
        text = " " + _squeeze(" ".join(_layout_free_lines(task.problem))) + " "
        literals = " " + " ".join(_literal_tokens(task.problem)) + " "
        for i, test in enumerate(task.tests):
            if i in shown:
                continue
            if task.test_type == "stdin":
                parts = [_squeeze(str(test["input"])), _squeeze(str(test["output"]))]
                found = all(part and part in text for part in parts)
            else:
                parts = [" ".join(_args_tokens(test["input"])), " ".join(_value_tokens(test["output"]))]
                found = all(part and part in literals for part in parts)
            row["substring_only"] += found
    return out
