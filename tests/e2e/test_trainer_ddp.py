"""Scale-out on an existing engine: the same trainer under `accelerate launch` with 2 CPU processes."""

import json

import pytest
import torch

from tests.trainer_helpers import launch_two_processes


def launch(tmp_path, scenario):
    launch_two_processes("ddp_two_steps.py", str(tmp_path), scenario, port=29517)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["even", "uneven"])
def test_two_processes_end_with_identical_adapters(tmp_path, scenario):
    rank0, rank1 = launch(tmp_path, scenario)
    assert rank0["world"] == rank1["world"] == 2
    assert set(rank0["prompts"]).isdisjoint(rank1["prompts"])  # each rank rolled out its own prompts
    moved = False
    for key, value in rank0["lora"].items():
        assert torch.allclose(value, rank1["lora"][key], atol=1e-7), key  # gradients were synchronized
        moved = moved or "lora_B" in key and value.abs().sum() > 0
    assert moved  # and training did change the adapter
    if scenario == "even":
        # the schedule advances once per optimizer step, as on one process: linear decay over 2 steps
        lrs = [json.loads(line)["lr"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        assert lrs == pytest.approx([0.01 * (1 - 1 / 2), 0.01 * (1 - 2 / 2)])
        # the final checkpoint gives every rank its own state back
        for rank in (rank0, rank1):
            assert rank["reloaded"]["teacher"] == rank["saved"]["teacher"]
            assert torch.equal(rank["reloaded"]["torch"], rank["saved"]["torch"])
            assert rank["reloaded"]["buffer"] == rank["saved"]["buffer"]
        assert rank0["saved"]["teacher"] != rank1["saved"]["teacher"] and rank0["teacher_draw"] != rank1["teacher_draw"]
        assert not torch.equal(rank0["saved"]["torch"], rank1["saved"]["torch"])
    else:
        check_global_token_mean(rank0, rank1)


def check_global_token_mean(rank0, rank1):
    """The first step's synchronized gradient is that of one token-mean over the kept samples of both ranks
    (rank 1 kept none), not rank 0's token-mean halved by DDP's averaging."""
    from rollouts.completion import RolloutCompletion
    from tests.trainer_helpers import tiny_config
    from training.batching import completion_logprobs, pad_rollout_batch
    from training.losses import group_advantages, grpo_loss
    from utils.student_model import attach_lora, load_student

    config = tiny_config("unused")
    model, tokenizer = load_student(config.student.model_name, "float32", device="cpu")
    torch.manual_seed(0)  # the adapter initialisation every rank started from
    model = attach_lora(model, config.lora.r, config.lora.lora_alpha, 0.0, config.lora.target_modules)
    kept, advantages = [], []
    for rank in (rank0, rank1):
        groups = rank["samples"]
        correctness = torch.tensor([[s["correctness"] for s in g] for g in groups])
        bonus = torch.tensor([[config.grpo.format_reward_weight * s["format"] for s in g] for g in groups])
        adv = group_advantages(correctness, scale=config.grpo.scale_rewards, bonus=bonus)[0]
        for g, group in enumerate(groups):
            if adv[g].abs().sum() > 0:  # dynamic filtering
                kept += group
                advantages += adv[g].tolist()
    assert kept and all(s["correctness"] == 0 for g in rank1["samples"] for s in g)
    completions = [RolloutCompletion("", tuple(s["token_ids"]), tuple(s["prompt_ids"]), "stop") for s in kept]
    batch = pad_rollout_batch(completions, tokenizer.pad_token_id)
    logp = completion_logprobs(model, batch)
    loss, _ = grpo_loss(logp, logp.detach(), torch.tensor(advantages), batch["completion_mask"])
    loss.backward()
    for name, param in model.named_parameters():
        if param.grad is not None:
            ddp_name = next(k for k in rank0["grads"] if k.endswith(name))
            assert torch.allclose(rank0["grads"][ddp_name], param.grad, rtol=1e-4, atol=1e-8), name
            assert torch.allclose(rank1["grads"][ddp_name], param.grad, rtol=1e-4, atol=1e-8), name


@pytest.mark.slow
def test_processes_with_different_output_folders_are_named_before_any_model_loads(tmp_path):
    """Two machines with node-local output folders: the main process's token cannot be read by the other one. The
    start-up check says so on every process, naming the unreadable path and the requirement; with one folder
    shared by both it passes, and no token is left behind."""
    launch_two_processes("ddp_shared_folder.py", str(tmp_path), port=29519)
    found = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank in found:
        assert rank["shared"] == ""
        assert rank["left_behind"] == []
        line = rank["separate"]
        assert "process 1 on " in line and str(tmp_path / "node-1" / ".tgrpo-shared-folder-check") in line
        assert "process 0" not in line.split(", which")[0]  # the main process reads its own token
        assert "shared by every machine at the same path" in line
    assert found[0]["separate"] == found[1]["separate"]


def test_the_process_group_waits_as_long_as_the_config_says(tmp_path):
    """DDP's collectives time out after training.ddp_timeout seconds (torch's NCCL default is 10 minutes)."""
    from accelerate.utils import InitProcessGroupKwargs

    from config import build_config
    from training.metric_sinks import make_accelerator

    config = build_config("cpu", overrides={"training": {"ddp_timeout": 5400}})
    accelerator = make_accelerator(config, tmp_path, cpu=True)
    handler = accelerator.init_handler
    assert isinstance(handler, InitProcessGroupKwargs), handler
    assert handler.timeout.total_seconds() == 5400
    assert build_config("gpu").training.ddp_timeout == 1800  # transformers' TrainingArguments.ddp_timeout
