"""The judge's verdict is Python's own: what `assert out == expected` in one process says, computed on
values that crossed the process boundary as tagged data (`sandbox.protocol`), with no object of the
program in the judging process. Types whose equality depends on the type travel with it."""

from __future__ import annotations

import sys

import pytest

from sandbox.executor import execute_program
from sandbox.protocol import decode_value, encode_value
from tests.task_factory import assert_task

IMPORTS = ("import math", "import numpy as np", "from decimal import Decimal", "from fractions import Fraction")


def verdict(pool, body: str, test: str) -> bool:
    task = assert_task("t/eq", "f", test, test_imports=IMPORTS)
    program = "import math\nimport numpy as np\nfrom decimal import Decimal\nfrom fractions import Fraction\n"
    result = execute_program(program + f"def f():\n    return {body}\n", task, pool=pool)
    assert result.status in ("passed", "wrong_answer"), (result.status, result.error)
    return result.passed


@pytest.mark.parametrize(
    ("body", "test"),
    [
        ("Decimal('1.5')", "assert f() == Decimal('1.5')"),
        ("Decimal('1.5')", "assert f() == 1.5"),
        ("Fraction(1, 3)", "assert f() == Fraction(1, 3)"),
        ("bytearray(b'ab')", "assert f() == b'ab'"),
        ("memoryview(b'ab')", "assert f() == b'ab'"),
        ("{1: 'a', 2: 'b'}.keys()", "assert f() == {1, 2}"),
        ("{1: 'a'}.items()", "assert f() == {(1, 'a')}"),
        ("np.float32(0.5)", "assert f() == 0.5"),
        ("np.float32(0.1)", "assert f() == np.float32(0.1)"),
        ("[math.nan]", "assert f() == [math.nan]"),
        ("np.int64(7)", "assert f() in {7, 8}"),
    ],
)
def test_correct_answers_of_standard_types_pass(pool, body, test):
    assert verdict(pool, body, test)


@pytest.mark.parametrize(
    ("body", "test"),
    [
        ("np.array([1, 2])", "assert f() == [1, 2]"),  # Python: ambiguous truth value (ValueError)
        ("np.bool_(True)", "assert f() is True"),
        ("{1: 'a'}.values()", "assert f() == ['a']"),
        ("{1: 'a'}.keys()", "assert f() == [1]"),
        ("np.float32(0.1)", "assert f() == 0.1"),
        ("Decimal('0.1')", "assert f() == 0.1"),
    ],
)
def test_answers_python_rejects_fail(pool, body, test):
    assert not verdict(pool, body, test)


def test_a_one_element_array_compares_like_numpy(pool):
    assert verdict(pool, "np.array([5])", "assert f() == [5]")


def test_the_codec_keeps_the_type_and_the_judge_imports_no_numpy():
    import numpy as np

    already = "numpy" in sys.modules
    decoded = decode_value(encode_value([np.float32(0.5), np.array([[1, 2]], dtype=np.int32)]))
    assert decoded[0] == 0.5 and decoded[0].dtype == "float32"
    assert decoded[1].shape == (1, 2) and decoded[1].dtype == "int32"
    with pytest.raises(ValueError):
        bool(decoded[1] == [[1, 2]])
    assert already or "numpy" not in sys.modules


def test_an_array_is_truthy_only_with_one_element(pool):
    assert verdict(pool, "np.array([1])", "assert f()")
    assert not verdict(pool, "np.array([1, 1])", "assert f()")  # numpy: ambiguous truth value
