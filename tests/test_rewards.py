import pytest

from evaluation.code_executor import ExecutionResult
from training.rewards import REWARD_FUNCTIONS, compute_rewards, get_reward_function


def result(passed, total, status=None):
    return ExecutionResult(passed == total, passed, total, status or ("passed" if passed == total else "wrong_answer"))


PARSED_GOOD = {"well_formed": True, "has_code": True}
PARSED_PLAIN = {"well_formed": False, "has_code": True}
PARSED_NONE = {"well_formed": False, "has_code": False}


def test_binary_and_fraction_and_format():
    results = [result(3, 3), result(1, 4), result(0, 2), result(0, 3, "sandbox_error")]
    parsed = [PARSED_GOOD, PARSED_PLAIN, PARSED_NONE, PARSED_GOOD]
    binary = compute_rewards(results, parsed, "binary", format_weight=0.1)
    assert [r.correctness for r in binary] == [1.0, 0.0, 0.0, None]
    assert [r.format for r in binary] == [1.0, 0.5, 0.0, 1.0]
    assert binary[0].total == pytest.approx(1.1) and binary[1].total == pytest.approx(0.05)
    assert binary[3].total is None  # the harness failed: no signal, not "wrong"
    fraction = compute_rewards(results, parsed, "fraction", format_weight=0.0)
    assert [r.total for r in fraction] == [1.0, 0.25, 0.0, None]


def test_registry_names_valid_choices():
    assert set(REWARD_FUNCTIONS) == {"binary", "fraction", "format"}
    with pytest.raises(ValueError, match="valid rewards: binary, fraction, format"):
        get_reward_function("pass@1")
    with pytest.raises(ValueError, match="valid: binary, fraction"):
        compute_rewards([], [], "format")
    with pytest.raises(ValueError, match="1 results but 0 parsed"):
        compute_rewards([result(1, 1)], [], "binary")
