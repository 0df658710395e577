"""Loaders: every schema variant to the documented task record, on fixtures, tmp files and real data."""

import json

import pytest

from tests.conftest import SHARED_DATA
from utils.dataset_loader import (
    EMBEDDED_APPS,
    EMBEDDED_MBPP,
    DataFormatError,
    Task,
    entry_point_from_asserts,
    load_apps,
    load_mbpp,
    read_tasks,
    split_tasks,
    write_tasks,
)

FULL_ROW = {
    "text": "Write a function to add.",
    "code": "def add(a, b):\r\n\treturn a + b",
    "task_id": 7,
    "test_setup_code": "",
    "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(2, 2) == 4"],
    "challenge_test_list": ["assert add(10, 10) == 20"],
}
SANITIZED_ROW = {
    "prompt": "Write a function to add.",
    "code": "import math\ndef add(a, b):\n    return a + b",
    "task_id": 8,
    "test_imports": ["import math"],
    "test_list": ["assert math.isclose(add(1, 2), 3)"],
}
STDIN_ROW = {
    "problem_id": 5,
    "question": "Echo",
    "solutions": json.dumps(["print(input())"]),
    "input_output": json.dumps({"inputs": ["a\n", ["b", "c"]], "outputs": ["a\n", ["b"]]}),
    "difficulty": "introductory",
    "url": "u",
    "starter_code": "",
}
CALL_ROW = {
    "problem_id": 6,
    "question": "Pattern",
    "solutions": json.dumps(["class Solution:\n    def f(self, a):\n        return a"]),
    "input_output": json.dumps({"fn_name": "f", "inputs": [['"abba"'], [[1, 2]]], "outputs": [True, [[1, 2]]]}),
    "difficulty": "interview",
    "url": "",
    "starter_code": "\nclass Solution:\n    def f(self, a: List[int]) -> bool:\n        ",
}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_mbpp_full_schema(tmp_path):
    tasks, report = load_mbpp(write_jsonl(tmp_path / "m.jsonl", [FULL_ROW]))
    (t,) = tasks
    assert t.task_id == "mbpp/7" and t.source == "mbpp" and t.test_type == "assert" and t.difficulty == "basic"
    assert t.problem == "Write a function to add." and t.fn_name == "add"
    assert t.tests == tuple(FULL_ROW["test_list"]) and t.challenge_tests == ("assert add(10, 10) == 20",)
    assert t.reference_solutions == ("def add(a, b):\r\n\treturn a + b",)  # CRLF and tabs kept
    assert t.metadata == {"original_id": 7, "schema": "full", "original_split": "prompt"}
    assert report.kept == 1 and report.rows == 1


def test_mbpp_sanitized_schema(tmp_path):
    (t,), _ = load_mbpp(write_jsonl(tmp_path / "s.jsonl", [SANITIZED_ROW]))
    assert t.problem == "Write a function to add." and t.test_imports == ("import math",)
    assert t.fn_name == "add"  # not `isclose`: the first called name the solution defines
    assert t.metadata["schema"] == "sanitized"


def test_mbpp_json_array_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.json").write_text(json.dumps([FULL_ROW, SANITIZED_ROW]))
    assert [t.task_id for t in load_mbpp(tmp_path / "a.json")[0]] == ["mbpp/7", "mbpp/8"]
    pq.write_table(pa.Table.from_pylist([FULL_ROW]), tmp_path / "a.parquet")
    assert load_mbpp(tmp_path / "a.parquet")[0][0] == load_mbpp(tmp_path / "a.json")[0][0]


def test_apps_stdin_lists_of_lines_are_joined(tmp_path):
    (t,), _ = load_apps(write_jsonl(tmp_path / "a.jsonl", [STDIN_ROW]))
    assert t.task_id == "apps/5" and t.test_type == "stdin" and t.fn_name is None
    assert t.tests == ({"input": "a\n", "output": "a\n"}, {"input": "b\nc\n", "output": "b\n"})
    assert t.reference_solutions == ("print(input())",) and t.metadata["url"] == "u"


def test_apps_call_based_with_class_solution_starter(tmp_path):
    (t,), _ = load_apps(write_jsonl(tmp_path / "a.jsonl", [CALL_ROW]))
    assert t.test_type == "call" and t.fn_name == "f" and t.starter_code.startswith("\nclass Solution:")
    # arguments stay argument lists; expected values are kept as stored (wrapping handled by the sandbox)
    assert t.tests[0] == {"input": ['"abba"'], "output": True}
    assert t.tests[1] == {"input": [[1, 2]], "output": [[1, 2]]}


