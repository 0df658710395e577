"""The judge's verdict is Python's own: what `assert out == expected` in one process says, computed on
values that crossed the process boundary as tagged data (`sandbox.protocol`), with no object of the
program in the judging process. Types whose equality depends on the type travel with it."""

from __future__ import annotations

import sys

import pytest

from sandbox.executor import execute_program
from sandbox.protocol import decode_value, encode_value
from tests.task_factory import assert_task

IMPORTS = (
    "import math",
    "import numpy as np",
    "from decimal import Decimal",
    "from fractions import Fraction",
    "import datetime",
    "from collections import deque, OrderedDict, Counter",
    "from array import array",
    "from types import SimpleNamespace",
)


def verdict(pool, body: str, test: str) -> bool:
    task = assert_task("t/eq", "f", test, test_imports=IMPORTS)
    program = "\n".join(IMPORTS) + "\n"
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
        # numpy 2's weak scalars: a Python number takes the numpy scalar's precision
        ("np.float32(0.1)", "assert f() == 0.1"),
        ("np.float16(0.1)", "assert f() == 0.1"),
        ("[np.float32(0.1)]", "assert f() == [0.1]"),
        ("np.array([0.1, 0.2], dtype=np.float32)", "assert f()[0] == 0.1"),
        ("datetime.date(2020, 1, 2)", "assert f() == datetime.date(2020, 1, 2)"),
        ("datetime.datetime(2020, 1, 2, 3, 4, 5, 6)", "assert f() == datetime.datetime(2020, 1, 2, 3, 4, 5, 6)"),
        ("datetime.timedelta(hours=25)", "assert f() == datetime.timedelta(days=1, hours=1)"),
        ("datetime.time(3, 4)", "assert f() == datetime.time(3, 4)"),
        ("deque([1, 2])", "assert f() == deque([1, 2])"),
        ("array('i', [1, 2])", "assert f() == array('i', [1, 2])"),
        ("array('d', [0.5])", "assert f() == array('f', [0.5])"),
        ("SimpleNamespace(a=1, b=[2])", "assert f() == SimpleNamespace(a=1, b=[2])"),
        ("np.datetime64('2020-01-01')", "assert f() == np.datetime64('2020-01-01T00:00')"),
        ("np.datetime64('2020-01-01')", "assert f() == datetime.date(2020, 1, 1)"),
        ("np.timedelta64(1, 'D')", "assert f() == np.timedelta64(24, 'h')"),
        ("np.array(['2020-01-01'], dtype='datetime64[D]')", "assert f() == np.datetime64('2020-01-01')"),
        ("OrderedDict([('a', 1), ('b', 2)])", "assert f() == OrderedDict([('a', 1), ('b', 2)])"),
        ("OrderedDict([('a', 1), ('b', 2)])", "assert f() == {'b': 2, 'a': 1}"),
        ("Counter(a=1, b=0)", "assert f() == Counter(a=1)"),  # a Counter's own equality: zero counts are absent
        ("np.zeros(1_100_000, dtype=np.int8)", "assert f() is not None"),  # bounded by bytes, not items
        ("np.array([[1, 2], [3, 4]], dtype=np.int16)", "assert f()[1][0] == 3"),
        (
            "np.array([(1, 2.5)], dtype=[('a', 'i4'), ('b', 'f8')])",
            "assert f() == np.array([(1, 2.5)], dtype=[('a', 'i4'), ('b', 'f8')])",
        ),
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
        ("np.float32(0.1)", "assert f() == np.float16(0.1)"),  # two numpy scalars: the wider type, exact
        ("np.array([0.1], dtype=np.float32)", "assert f() == [0.1]"),  # a list is a float64 array: not weak
        ("Decimal('0.1')", "assert f() == 0.1"),
        ("OrderedDict([('a', 1), ('b', 2)])", "assert f() == OrderedDict([('b', 2), ('a', 1)])"),
        ("deque([1, 2])", "assert f() == [1, 2]"),
        ("array('i', [1, 2])", "assert f() == [1, 2]"),
        ("datetime.date(2020, 1, 1)", "assert f() == datetime.datetime(2020, 1, 1)"),
        ("datetime.date(2020, 1, 1)", "assert f() == datetime.date(2020, 1, 2)"),
        ("np.datetime64('NaT')", "assert f() == np.datetime64('NaT')"),
        ("np.datetime64('2020-01-02')", "assert f() == np.datetime64('2020-01-01')"),
        ("SimpleNamespace(a=1)", "assert f() == {'a': 1}"),
        ("Counter(a=2)", "assert f() == Counter(a=1)"),
        ("np.zeros(3, dtype=np.int8)", "assert f() == np.zeros(4, dtype=np.int8)"),  # shapes do not broadcast
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
