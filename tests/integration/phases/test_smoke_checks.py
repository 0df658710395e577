"""scripts/check_smoke_run.py, the checks of scripts/gpu_smoke.sh, on run folders written here: each check passes a
correct run whatever the model's luck and fails on its planted defect (the legs themselves need vLLM: make
test-vllm on CPU, the GPU for the sleep-mode leg)."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file

from scripts import check_smoke_run

TOLERANCE = 0.05


def write_rows(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def smoke_run(tmp_path, grad_norm=(0.0, 0.0), lora_b=0.0, tool=None, diffs=(0.01, 0.02), sleep=None):
    """A run folder as gpu_smoke.sh's legs leave it (one process)."""
    out = tmp_path / "run"
    write_rows(
        out / "metrics.jsonl",
        [{"rollout/logp_abs_diff": d, "grad_norm": g} for d, g in zip(diffs, grad_norm, strict=True)],
    )
    (out / "train.log").write_text("step 1\nstep 2\n")
    (out / ".vllm_adapters" / "step-1").mkdir(parents=True)
    (out / "final_model").mkdir()
    save_file(
        {"layers.0.q_proj.lora_B.weight": torch.full((4, 2), lora_b)}, out / "final_model" / "adapter_model.safetensors"
    )
    samples = [{"task_id": t, "model": role} for t in ("a", "b") for role in ("trained", "baseline")]
    write_rows(out / "eval_samples.jsonl", samples)
    tool = tool if tool is not None else [{"rollout/logp_abs_diff": 0.01, "multi_turn/turns_mean": 1.0}] * 2
    write_rows(out / "tool" / "metrics.jsonl", tool)
    if sleep is not None:
        write_rows(out / "sleep" / "metrics.jsonl", [{"rollout/logp_abs_diff": d} for d in sleep])
    return out


def test_a_correct_run_without_any_gradient_passes(tmp_path, capsys):
    """No group with reward spread and no passing sample: every gradient is 0 at B = 0 and AdamW leaves B at 0.
    The old rule (some lora_B non-zero) failed this correct run."""
    assert check_smoke_run.check(smoke_run(tmp_path), 1, TOLERANCE) == []
    assert "the adapter check did not apply" in capsys.readouterr().out


def test_a_gradient_that_never_reaches_the_adapter_fails(tmp_path):
    assert check_smoke_run.check(smoke_run(tmp_path, grad_norm=(0.0, 0.3), lora_b=1e-4), 1, TOLERANCE) == []
    failures = check_smoke_run.check(smoke_run(tmp_path / "b", grad_norm=(0.0, 0.3)), 1, TOLERANCE)
    assert failures and "left every lora_B at 0" in failures[0]


def test_tool_calls_must_bring_masked_environment_tokens(tmp_path, capsys):
    called = {"rollout/logp_abs_diff": 0.01, "multi_turn/turns_mean": 2.0, "multi_turn/tool_calls_mean": 0.5}
    ok = [{**called, "multi_turn/environment_token_share": 0.2}] * 2
    assert check_smoke_run.check(smoke_run(tmp_path, tool=ok), 1, TOLERANCE) == []
    planted = [{**called, "multi_turn/environment_token_share": 0.0}] * 2  # results never inserted
    failures = check_smoke_run.check(smoke_run(tmp_path / "b", tool=planted), 1, TOLERANCE)
    assert failures == ["tool mode: the policy called tools but no inserted (environment) token was in any batch"]
    capsys.readouterr()
    check_smoke_run.check(smoke_run(tmp_path / "c"), 1, TOLERANCE)  # no tool call at all: said, not failed
    assert "masking of inserted results not exercised" in capsys.readouterr().out
    missing = [{"rollout/logp_abs_diff": 0.01}]
    assert check_smoke_run.check(smoke_run(tmp_path / "d", tool=missing), 1, TOLERANCE) == [
        "tool mode: no multi_turn/* metrics were logged"
    ]


def test_the_sleep_mode_leg_must_keep_the_logprobs_over_two_steps(tmp_path):
    assert check_smoke_run.check(smoke_run(tmp_path, sleep=(0.01, 0.02)), 1, TOLERANCE) == []
    stale = check_smoke_run.check(smoke_run(tmp_path / "b", sleep=(0.01, 0.3)), 1, TOLERANCE)
    assert len(stale) == 1 and stale[0].startswith("sleep mode: |logp_vllm - logp_train|")
    short = check_smoke_run.check(smoke_run(tmp_path / "c", sleep=(0.01,)), 1, TOLERANCE)
    assert short == ["sleep mode: 1 step(s) logged; 2 are needed for a wake-up after an update"]


def test_logprobs_far_from_the_trainers_and_a_misplaced_engine_fail(tmp_path):
    failures = check_smoke_run.check(smoke_run(tmp_path, diffs=(0.01, 0.2)), 1, TOLERANCE)
    assert len(failures) == 1 and failures[0].startswith("single-turn: |logp_vllm - logp_train|")
    out = smoke_run(tmp_path / "b")
    (out / "train.log").write_text("vLLM engine: rank 0 (local 0) on cuda:0\nvLLM engine: rank 1 (local 1) on cuda:0\n")
    assert check_smoke_run.check(out, 2, TOLERANCE) == ["engine devices: {0: 0, 1: 0}"]
