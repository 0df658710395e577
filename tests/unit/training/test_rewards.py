import pytest

from sandbox.executor import ExecutionResult
from training.rewards import REWARD_FUNCTIONS, compute_rewards, get_reward_function
from utils.thinking_extraction import extract_thinking_and_code_unified as extract


def result(passed, total, status=None):
    return ExecutionResult(
        passed=passed == total,
        tests_passed=passed,
        tests_total=total,
        status=status or ("passed" if passed == total else "wrong_answer"),
    )


PARSED_GOOD = extract("<think>t</think>\n\n```python\nx = 1\n```")  # well formed
PARSED_PLAIN = extract("```\nx = 1\n```")  # code, but not the format the prompt asks for
PARSED_NONE = extract("<think>never closed")  # no code
assert PARSED_GOOD.well_formed and PARSED_PLAIN.has_code and not PARSED_PLAIN.well_formed and not PARSED_NONE.has_code


def test_binary_and_fraction_and_format():
    results = [result(3, 3), result(1, 4), result(0, 2), result(0, 3, "sandbox_error")]
    parsed = [PARSED_GOOD, PARSED_PLAIN, PARSED_NONE, PARSED_GOOD]
    binary = compute_rewards(results, parsed, correctness="binary", format_weight=0.1)
    assert [r.correctness for r in binary] == [1.0, 0.0, 0.0, None]
    assert [r.format for r in binary] == [1.0, 0.5, 0.0, 1.0]
    assert binary[0].total == pytest.approx(1.1) and binary[1].total == pytest.approx(0.05)
    assert binary[3].total is None  # the harness failed: no signal, not "wrong"
    fraction = compute_rewards(results, parsed, correctness="fraction", format_weight=0.0)
    assert [r.total for r in fraction] == [1.0, 0.25, 0.0, None]


def test_registry_names_valid_choices():
    assert set(REWARD_FUNCTIONS) == {"binary", "fraction", "format"}
    with pytest.raises(ValueError, match="valid rewards: binary, fraction, format"):
        get_reward_function("pass@1")
    with pytest.raises(ValueError, match="valid: binary, fraction"):
        compute_rewards([], [], correctness="format")
    with pytest.raises(ValueError, match="1 results but 0 parsed"):
        compute_rewards([result(1, 1)], [], correctness="binary")


USER_REWARDS = '''
SEEN = {}


def brevity(prompts, completions, **columns):
    """Shorter is better; TRL signature."""
    SEEN.update(columns, prompts=prompts)
    return [-len(c) / 100 for c in completions]


def only_mbpp(prompts, completions, source, **kwargs):
    return [1.0 if s == "mbpp" else None for s in source]


def wrong_length(prompts, completions, **kwargs):
    return [0.0]
'''


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(USER_REWARDS)
    return path


def test_user_reward_functions_from_a_file_are_weighted_into_the_total(user_file):
    from types import SimpleNamespace

    from training.rewards import load_reward_functions, reward_columns

    user = load_reward_functions([f"{user_file}:brevity", f"{user_file}:only_mbpp"], [0.5, 2.0])
    tasks = [
        SimpleNamespace(
            task_id="mbpp/1",
            source="mbpp",
            problem="p",
            test_type="assert",
            tests=("assert f()",),
            difficulty="basic",
            fn_name="f",
        ),
        SimpleNamespace(
            task_id="apps/2",
            source="apps",
            problem="q",
            test_type="stdin",
            tests=({"input": "", "output": "1"},),
            difficulty="interview",
            fn_name=None,
        ),
    ]
    results, parsed = [result(1, 1), result(0, 2)], [PARSED_GOOD, PARSED_NONE]
    completions = ["x" * 50, "y" * 10]
    rewards = compute_rewards(
        results,
        parsed,
        correctness="binary",
        format_weight=0.1,
        user_rewards=user,
        prompts=["P1", "P2"],
        completions=completions,
        columns=reward_columns(tasks, parsed, results),
    )
    # by hand: 1 + 0.1*1 + 0.5*(-0.5) + 2*1 = 2.85; 0 + 0.1*0 + 0.5*(-0.1) + (None: nothing) = -0.05
    assert [r.total for r in rewards] == pytest.approx([2.85, -0.05])
    assert rewards[1].user == {f"{user_file}:brevity": pytest.approx(-0.1), f"{user_file}:only_mbpp": None}
    seen = user[0].function.__globals__["SEEN"]
    assert seen["prompts"] == ["P1", "P2"] and seen["task_id"] == ["mbpp/1", "apps/2"]
    assert seen["status"] == ["passed", "wrong_answer"] and seen["pass_fraction"] == [1.0, 0.0]


def test_user_reward_mistakes_are_named(user_file):
    from training.rewards import RewardFunctionError, load_reward_functions

    with pytest.raises(RewardFunctionError, match="no function 'nope'"):
        load_reward_functions([f"{user_file}:nope"])
    with pytest.raises(RewardFunctionError, match="cannot import 'no_such_module_xyz'"):
        load_reward_functions(["no_such_module_xyz:f"])
    with pytest.raises(RewardFunctionError, match="1 values for 2"):
        load_reward_functions([f"{user_file}:brevity", f"{user_file}:only_mbpp"], [1.0])
    bad = load_reward_functions([f"{user_file}:wrong_length"])
    with pytest.raises(RewardFunctionError, match="returned 1 values for 2 completions"):
        compute_rewards(
            [result(1, 1)] * 2,
            [PARSED_GOOD] * 2,
            correctness="binary",
            format_weight=0.1,
            user_rewards=bad,
            prompts=["p", "p"],
            completions=["a", "b"],
            columns={},
        )


def test_the_trainer_adds_user_rewards_and_logs_them(tmp_path, user_file, pool):
    from tests.integration.training.test_trainer import make_trainer

    trainer = make_trainer(
        tmp_path, pool, **{"grpo.reward_funcs": f"{user_file}:only_mbpp", "grpo.reward_weights": "3.0"}
    )
    groups, metrics = trainer.collect_rollouts()
    samples = [s for g in groups for s in g]
    assert all(
        s.reward.total == pytest.approx(s.reward.correctness + 0.1 * s.reward.format + 3.0) for s in samples
    )  # every small task is MBPP: +3 each
    assert metrics["reward/only_mbpp_mean"] == 1.0