def test_apps_rows_without_usable_tests_are_skipped_and_counted(tmp_path):
    bad = [
        dict(STDIN_ROW, problem_id=1, input_output=""),
        dict(STDIN_ROW, problem_id=2, input_output="{not json"),
        dict(STDIN_ROW, problem_id=3, input_output=json.dumps({"inputs": ["1"], "outputs": []})),
        dict(STDIN_ROW, problem_id=4, input_output=json.dumps({"inputs": ["1", "2"], "outputs": ["1"]})),
        dict(STDIN_ROW, problem_id=9, difficulty="competition"),
        STDIN_ROW,
    ]
    tasks, report = load_apps(write_jsonl(tmp_path / "a.jsonl", bad), difficulty="introductory")
    assert [t.task_id for t in tasks] == ["apps/5"]
    assert report.skipped == {
        "no tests": 2,
        "input_output is not valid JSON": 1,
        "inputs and outputs differ in length": 1,
        "difficulty is not introductory": 1,
    }
    assert report.rows == 6 and report.kept == 1


@pytest.mark.parametrize(
    "content, suffix, message",
    [
        (None, ".jsonl", r"missing\.jsonl: file not found"),
        ("a,b\n1,2\n", ".csv", r"unsupported file type '\.csv'. Use one of: \.jsonl, \.json, \.parquet"),
        (json.dumps(FULL_ROW) + '\n{"text": oops}\n', ".jsonl", r"bad\.jsonl:2: malformed JSON"),
        (
            json.dumps({"code": "x", "task_id": 1}) + "\n",
            ".jsonl",
            r"bad\.jsonl:1: missing required field\(s\) test_list, text for the MBPP full schema",
        ),
        ("not parquet", ".parquet", r"unreadable parquet file"),
    ],
)
def test_bad_mbpp_input_names_file_and_line(tmp_path, content, suffix, message):
    path = tmp_path / (("missing" if content is None else "bad") + suffix)
    if content is not None:
        path.write_text(content)
    with pytest.raises(DataFormatError, match=message):
        load_mbpp(path)


def test_bad_apps_row_names_its_line(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [STDIN_ROW, {"problem_id": 3, "question": "q"}])
    with pytest.raises(DataFormatError, match=r"a\.jsonl:2: missing required field\(s\) input_output"):
        load_apps(path)


def test_task_record_round_trip_and_validation(tmp_path):
    tasks = load_mbpp(EMBEDDED_MBPP)[0] + load_apps(EMBEDDED_APPS)[0]
    write_tasks(tmp_path / "t.jsonl", tasks)
    assert read_tasks(tmp_path / "t.jsonl") == tasks
    (tmp_path / "bad.jsonl").write_text(
        json.dumps({"task_id": "x", "source": "s", "problem": "p", "test_type": "exec", "tests": []}) + "\n"
    )
    with pytest.raises(DataFormatError, match=r"bad\.jsonl:1: not a valid task record: test_type must be one of"):
        read_tasks(tmp_path / "bad.jsonl")
    with pytest.raises(ValueError, match="call-style task needs fn_name"):
        Task(task_id="a/1", source="a", problem="p", test_type="call", tests=())


def test_embedded_fixtures_meet_the_spec():
    mbpp, _ = load_mbpp(EMBEDDED_MBPP)
    apps, _ = load_apps(EMBEDDED_APPS)
    assert len(mbpp) >= 40 and all(len(t.tests) == 3 and t.reference_solutions and t.fn_name for t in mbpp)
    assert any(t.test_setup_code for t in mbpp) and any(t.challenge_tests for t in mbpp)
    assert len(apps) >= 20 and all(len(t.tests) >= 3 and t.reference_solutions for t in apps)
    kinds = {(t.test_type, "class Solution" in t.starter_code) for t in apps}
    assert {("stdin", False), ("call", True), ("call", False)} <= kinds
    assert any(
        isinstance(t.tests[0]["output"], list) and len(t.tests[0]["output"]) == 1 for t in apps if t.test_type == "call"
    )
    assert {t.difficulty for t in apps} == {"introductory", "interview", "competition"}


