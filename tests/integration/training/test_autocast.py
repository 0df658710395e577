"""training.autocast: every forward of the student, whichever thread calls it, runs in bfloat16 autocast while
its weights stay float32; the log-probs the loss reads come back in float32."""

from __future__ import annotations

import threading

import torch

from config import build_config
from rollouts.completion import RolloutCompletion
from training.batching import autocast_forward, completion_logprobs, pad_rollout_batch
from training.setup import build_accelerator, build_student


def _linear_output_dtypes(model) -> list[torch.dtype]:
    seen: list[torch.dtype] = []
    layer = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    layer.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    return seen


def test_build_student_runs_every_forward_in_bfloat16_autocast(tmp_path):
    config = build_config(
        "cpu",
        overrides=[
            "student.model_name=embedded:tiny-random",
            "training.autocast=bfloat16",
            f"paths.output_dir={tmp_path}",
        ],
    )
    model, tokenizer = build_student(config, build_accelerator(config, tmp_path))
    seen = _linear_output_dtypes(model)
    sample = RolloutCompletion("x", (5, 6, 7), (1, 2, 3, 4), "stop")
    batch = pad_rollout_batch([sample, sample], tokenizer.pad_token_id)
    logp = completion_logprobs(model, batch)
    assert logp.dtype == torch.float32 and torch.isfinite(logp).all()
    in_thread: list[torch.Tensor] = []  # the no-grad reference forward runs in its own thread
    thread = threading.Thread(target=lambda: in_thread.append(completion_logprobs(model, batch).detach()))
    thread.start()
    thread.join()
    assert seen and all(dtype == torch.bfloat16 for dtype in seen), seen
    assert torch.equal(in_thread[0], logp.detach())  # the same distribution from either thread
    assert all(p.dtype == torch.float32 for p in model.parameters())
    logp.sum().backward()
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in model.parameters() if p.requires_grad)


def test_autocast_off_leaves_the_forward_in_float32(tmp_path):
    config = build_config(
        "cpu",
        overrides=["student.model_name=embedded:tiny-random", "training.autocast=off", f"paths.output_dir={tmp_path}"],
    )
    model, tokenizer = build_student(config, build_accelerator(config, tmp_path))
    seen = _linear_output_dtypes(model)
    sample = RolloutCompletion("x", (5, 6), (1, 2), "stop")
    completion_logprobs(model, pad_rollout_batch([sample], tokenizer.pad_token_id))
    assert seen and set(seen) == {torch.float32}
    assert autocast_forward(model, "bfloat16") is model
