"""The kv sampler as a rollout backend: chosen by the config (the cpu preset's default), trained on with
importance weights from its own log-probs, and phase 4's sampler (`evaluation.backend`)."""

from __future__ import annotations

import json

import pytest
import torch

import phase4_evaluate as phase4
from config import ConfigError, build_config
from rollouts.from_config import build_sampler
from rollouts.hf import HFRollout
from rollouts.kv_sampler import KVCacheRollout
from sandbox.executor import SandboxPool
from tests.trainer_helpers import small_tasks, teacher_examples, tiny_config
from training.grpo_trainer import GRPOTrainer
from training.setup import build_run
from utils.student_model import attach_lora, load_student


def test_the_cpu_preset_samples_with_the_kv_sampler_and_hf_stays_selectable(tmp_path):
    config = build_config("cpu")
    assert config.grpo.rollout_backend == "kv" and config.evaluation_backend == "kv"
    rollout = build_sampler(config, purpose="train", tokenizer=None, output_dir=tmp_path)
    assert isinstance(rollout, KVCacheRollout) and rollout.dtype == torch.bfloat16
    assert isinstance(build_sampler(config, purpose="eval", tokenizer=None), KVCacheRollout)
    fallback = build_config("cpu", overrides=["grpo.rollout_backend=hf"])
    assert isinstance(build_sampler(fallback, purpose="train", tokenizer=None, output_dir=tmp_path), HFRollout)
    assert isinstance(build_sampler(fallback, purpose="eval", tokenizer=None), HFRollout)
    # phase 4's own key wins; the rollout server holds training adapters only, so phase 4 loads its model
    assert isinstance(
        build_sampler(build_config("cpu", overrides=["evaluation.backend=hf"]), purpose="eval", tokenizer=None),
        HFRollout,
    )
    assert build_config("cpu", overrides=["grpo.rollout_backend=vllm_server"]).evaluation_backend == "hf"
    assert build_config("gpu", overrides=["grpo.rollout_backend=vllm"]).evaluation_backend == "vllm"
    fp32 = build_config("cpu", overrides=["grpo.sampler_dtype=float32"])
    assert build_sampler(fp32, purpose="train", tokenizer=None, output_dir=tmp_path).dtype == torch.float32


def test_eight_bit_loading_is_refused_with_the_kv_sampler():
    with pytest.raises(ConfigError, match="student.load_in_8bit cannot be combined with the kv sampler"):
        build_config("cpu", overrides=["student.load_in_8bit=true"])
    with pytest.raises(ConfigError, match="kv sampler"):
        build_config("gpu", overrides=["student.load_in_8bit=true", "evaluation.backend=kv"])


@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "low", "high"), [("float32", 0.0, 1e-3), ("bfloat16", 1e-4, 0.5)])
def test_a_training_step_on_kv_rollouts_is_importance_weighted_by_the_samplers_logprobs(tmp_path, dtype, low, high):
    config = tiny_config(tmp_path / "out", **{"grpo.sampler_dtype": dtype, "grpo.max_new_tokens": 12})
    torch.manual_seed(0)
    model, tokenizer = load_student(config.student.model_name, "float32", device="cpu")
    model = attach_lora(model, config.lora.r, config.lora.lora_alpha, 0.0, config.lora.target_modules)
    tasks = small_tasks(2)
    rollout = build_sampler(config, purpose="train", tokenizer=tokenizer, output_dir=tmp_path / "out")
    assert isinstance(rollout, KVCacheRollout)
    with SandboxPool(workers=2) as pool:
        parts = build_run(
            config,
            tasks=tasks,
            teacher_examples=teacher_examples(tasks),
            output_dir=tmp_path / "out",
            model=model,
            tokenizer=tokenizer,
            rollout=rollout,
            pool=pool,
        )
        trainer = GRPOTrainer(parts)
        metrics = trainer.train_on_rollouts(*trainer.collect_rollouts())[0]
    # the sampler's float32-accumulated log-probs reach the trainer: the float32 copy matches it, bf16 does not
    assert low <= metrics["rollout/logp_abs_diff"] <= high
    assert all(torch.isfinite(torch.tensor(v)) for k, v in metrics.items() if k.startswith("loss/"))


def test_phase4_samples_with_the_evaluation_backend(tmp_path, monkeypatch):
    from utils.dataset_loader import write_tasks

    calls = []
    real = KVCacheRollout.sample

    def spy(self, *args, **kwargs):
        calls.append(self.dtype)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(KVCacheRollout, "sample", spy)
    eval_file = write_tasks(tmp_path / "eval.jsonl", small_tasks(2))
    out = tmp_path / "out"

    def run(name, *flags):
        argv = ["--preset", "cpu", "--eval_file", str(eval_file), "--k", "1", "--num_samples", "1"]
        argv += ["--temperature", "0", "--max_new_tokens", "8", "--model_path", "embedded:tiny-random"]
        argv += ["--set", f"paths.output_dir={out}", "--output", str(tmp_path / f"{name}.json")]
        assert phase4.cli([*argv, "--samples_output", str(tmp_path / f"{name}.jsonl"), *flags]) == 0
        rows = (tmp_path / f"{name}.jsonl").read_text().splitlines()
        return {r["task_id"]: r["completion"] for r in map(json.loads, rows)}

    kv = run("kv", "--set", "grpo.sampler_dtype=float32")
    assert calls == [torch.float32] * len(calls) and calls  # the preset's backend sampled phase 4
    del calls[:]
    hf = run("hf", "--set", "evaluation.backend=hf")
    assert calls == []
    assert kv == hf  # greedy from a float32 copy: the same tokens as generate
    assert len(list((out / "eval_cache").glob("*.jsonl"))) == 2  # the backend is in the cache key