def test_entry_point_from_asserts():
    assert entry_point_from_asserts(["assert set(similar(a, b)) == set((4, 5))"]) == "similar"
    assert (
        entry_point_from_asserts(["assert math.isclose(area(2), 12.56, rel_tol=0.01)"], "def area(r): pass") == "area"
    )
    assert entry_point_from_asserts(["assert sorted(x) == [1]"]) is None


def test_split_is_deterministic_disjoint_stratified_and_order_independent():
    tasks = load_mbpp(EMBEDDED_MBPP)[0] + load_apps(EMBEDDED_APPS)[0]
    apps = [t for t in tasks if t.source == "apps"]
    train, val = split_tasks(apps, 0.2, seed=42)
    assert (train, val) == split_tasks(list(reversed(apps)), 0.2, seed=42)
    assert not {t.task_id for t in train} & {t.task_id for t in val}
    assert len(train) + len(val) == len(apps) and len(val) == round(len(apps) * 0.2)
    assert {t.difficulty for t in val} >= {"introductory", "interview"}
    other = split_tasks(apps, 0.2, seed=7)[1]
    assert [t.task_id for t in other] != [t.task_id for t in val]


@pytest.mark.parametrize("n, ratio", [(2, 0.2), (5, 0.2), (10, 0.5), (974, 0.2), (153, 0.2)])
def test_split_sizes_within_one(n, ratio):
    tasks = [
        Task(
            task_id=f"x/{i}",
            source="x",
            problem="p",
            test_type="assert",
            tests=("assert f(1) == 1",),
            difficulty=("a", "b", "c")[i % 3],
        )
        for i in range(n)
    ]
    train, val = split_tasks(tasks, ratio, seed=1)
    assert abs(len(val) - n * ratio) <= 1 and len(train) >= 1 and len(val) >= 1


def test_hub_paths_use_the_right_ids(monkeypatch):
    """The hub branch cannot run here (no network): check what it asks the hub for."""
    import datasets
    import huggingface_hub

    calls = []

    class FakeDatasetDict(dict):
        pass

    def fake_load_dataset(name, config):
        calls.append(("load_dataset", name, config))
        return FakeDatasetDict(
            test=datasets.Dataset.from_list([FULL_ROW]), train=datasets.Dataset.from_list([dict(FULL_ROW, task_id=700)])
        )

    def fake_download(repo_id, filename, repo_type):
        calls.append(("hf_hub_download", repo_id, filename, repo_type))
        return str(EMBEDDED_APPS)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    mbpp, report = load_mbpp(None, "sanitized")
    assert {t.task_id for t in mbpp} == {"mbpp/7", "mbpp/700"} and "google-research-datasets/mbpp" in report.origin
    apps, _ = load_apps(None, "test")
    assert apps[0].task_id.startswith("apps/test-")
    assert calls == [
        ("load_dataset", "google-research-datasets/mbpp", "sanitized"),
        ("hf_hub_download", "codeparrot/apps", "test.jsonl", "dataset"),
    ]


real = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/data not present")


@real
def test_real_mbpp_loads_completely():
    tasks, report = load_mbpp(SHARED_DATA / "mbpp.jsonl")
    assert report.rows == 974 and report.kept == 974 and not report.skipped
    from utils.code_parser import find_function_names

    # the entry point is always a function the reference solution defines
    names = [find_function_names(t.reference_solutions[0]) for t in tasks]
    assert all(t.fn_name in found or f"Solution.{t.fn_name}" in found for t, found in zip(tasks, names, strict=True))
    by_id = {t.metadata["original_id"]: t for t in tasks}
    assert by_id[367].test_setup_code.startswith("root = Node(1)")
    assert sum(1 for t in tasks if t.challenge_tests) == 11
    assert "\r\n" in by_id[1].reference_solutions[0]
    assert sum(1 for t in tasks if t.metadata["original_split"] == "test") == 500


