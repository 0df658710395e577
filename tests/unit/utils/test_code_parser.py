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


# ------------------------------------------------------------------ which block is the program


def test_the_prompts_placeholder_block_is_not_graded_over_a_program():
    # the student writes its function, then copies a format example's `# your code` block after it
    answer = "```python\ndef max_of_two(a, b):\n    return max(a, b)\n```\n\n```python\n# your code\n```"
    code, source, blocks = select_code(answer)
    assert (code, source, blocks) == ("def max_of_two(a, b):\n    return max(a, b)", "python_block", 2)
    # a block of comments, `pass` or `...` only holds no program even without the entry point
    assert select_code("```python\ndef f():\n    return 1\n```\n```python\n# Your code\n\n...\n```")[0].startswith(
        "def f"
    )


def test_an_example_call_block_does_not_replace_the_solution():
    answer = (
        "```python\ndef average(numbers):\n    return sum(numbers) / len(numbers)\n```\n"
        "Example usage:\n```python\nprint(average([1, 2, 3, 4]))\n```\n"
        "```python\nassert average([2, 4]) == 3\n```"
    )
    assert (
        select_code(answer, entry_point="average")[0] == "def average(numbers):\n    return sum(numbers) / len(numbers)"
    )
    # with no entry point (a stdin program) the last program block is the answer, as before
    assert select_code(answer)[0] == "assert average([2, 4]) == 3"
    # the last block that defines the entry point wins: a corrected redefinition replaces the first draft
    two = "```python\ndef f(x):\n    return x\n```\n```python\ndef f(x):\n    return x + 1\nprint(f(2))\n```"
    assert select_code(two, entry_point="f")[0] == "def f(x):\n    return x + 1\nprint(f(2))"
    # a method of class Solution is an entry point too
    cls = "```python\nclass Solution:\n    def twoSum(self, a):\n        return a\n```\n```python\nprint(1)\n```"
    assert select_code(cls, entry_point="twoSum")[0].startswith("class Solution:")
    # no block defines it: the last program block, as without an entry point
    assert select_code("```python\nx = 1\n```\n```python\ny = 2\n```", entry_point="g")[0] == "y = 2"


def test_the_defining_block_brings_the_definitions_it_uses_from_other_blocks():
    answer = (
        "```python\nimport math\nfrom functools import reduce\n\n"
        "def is_square(n):\n    return math.isqrt(n) ** 2 == n\n"
        "print(is_square(4))\n\ndef unused():\n    return 0\n```\n"
        "```python\ndef count_squares(xs):\n    return sum(is_square(x) for x in xs)\n```\n"
        "```python\nprint(count_squares([1, 2, 4]))\n```"
    )
    code = select_code(answer, entry_point="count_squares")[0]
    # is_square and the import it uses come first; the example call and the unused helper stay out
    assert code == (
        "import math\n\ndef is_square(n):\n    return math.isqrt(n) ** 2 == n\n\n"
        "def count_squares(xs):\n    return sum(is_square(x) for x in xs)"
    )


def test_sanitized_program_keeps_the_entry_point_and_its_dependencies_only():
    from utils.code_parser import sanitize_program

    answer = (
        "Here it is:\n```python\nimport math\nLIMIT = 10\n\ndef helper(n):\n    return math.sqrt(n) < LIMIT\n\n"
        "def solve(xs):\n    return [x for x in xs if helper(x)]\n\nprint(solve([1, 400]))\nassert solve([]) == []\n"
        "if __name__ == '__main__':\n    solve([1])\n\ndef other():\n    pass\n```\n"
        "```python\nprint(solve([4]))\n```"
    )
    assert sanitize_program(answer, "solve") == (
        "import math\n\nLIMIT = 10\n\ndef helper(n):\n    return math.sqrt(n) < LIMIT\n\n"
        "def solve(xs):\n    return [x for x in xs if helper(x)]"
    )


def test_sanitized_program_recovers_a_definition_before_a_cut_example():
    from utils.code_parser import sanitize_program

    # the budget cut the example call; the function above it is whole
    cut = "```python\ndef add(a, b):\n    return a + b\n\nprint(add(1, [2, "
    assert sanitize_program(cut, "add") == "def add(a, b):\n    return a + b"
    # a function that is itself cut is no program, both ways
    assert sanitize_program("```python\ndef add(a, b):\n    return (a +", "add") is None
    # definitions split over blocks are joined, the later one of a name wins, class entry points are kept
    split = (
        "```python\ndef g():\n    return 1\n```\n```python\ndef f():\n    return g()\n```\n"
        "```python\ndef g():\n    return 2\n```"
    )
    assert sanitize_program(split, "f") == "def f():\n    return g()\n\ndef g():\n    return 2"
    cls = "```python\nclass Solution:\n    def twoSum(self, a):\n        return a\nprint(Solution().twoSum(1))\n```"
    assert sanitize_program(cls, "twoSum") == "class Solution:\n    def twoSum(self, a):\n        return a"


def test_sanitized_program_is_the_strict_one_without_an_entry_point():
    from utils.code_parser import sanitize_program

    # a stdin program is its top-level statements: nothing is dropped
    answer = "```python\nn = int(input())\nprint(n * 2)\n```"
    assert sanitize_program(answer, None) == select_code(answer)[0]
    assert sanitize_program("no code here", "f") is None
