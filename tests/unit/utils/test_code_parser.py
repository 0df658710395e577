from utils.code_parser import (
    check_syntax,
    find_code_blocks,
    find_function_names,
    looks_like_program,
    normalize_language,
    select_code,
)


def test_find_code_blocks_languages_and_closure():
    text = "```python\na = 1\n```\n```\nb\n```\n```bash\nls\n```\n```py\nc = 3"
    blocks = find_code_blocks(text)
    assert [(b.language, b.code, b.closed) for b in blocks] == [
        ("python", "a = 1", True),
        ("", "b", True),
        ("bash", "ls", True),
        ("python", "c = 3", False),
    ]


def test_indented_fences_and_dedent():
    text = "  ```python\n    def f():\n        return 1\n  ```"
    assert find_code_blocks(text)[0].code == "def f():\n    return 1"


def test_other_languages_are_never_selected():
    assert select_code("```bash\necho hi\n```") == (None, None, 1)
    assert select_code("```text\nx = 1\n```")[0] is None


def test_empty_python_block_falls_back_to_an_untagged_one():
    code, source, n = select_code("```python\n```\n```\nq = 1\n```")
    assert (code, source, n) == ("q = 1", "plain_block", 2)


def test_normalize_language():
    assert normalize_language(" Python3 ") == "python"
    assert normalize_language("python title='x.py'") == "python"
    assert normalize_language("") == ""
    assert normalize_language("JavaScript") == "javascript"


def test_check_syntax_reports_line_and_catches_compile_time_errors():
    assert check_syntax("x = 1\n") == (True, None)
    ok, err = check_syntax("x = 1\ny = (\n")
    assert not ok and err.startswith("line ")
    assert not check_syntax("return 5")[0]  # ast.parse accepts this; compile does not
    assert not check_syntax("a = 1\x00")[0]  # null byte: ValueError on some versions, SyntaxError on others


def test_looks_like_program():
    assert looks_like_program("import sys\nprint(sys.stdin.read())")
    assert looks_like_program("print(1)")
    assert not looks_like_program("hello")
    assert not looks_like_program("42")
    assert not looks_like_program("This is prose.")
    assert looks_like_program("@cache\ndef f(n):\n    return n\nx, y = f(1), 2\nresult[0] += 1")
    assert not looks_like_program("# only a comment\n'a string'")
    assert not looks_like_program("Here is the code:\nprint(1)")  # text is read, never compiled


def test_function_names_and_entry_points():
    code = (
        "import os\ndef a():\n    pass\nclass Solution:\n    def twoSum(self, x):\n        pass\n"
        "async def b():\n    pass"
    )
    assert find_function_names(code) == ["a", "Solution.twoSum", "b"]
    assert find_function_names("def broken(:") == []
