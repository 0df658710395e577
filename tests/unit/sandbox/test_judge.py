"""Planning and judging without processes: the comparison rules, the assert planner, the codec."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sandbox.judge import call_output_matches, check_value, judge, plan_assert, plan_tests, stdout_matches
from sandbox.protocol import Opaque, decode_value, encode_value
from tests.conftest import ROOT
from tests.task_factory import assert_task


@pytest.mark.parametrize(
    "actual, expected",
    [
        ("3\n", "3"),
        ("3", "3\n\n"),
        ("1 2 \n3  \n", "1 2\n3"),
        ("1 2\r\n3\r\n", "1 2\n3\n"),
        ("0.3333333", "0.333333333"),
        ("1000", "1e3"),  # an expected float token keeps its tolerance
        ("1000000007.0000001", "1000000007.0"),
        ("-0", "0"),
        ("+007", "7"),
        ("YES\n", "YES"),
        ("4 5 2 3 1\n", "4 5 2 3 1 "),
    ],
)
def test_stdout_accepted(actual, expected):
    assert stdout_matches(actual, expected)


@pytest.mark.parametrize(
    "actual, expected",
    [
        ("2 1", "1 2"),  # order matters (the APPS harness's token-set fallback would accept this)
        ("1 1 2", "1 2"),  # multiplicity matters
        ("3.001", "3"),
        ("yes", "YES"),
        ("", "0"),
        ("12", "1 2"),
        ("nan", "0"),
    ],
)
def test_stdout_rejected(actual, expected):
    assert not stdout_matches(actual, expected)


@pytest.mark.parametrize(
    "actual, expected",
    [
        # an expected integer is matched only by an equal integer token: no float spelling brings the
        # relative tolerance back (1e9 is within 1e-5 of 1000000007), nor the absolute one (1e-9 ~ 0)
        ("1000000000.0", "1000000007"),
        ("1e9", "1000000007"),
        ("1_000_000_000", "1000000007"),
        ("1_000_000_007", "1000000007"),
        ("1e-9", "0"),
        ("0.0", "0"),
        ("1e3", "1000"),
        ("1000.0", "1000"),
        ("inf", "1000000007"),
        # a float token written with separators is not a number a program prints by accident
        ("1_0.5", "10.5"),
        # nor one in other digits (float() reads any Unicode digit), nor one that overflows to inf
        ("\uff13.\uff15", "3.5"),
        ("\u0663", "3"),
        ("1e999", "1e400"),
    ],
)
def test_stdout_integer_expected_needs_an_integer_token(actual, expected):
    assert not stdout_matches(actual, expected)


def test_call_output_normalization():
    assert call_output_matches((1, 2), [1, 2])  # tuple -> list
    assert call_output_matches([(1, 2), (3, 4)], [[1, 2], [3, 4]])
    assert call_output_matches(False, [False])  # Codewars one-element wrapping
    assert call_output_matches([1], [[1]])
    assert call_output_matches({1: "a"}, {"1": "a"})  # JSON turned int keys into strings
    assert not call_output_matches([1, 2], [[1, 2], [3]])
    assert not call_output_matches("1", 1)
    assert not call_output_matches(Opaque("X"), [1])


@pytest.mark.parametrize(
    "source, check, expected, trusted",
    [
        ("assert f(1) == 3", "eq", 3, True),
        ("assert f(1)==(4, 5)", "eq", (4, 5), True),
        ("assert set(f(1)) == set((4, 5))", "eq", {4, 5}, True),
        ("assert 3 == f(1)", "eq", 3, True),
        ("assert f(1) != 2", "ne", 2, True),
        ("assert f(1) in [1, 2]", "in", [1, 2], True),
        ("assert f(1) is None", "is", None, True),
        ("assert not f(1)", "falsy", None, True),
        ("assert f(1)", "truthy", None, True),
        ("assert math.isclose(f(2), 12.56, rel_tol=0.001)", "isclose", 12.56, True),
        ("assert f(1) == 1,0", "eq", 1, True),  # MBPP 362: parses as an assert with a message
        ("assert f(x) == sys.getsizeof(x)", "tree", None, True),  # MBPP 596: sys.getsizeof runs program-free
        ("assert f(root) == Node(1)", "tree", None, True),  # both leaves need the program: compared here
        ("assert all(f(x) == y for x, y in z)", "exec_ok", None, False),  # a comparison inside a leaf
        ("x = 1", "exec_ok", None, False),
    ],
)
def test_plan_assert(source, check, expected, trusted):
    plan = plan_assert(source)
    assert (plan.check, plan.trusted) == (check, trusted)
    if trusted and check != "tree":
        assert plan.expected == expected and plan.worker_test["kind"] == "expr"
        # the worker gets only the side that calls the candidate, never the expected value
        assert plan.worker_test["src"] in ("f(1)", "set(f(1))", "f(2)")


def test_leaves_that_need_no_program_are_computed_apart_from_it():
    # a leaf of builtins, standard modules and the test's imports goes to the program-free
    # process; a leaf that names the program's function (or anything else) to the program's process
    plan = plan_assert("assert f((1, 2)) == sys.getsizeof((1, 2)) + len(list(range(3)))", frozenset({"f"}))
    assert plan.worker_test["src"] == "(f((1, 2)), )"
    assert plan.reference_test == {"kind": "expr", "src": "(sys.getsizeof((1, 2)), range(3), )"}  # list() runs here
    assert check_value(plan, (59,), (56, [0, 1, 2])) and not check_value(plan, (59,), (57, [0, 1, 2]))
    assert not check_value(plan, (59,), Opaque("reference not computed"))
    # a name the program defines is never taken for a builtin or module of the same name
    shadowed = plan_assert("assert f(1) == len(range(3))", frozenset({"f", "range"}))
    assert shadowed.reference_test is None and shadowed.worker_test["src"] == "(f(1), range(3), )"
    from_imports = plan_assert("assert f(1) == pi", frozenset({"f"}), frozenset({"pi"}))
    assert from_imports.reference_test == {"kind": "expr", "src": "(pi, )"}


def test_check_value_is_plain_python_equality_on_decoded_data():
    eq = plan_assert("assert f(1) == (4, 5)")
    assert check_value(eq, (4, 5)) and not check_value(eq, [4, 5])  # tuple vs list, as Python
    assert check_value(plan_assert("assert f(1) == 1.0"), 1)
    assert not check_value(plan_assert("assert f(1) != 2"), Opaque("X"))
    assert check_value(plan_assert("assert math.isclose(f(2), 12.56, rel_tol=0.001)"), 12.5601)
    assert not check_value(plan_assert("assert math.isclose(f(2), 12.56)"), True)
    roundtrip = decode_value(json.loads(json.dumps(encode_value({(1, 2): {3, 4}, "k": [1.5, None]}))))
    assert roundtrip == {(1, 2): {3, 4}, "k": [1.5, None]}


def test_judge_a_canned_reply_without_any_process():
    task = assert_task("t/j", "f", "assert f(1) == 2", "assert f(2) == 4 and f(3) == 6", "assert f(0) == 0")
    planned = plan_tests(task)
    # the job carries only what the program must evaluate: no expected value appears in it
    assert "2" not in json.dumps(planned.job["tests"][0]) and "== 4" not in json.dumps(planned.job)
    reply = [
        {"status": "ok", "value": encode_value(2), "time": 0.01},
        {"status": "ok", "value": encode_value((4, 7)), "time": 0.01},
        {"status": "timeout", "error": "time limit exceeded", "time": 1.0},
    ]
    outcomes = judge(planned, reply, mode_is_call=False)
    assert [(o.passed, o.status) for o in outcomes] == [(True, "passed"), (False, "wrong_answer"), (False, "timeout")]


def test_the_judging_side_never_imports_the_worker():
    # the parent shares only the wire format with the untrusted side, never the worker's code
    worker_side = ["sandbox.worker", "sandbox.supervisor", "sandbox.zygote", "sandbox.harness", "sandbox.isolation"]
    probe = f"import sys; import sandbox.executor; print([m for m in {worker_side!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_value_codec_edge_cases_round_trip_exactly():
    # type confusion in the codec; what comes back is what Python would compare
    from sandbox.protocol import ValueTooLarge, encode_json

    cases = [-0.0, True, 1, 7**6000, -(7**6000), range(2, 9, 3), [0.5] * 40 + [-0.0], [1, True, None, "é\x00"] * 10]
    for value in cases:
        back = decode_value(encode_value(value))
        assert back == value and type(back) is type(value)
        assert type(value) is int or repr(back) == repr(value)  # -0.0 stays -0.0 (repr refuses huge ints)
    assert [type(x) for x in decode_value(encode_value([1, True] * 20))] == [int, bool] * 20  # bool stays bool
    nan = decode_value(encode_value([float("nan")] * 40))
    assert all(x != x for x in nan)  # NaN is tagged (json.dumps would write a bare NaN) and equals nothing
    assert encode_json(list(range(100))) == json.dumps(list(range(100)))  # the C fast path writes the same text
    with pytest.raises(ValueTooLarge):
        encode_json(["x" * 100] * 100, limit=5000)


# ------------------------------------------------------------------------------------------
# the judging process's cost is bounded whatever values a program returns
# ------------------------------------------------------------------------------------------

_P61 = (1 << 61) - 1  # CPython's int hash is n mod 2**61 - 1: these ints all hash alike
COLLIDING = [k * _P61 + 5 for k in range(1, 28_001)]


DISTINCT = list(range(1, 28_001))  # as many ints, each its own hash: the cost of honest values


def _cpu_seconds(fn):
    """The least CPU time of three calls of fn, the collector paused: what the call itself costs."""
    import gc
    import time

    costs = []
    for _ in range(3):
        gc.collect()
        gc.disable()
        try:
            start = time.process_time()
            fn()
            costs.append(time.process_time() - start)
        finally:
            gc.enable()
    return min(costs)


def _costs_like_honest_values(colliding_cost: float, honest_cost: float) -> bool:
    # a ratio against the same work on distinct values, measured in the same process: hashing the
    # colliding values into a table costs ~100x that (n**2 comparisons), the bound's linear pass ~1x
    return colliding_cost < 5 * honest_cost + 0.02


@pytest.mark.parametrize(
    "encode",
    [
        lambda ints: {"__t": "set", "v": ints},
        lambda ints: {"__t": "frozenset", "v": ints},
        lambda ints: {"__t": "dict", "v": [[k, 0] for k in ints]},
        lambda ints: {"__t": "set", "v": [{"__t": "tuple", "v": [k]} for k in ints]},
    ],
    ids=["set", "frozenset", "dict", "set-of-tuples"],
)
def test_decoding_colliding_hashes_has_a_bounded_cost(encode):
    # ~7 s of judge CPU for these 28,000 elements when each was hashed into a set or dict
    colliding, honest = json.loads(json.dumps(encode(COLLIDING))), json.loads(json.dumps(encode(DISTINCT)))
    value = decode_value(colliding)
    assert isinstance(value, Opaque)  # no table was built of them, and it equals nothing it should not
    assert value != set(COLLIDING[:3])
    assert type(decode_value(honest)) is not Opaque  # honest values of the same shape still decode
    cost = _cpu_seconds(lambda: decode_value(colliding)), _cpu_seconds(lambda: decode_value(honest))
    assert _costs_like_honest_values(*cost), cost


def test_ordinary_sets_and_dicts_still_decode_exactly():
    value = {(1, 2): {3, 4}, "k": frozenset({1.5, None}), 7: {8: [9]}}
    assert decode_value(encode_value(value)) == value
    assert decode_value(encode_value(set(range(100_000)))) == set(range(100_000))


def test_the_tree_evaluator_hashes_no_colliding_values():
    for source in ("assert len(set(f(1))) == 28000 and True", "assert len(frozenset(f(1))) == 1 and True"):
        plan = plan_assert(source)
        assert plan.check == "tree"
        cost = (
            _cpu_seconds(lambda: check_value(plan, (COLLIDING,))),  # noqa: B023 - called at once
            _cpu_seconds(lambda: check_value(plan, (DISTINCT,))),  # noqa: B023 - called at once
        )
        assert _costs_like_honest_values(*cost), cost
    assert check_value(plan_assert("assert len(set(f(1))) == 3 and True"), ([1, 2, 3, 3],))
    assert check_value(plan_assert("assert dict(f(1)) == {1: 2} and True"), ([[1, 2]],))


@pytest.mark.parametrize(
    "source, leaf",
    [
        ("assert f(1) % ('x',) == 'x' and True", "%s"),  # printf formatting ("%999999999d": +380 MiB here)
        ("assert f(1) * 3 == 'xxx' and True", "x"),
        ("assert f(1) + [1] == [1] and True", []),
        ("assert f(1) - 1 == 0 and True", Opaque("X")),
    ],
)
def test_tree_arithmetic_takes_numbers_only(source, leaf):
    plan = plan_assert(source)
    assert plan.check == "tree"
    assert not check_value(plan, (leaf,))


def test_tree_arithmetic_on_numbers():
    assert check_value(plan_assert("assert f(1) % 7 == 3 and f(1) * 2 == 20 and True"), (10, 10))
    assert check_value(plan_assert("assert f(1) / 4 == 2.5 and True"), (10,))
    assert not check_value(plan_assert("assert f(1) * f(1) > 0 and True"), (1 << 70_000, 1 << 70_000))


def test_frame_nodes_are_counted_before_parsing():
    # a 4 MiB frame of empty lists: 1.4 M lists in the worker (which is outside the program's memory cgroup)
    import tracemalloc

    from sandbox.protocol import HEADER, FrameBuffer

    body = b'{"k": "val", "i": 0, "v": [' + b"[], " * (1_400_000) + b"[]]}"
    tracemalloc.start()
    try:
        messages = FrameBuffer(64 << 20).feed(HEADER.pack(len(body)) + body)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert messages == [{"k": "big", "i": 0}]
    assert peak < 8 * len(body), peak  # copies of the bytes only (parsed: ~16 times their size)
    forged = b'{"i": 0, "k": "val", "v": [' + b"[], " * (1_400_000) + b"[]]}"  # not the harness's frame
    assert FrameBuffer(64 << 20).feed(HEADER.pack(len(forged)) + forged) == [{"k": "garbage"}]
    # a value with many commas inside strings is counted exactly (strings are one node each)
    text = b'{"k": "val", "i": 3, "v": ["' + b",[{" * 400_000 + b'"]}'
    assert FrameBuffer(64 << 20).feed(HEADER.pack(len(text)) + text)[0]["i"] == 3


def test_only_what_calls_the_program_runs_in_its_process():
    # a library call on the program's value: the child computes f(1) only; np.allclose runs program-free
    lib = plan_assert("assert np.allclose(f(1), [1.0, 2.0])", frozenset({"f"}), frozenset({"np"}))
    assert lib.worker_test["src"] == "(f(1), )" and "[1.0, 2.0]" not in json.dumps(lib.worker_test)
    assert lib.derived_test == {"kind": "expr", "src": "(np.allclose(__leaf_0, [1.0, 2.0]), )"}
    assert check_value(lib, ([1.0, 2.0],), (), (True,)) and not check_value(lib, ([1.0, 2.0],), (), (False,))
    # a setup helper's value the program takes as input is computed apart and bound as data
    setup = plan_assert('assert g(h("abc")) == "abc"', frozenset({"g"}), frozenset(), frozenset({"h"}))
    assert setup.worker_test["src"] == "(g(__ref_0), )" and setup.bound_refs == ("h('abc')",)
    assert check_value(setup, ("abc",), ("bca",)) and not check_value(setup, ("bca",), ("bca",))
    # a star-imported name is the expected side, never the program's
    from sandbox.judge import imported_names

    assert "pi" in imported_names(("from math import *",))
    star = plan_assert("assert f(1) == pi", frozenset({"f"}), imported_names(("from math import *",)))
    assert star.reference_test == {"kind": "expr", "src": "(pi, )"}
    # builtins over the program's value stay with it, as before (a generator it returns is iterated there)
    assert plan_assert("assert sorted(f(1)) == [1, 2]", frozenset({"f"})).worker_test["src"] == "sorted(f(1))"