@real
def test_real_apps_sample_loads_with_its_quirks():
    tasks, report = load_apps(SHARED_DATA / "apps_sample.jsonl")
    assert report.kept == 153
    by_id = {t.metadata["original_id"]: t for t in tasks}
    assert sum(t.test_type == "call" for t in tasks) == 13
    assert by_id[4184].tests[0] == {"input": [1], "output": [False]}  # Codewars one-element wrapping
    assert by_id[2401].fn_name == "wordPattern" and "class Solution" in by_id[2401].starter_code
    assert by_id[2401].tests[0]["input"] == ['"abba"', '"dog cat cat dog"']  # LeetCode literal quotes kept
    assert sum(len(t.tests) for t in tasks) == 971
    assert all(isinstance(tc["input"], str) for t in tasks if t.test_type == "stdin" for tc in t.tests)


VALID = {
    "task_id": "u/1",
    "source": "user",
    "problem": "Add two numbers.",
    "test_type": "assert",
    "tests": ["assert add(1, 2) == 3"],
    "fn_name": "add",
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tests": ["add(1, 2) == 4"]}, r"tests\[0\] 'add\(1, 2\) == 4' is not an assert statement.*write 'assert add"),
        ({"tests": []}, "tests is empty"),
        ({"tests": "assert add(1, 2) == 3"}, "tests must be a list, got str"),
        ({"tests": ["assert True"]}, "asserts a constant"),
        ({"tests": ["assert add(1, 2) =="]}, "is not valid Python"),
        ({"test_type": "stdin", "tests": [{"stdin": "1 2", "output": "3"}]}, "exactly the keys 'input' and 'output'"),
        ({"test_type": "stdin", "tests": [{"input": ["1", "2"], "output": "3"}]}, "must be strings"),
        ({"test_type": "call", "tests": [{"input": 1, "output": 3}]}, "must be the list of arguments"),
        ({"fn_name": "add numbers"}, "fn_name must be a Python identifier"),
        ({"task_id": ""}, "task_id must not be empty"),
    ],
)
def test_user_task_files_are_validated_with_file_and_line(tmp_path, change, message):
    """A task whose tests cannot fail (no assert, no tests, one 'test' per character) is an error, never a pass."""
    path = write_jsonl(tmp_path / "mine.jsonl", [VALID, {**VALID, "task_id": "u/2", **change}])
    with pytest.raises(DataFormatError, match=r"mine\.jsonl:2: not a valid task record: .*" + message):
        read_tasks(path)


def test_duplicate_task_ids_in_a_task_file_are_an_error(tmp_path):
    path = write_jsonl(tmp_path / "mine.jsonl", [VALID, VALID])
    with pytest.raises(DataFormatError, match=r"mine\.jsonl:2: task_id 'u/1' already used on line 1"):
        read_tasks(path)


def test_mbpp_rows_with_malformed_tests_name_their_line(tmp_path):
    path = write_jsonl(
        tmp_path / "m.jsonl", [FULL_ROW, {**FULL_ROW, "task_id": 9, "test_list": "assert add(1, 2) == 3"}]
    )
    with pytest.raises(DataFormatError, match=r"m\.jsonl:2: test_list must be a list of strings, got str"):
        load_mbpp(path)
    path = write_jsonl(tmp_path / "m.jsonl", [FULL_ROW, {**FULL_ROW, "task_id": 9, "test_list": ["add(1, 2) == 3"]}])
    with pytest.raises(DataFormatError, match=r"m\.jsonl:2: tests\[0\] 'add\(1, 2\) == 3' is not an assert statement"):
        load_mbpp(path)


@pytest.mark.parametrize(
    "test",
    ["assert 1 == 1", "assert f(1) == 2 or True", "assert len([1, 2]) == 2", "assert f(1) == 2 and math.pi > 3 or 1"],
)
def test_a_test_whose_verdict_does_not_depend_on_the_program_is_refused(tmp_path, test):
    row = {"task_id": "t/1", "source": "t", "problem": "p", "test_type": "assert", "fn_name": "f", "tests": [test]}
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataFormatError, match=r"tasks\.jsonl:1: .*does not depend on the program"):
        read_tasks(path)


@pytest.mark.parametrize(
    "test", ["assert f(1) == 2 and True", "assert f(1) == 2 or False", "assert not (f(1) != 2 and 1)"]
)
def test_a_literal_that_only_repeats_the_verdict_is_accepted(tmp_path, test):
    """`and True` / `or False` leave the verdict to the program: only a deciding literal makes it constant."""
    row = {"task_id": "t/1", "source": "t", "problem": "p", "test_type": "assert", "fn_name": "f", "tests": [test]}
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(row) + "\n")
    assert read_tasks(path)[0].tests == (test,)
