"""Scale-out on an existing engine: the same trainer under `accelerate launch` with 2 CPU processes."""

import json

import pytest
import torch

from tests.trainer_helpers import launch_two_processes, small_tasks


def launch(tmp_path, scenario):
    launch_two_processes("ddp_two_steps", str(tmp_path), scenario)
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
    launch_two_processes("ddp_shared_folder", str(tmp_path))
    found = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank in found:
        assert rank["shared"] == ""
        assert rank["left_behind"] == []
        line = rank["separate"]
        assert "process 1 on " in line and str(tmp_path / "node-1" / ".tgrpo-shared-folder-check") in line
        assert "process 0" not in line.split(", which")[0]  # the main process reads its own token
        assert "shared by every machine at the same path" in line
    assert found[0]["separate"] == found[1]["separate"]
    for rank in found:  # node-local data: the same digests pass, different training tasks are named in one line
        assert rank["same_data"] == ""
        assert (
            rank["other_data"].startswith("process 1 on ")
            and "read other training tasks than process 0" in (rank["other_data"])
        )
        assert "paths.data_dir" in rank["other_data"] and "teacher traces" not in rank["other_data"]


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


@pytest.mark.slow
def test_async_rollouts_under_two_processes_train_each_rank_on_its_synchronous_shard(tmp_path):
    """Asynchronous rollouts with 2 processes against one (fake) rollout server: the main process's producer samples
    both ranks' prompts, each rank trains on the shard the synchronous run gives it at the same data-order position
    (also after a resume), the ranks end with identical adapters, and every adapter the run loaded is unloaded. A
    producer failure on the main process, and Ctrl-C there, end every rank with an error naming it (none waits for
    the main process until the process group's timeout), with no producer thread left."""
    from tests.canned_responses import half_right_responder
    from tests.fake_openai_server import FakeVLLMServer, RunningServer
    from utils.student_model import load_tokenizer

    state = FakeVLLMServer(base_model="embedded:tiny-random")
    state.responder = half_right_responder(load_tokenizer("embedded:tiny-random"), small_tasks(16))
    with RunningServer(state) as server:
        launch_two_processes("ddp_async_steps", str(tmp_path), server.url)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    for rank in ranks:
        for name in ("sync", "async", "resumed"):
            assert rank[name]["error"] is None, (name, rank[name]["error"])
        assert len(rank["sync"]["trained"]) == 4
        # the same prompts at the same data-order positions as the synchronous run, before and after the resume
        assert rank["async"]["trained"] + rank["resumed"]["trained"] == rank["sync"]["trained"]
        assert rank["resumed"]["rollout_batches"] == 4
    for batch in range(4):
        assert set(ranks[0]["sync"]["trained"][batch]).isdisjoint(ranks[1]["sync"]["trained"][batch])
    for name in ("sync", "async", "resumed"):
        first, second = ranks[0][name]["lora"], ranks[1][name]["lora"]
        assert all(torch.allclose(first[k], second[k], atol=1e-7) for k in first), name  # DDP kept them equal
        assert any("lora_B" in k and v.abs().sum() > 0 for k, v in first.items()), name  # and training moved them
    steps = [json.loads(line) for line in (tmp_path / "async" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2, 3, 4]
    assert [m["async/staleness_max"] for m in steps] == [0.0, 1.0, 0.0, 1.0]  # the resume samples from its adapter
    assert all("async/trainer_wait_s" in m and "rollout/is_weight_p99" in m for m in steps)
    # the curriculum, drawn and observed by the main process's producer, saved alike by both ranks: both ranks'
    # groups of the two trained batches (the batch in flight is not in it)
    from training.checkpointing import rank_state_name

    assert [rank["curriculum"]["error"] for rank in ranks] == [None, None]
    saved = [
        torch.load(tmp_path / "curriculum" / "checkpoint-2" / rank_state_name(r), weights_only=False)["curriculum"]
        for r in (0, 1)
    ]
    assert saved[0] == saved[1]
    assert sum(map(len, saved[0]["history"])) == 2 * 2 * 4 * 4  # batches x ranks x prompts x samples
    # a producer failure: the same error on both ranks; Ctrl-C on the main process: every rank ends
    crash = [rank["crash"]["error"] for rank in ranks]
    assert crash[0] == crash[1] and crash[0].startswith("ProducerError") and "went away" in crash[0]
    interrupt = [rank["interrupt"]["error"] for rank in ranks]
    assert interrupt[0].startswith("KeyboardInterrupt")
    assert interrupt[1].startswith("ProducerError") and "KeyboardInterrupt" in interrupt[1]
    for rank in ranks:
        for name in ("sync", "async", "resumed", "curriculum", "crash", "interrupt"):
            assert "rollout-producer" not in rank[name]["threads"], name
    # one producer: every adapter loaded once, by one process, and unloaded by the end of its run
    loads = [name for kind, name in state.events if kind == "load"]
    unloads = [name for kind, name in state.events if kind == "unload"]
    assert len(loads) == len(set(loads)) and sorted(unloads) == sorted(loads)
    assert {call[0] for call in state.calls} <= set(loads)
