"""Two training processes with the vLLM backend (gloo on CPU, fake vLLM): the real phase-3 command."""

import json

import pytest

from tests.trainer_helpers import launch_two_processes, small_tasks


@pytest.mark.slow
def test_two_ranks_each_get_an_engine_on_their_own_gpu_and_share_one_adapter_folder_per_step(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in small_tasks(16)))
    phase3 = [
        "--preset",
        "cpu",
        "--max_steps",
        "3",
        "--train_file",
        str(train),
        "--output_dir",
        str(tmp_path / "out"),
        "--set",
        "student.model_name=embedded:tiny-random",
        "--set",
        "grpo.rollout_backend=vllm",
        "--set",
        "grpo.vllm_weight_sync=adapter",
        "--set",
        "grpo.max_logp_abs_diff=0",  # the fake engine's log-probs are made up: ~6 nats from the tiny model's
        "--set",
        "student.torch_dtype=float32",
        "--set",
        "grpo.max_new_tokens=64",
        "--set",
        "lora.r=4",
        "--set",
        "training.save_steps=0",
        "--set",
        "sandbox.max_workers=1",
        "--set",
        "dual_source.teacher_sft_weight=0",
        "--set",
        "training.learning_rate=0.01",
    ]
    launch_two_processes("ddp_vllm_steps", str(tmp_path), str(train), *phase3)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["engines"] for r in ranks] == [1, 1]
    assert [r["device"] for r in ranks] == ["cuda:0", "cuda:1"]  # each engine on its own rank's GPU
    assert ranks[0]["seed"] != ranks[1]["seed"]  # and its own random stream
    assert ranks[0]["kwargs"]["max_lora_rank"] == 8  # r=4 is not a rank vLLM allows
    for step in range(3):
        calls = [r["calls"][step] for r in ranks]
        assert calls[0]["name"] == calls[1]["name"] == f"policy-{step}"  # a new name per sync: no stale prefix cache
        assert calls[0]["path"] == calls[1]["path"]  # one folder per step, written once
        assert calls[0]["digest"] == calls[1]["digest"]  # both engines loaded identical adapters
    assert len({c["digest"] for c in ranks[0]["calls"]}) == 3  # and training moved them between steps
    # right after the main process's rollout only the current step's folder is left
    assert ranks[0]["folders_after_rollout"] == [["step-0"], ["step-1"], ["step-2"]]
    assert sorted(p.name for p in (tmp_path / "out" / ".vllm_adapters").iterdir()) == ["step-2"]
