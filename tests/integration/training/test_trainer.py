"""The trainer on the tiny random model: KL at step 0, what moves, exact resume, crash-safe saves."""

from __future__ import annotations

import dataclasses
import json
import types

import pytest
import torch

from rollouts.completion import RolloutCompletion
from synthesis.generate_traces import load_teacher_examples
from tests.cli_helpers import TINY_STUDENT, cpu_argv, run_script, start_script
from tests.trainer_helpers import (
    ScriptedRollout,
    base_state,
    lora_state,
    scripted_trainer,
    small_tasks,
    teacher_examples,
    tiny_config,
)
from training.batching import (
    chunked_completion_logprobs,
    completion_logprobs,
    pad_rollout_batch,
    row_chunks,
    slice_rollout_batch,
)
from training.checkpointing import resolve_checkpoint
from training.grpo_trainer import GRPOTrainer
from training.losses import group_advantages, grpo_loss
from training.rewards import ScoredSample
from training.setup import build_run
from training.sft_sources import best_passing_sample
from utils.sft_data import encode_prompt, end_of_turn_id
from utils.student_model import attach_lora, load_student


def _completion(prompt_ids, token_ids, finish_reason="stop"):
    return RolloutCompletion("", tuple(token_ids), tuple(prompt_ids), finish_reason)


def _scored(result, token_ids, finish_reason):
    """A scored sample with only what self-SFT's pick reads: the verdict, its correctness signal and the completion."""
    reward = types.SimpleNamespace(correctness=float(result.passed))
    return ScoredSample(None, _completion([0], token_ids, finish_reason), None, result, reward)


def make_trainer(tmp_path, pool, dropout=0.0, **overrides):
    config = tiny_config(tmp_path / "out", **overrides)
    torch.manual_seed(0)
    model, tokenizer = load_student(config.student.model_name, "float32", device="cpu")
    model = attach_lora(model, config.lora.r, config.lora.lora_alpha, dropout, config.lora.target_modules)
    tasks = small_tasks()
    rollout = ScriptedRollout(tokenizer, {t.problem: t for t in tasks})
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
    return GRPOTrainer(parts)


@pytest.mark.slow
def test_first_step_kl_is_zero_and_only_lora_moves(tmp_path, pool):
    trainer = make_trainer(tmp_path, pool)
    base_before, lora_before = base_state(trainer.model), lora_state(trainer.model)
    groups, rollout_metrics = trainer.collect_rollouts()
    metrics = trainer.train_on_rollouts(groups, rollout_metrics)[0]
    assert metrics["kl"] == 0.0  # the adapter starts as the identity: policy == reference
    assert 0 < metrics["pass_rate"] < 1 and metrics["frac_reward_zero_std"] < 1  # mixed groups: real advantages
    assert all(torch.isfinite(torch.tensor(v)) for k, v in metrics.items() if k.startswith("loss/"))
    assert metrics["self_sft/samples"] >= 1 and "loss/teacher_sft" in metrics and "loss/self_sft" in metrics
    after_base, after_lora = base_state(trainer.model), lora_state(trainer.model)
    assert all(torch.equal(base_before[k], after_base[k]) for k in base_before)
    assert any(not torch.equal(lora_before[k], after_lora[k]) for k in lora_before)
    second = trainer.train_on_rollouts(*trainer.collect_rollouts())[0]
    assert second["kl"] > 0  # the adapter has moved away from the base


@pytest.mark.slow
def test_four_steps_equal_two_plus_resume_plus_two(tmp_path, pool):
    straight = make_trainer(tmp_path / "a", pool, **{"training.max_steps": 4})
    straight.train()
    reference = lora_state(straight.model)
    first = make_trainer(tmp_path / "b", pool, **{"training.max_steps": 2})
    first.train()
    assert (tmp_path / "b" / "out" / "final_model" / "adapter_config.json").is_file()
    # a checkpoint is written at step 2 only when the run continues; write it as an interrupted run would
    first.save_checkpoint()
    resumed = make_trainer(tmp_path / "b", pool, **{"training.max_steps": 4})
    resumed.train(resume_from="latest")
    assert resumed.state.global_step == 4
    result = lora_state(resumed.model)
    for key in reference:
        assert torch.allclose(reference[key], result[key], atol=1e-6), key
    steps = [json.loads(line)["step"] for line in (tmp_path / "b" / "out" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]  # same step counter after resuming
    lrs = [json.loads(line)["lr"] for line in (tmp_path / "a" / "out" / "metrics.jsonl").read_text().splitlines()]
    assert lrs == [0.01] * 4


@pytest.mark.slow
def test_crash_mid_save_leaves_the_previous_checkpoint_loadable(tmp_path, pool, monkeypatch):
    trainer = make_trainer(tmp_path, pool, **{"training.max_steps": 10})
    trainer.train_on_rollouts(*trainer.collect_rollouts())
    good = trainer.save_checkpoint()
    trainer.train_on_rollouts(*trainer.collect_rollouts())
    real_save = torch.save

    def crash(obj, path, *args, **kwargs):
        if str(path).endswith("scheduler.pt"):
            raise OSError("disk full")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        trainer.save_checkpoint()
    monkeypatch.setattr(torch, "save", real_save)
    checkpoints = sorted(p.name for p in (tmp_path / "out").glob("checkpoint-*"))
    assert checkpoints == [good.name]
    fresh = make_trainer(tmp_path, pool, **{"training.max_steps": 10})
    fresh.load_checkpoint(resolve_checkpoint(fresh.output_dir, "latest"))
    assert fresh.state.global_step == 1


@pytest.mark.slow
def test_checkpoint_retention(tmp_path, pool):
    trainer = make_trainer(tmp_path, pool, **{"training.save_total_limit": 2})
    for _ in range(3):
        trainer.train_on_rollouts(*trainer.collect_rollouts())
        trainer.save_checkpoint()
    assert sorted(p.name for p in (tmp_path / "out").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    saved = tmp_path / "out" / "checkpoint-3"
    assert {"adapter", "optimizer.pt", "scheduler.pt", "rank-0.pt", "trainer_state.json", "config.json"} <= {
        p.name for p in saved.iterdir()
    }


@pytest.mark.slow
def test_saving_a_checkpoint_again_never_leaves_it_half_deleted(tmp_path, pool):
    from tests.fs_watch import broken_states

    def whole(folder):
        return (folder / "trainer_state.json").is_file() and (folder / "adapter" / "adapter_config.json").is_file()

    trainer = make_trainer(tmp_path, pool, **{"training.max_steps": 10})
    trainer.train_on_rollouts(*trainer.collect_rollouts())
    saved = trainer.save_checkpoint()
    with broken_states(saved, whole) as broken:
        assert trainer.save_checkpoint() == saved  # the same step again (a resumed run's last step)
    assert broken == []
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if "checkpoint" in p.name) == [saved.name]


def test_completion_logprobs_match_unpadded_full_forward(tiny_model_name):
    model, tokenizer = load_student(tiny_model_name, "float32", device="cpu")
    samples = [
        _completion(encode_prompt(tokenizer, "short"), [5, 6, 7]),
        _completion(encode_prompt(tokenizer, "a much longer prompt with more words"), [8, 9]),
    ]
    batch = pad_rollout_batch(samples, tokenizer.pad_token_id)
    assert batch["completion_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    with torch.no_grad():
        fast = completion_logprobs(model, batch)
        for row, s in enumerate(samples):
            ids = torch.tensor([s.prompt_ids + s.token_ids])
            logits = model(ids).logits[0]  # no padding at all
            p = len(s.prompt_ids)
            slow = (
                torch.log_softmax(logits[p - 1 : -1], -1)
                .gather(-1, torch.tensor(s.token_ids).unsqueeze(-1))
                .squeeze(-1)
            )
            assert torch.allclose(fast[row, : len(s.token_ids)], slow, atol=1e-5)


def test_chunked_logprobs_trim_padding_and_match_the_whole_batch(tiny_model_name):
    model, tokenizer = load_student(tiny_model_name, "float32", device="cpu")
    samples = [
        _completion(encode_prompt(tokenizer, "a much longer prompt with more words"), [8, 9]),
        _completion(encode_prompt(tokenizer, "short"), [5, 6, 7, 11]),
        _completion(encode_prompt(tokenizer, "mid size prompt"), [4]),
    ]
    batch = pad_rollout_batch(samples, tokenizer.pad_token_id)
    part, width = slice_rollout_batch(batch, [0, 2])
    assert width == 2 and part["completion_mask"].tolist() == [[1, 1], [1, 0]]
    assert part["input_ids"].shape[1] == len(samples[0].prompt_ids) + 2  # row 1's longer padding is gone
    assert part["attention_mask"][0].all()  # the longest chosen prompt has no padding left
    with torch.no_grad():
        whole = completion_logprobs(model, batch)
        for chunk in (1, 2, 0):
            chunked = chunked_completion_logprobs(model, batch, chunk)
            assert torch.allclose(chunked * batch["completion_mask"], whole * batch["completion_mask"], atol=1e-5), (
                chunk
            )
    assert row_chunks(5, 2) == [[0, 1], [2, 3], [4]] and row_chunks(3, 0) == [[0, 1, 2]] and row_chunks(0, 2) == []


@pytest.mark.slow
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_forward_chunking_leaves_the_gradient_unchanged(tmp_path, pool, aggregation):
    grads = {}
    for chunk in (0, 1, 3):
        trainer = make_trainer(
            tmp_path / str(chunk),
            pool,
            **{
                "training.forward_chunk_size": chunk,
                "grpo.loss_aggregation": aggregation,
                "dual_source.self_sft_weight": 0.5,
            },
        )
        captured = {}

        def record(*args, _trainer=trainer, _captured=captured, **kwargs):
            _captured.update({n: p.grad.clone() for n, p in _trainer.model.named_parameters() if p.grad is not None})

        trainer.optimizer.step = record
        groups, rollout_metrics = trainer.collect_rollouts()  # same seed: the same rollouts for every chunk size
        metrics = trainer.train_on_rollouts(groups, rollout_metrics)[0]
        assert metrics["self_sft/samples"] >= 1 and "loss/teacher_sft" in metrics
        grads[chunk] = (captured, metrics)
    whole, whole_metrics = grads[0]
    assert whole and any(g.abs().sum() > 0 for g in whole.values())
    for chunk in (1, 3):
        chunked, metrics = grads[chunk]
        assert chunked.keys() == whole.keys()
        for name in whole:
            assert torch.allclose(chunked[name], whole[name], rtol=1e-4, atol=1e-7), (chunk, name)
        for key in ("loss/grpo", "loss/teacher_sft", "loss/self_sft", "loss/total", "kl", "ratio/mean"):
            assert metrics[key] == pytest.approx(whole_metrics[key], rel=1e-4, abs=1e-7), (chunk, key)


def test_a_step_whose_groups_are_all_filtered_still_learns_from_teacher_sft(tmp_path, pool):
    trainer = make_trainer(tmp_path, pool, **{"grpo.dynamic_filtering": True, "training.max_steps": 2})
    trainer.parts.rollout.always_wrong = True  # every group all wrong: zero variance, all dropped, no self-SFT
    lora_before = lora_state(trainer.model)
    trainer.train()
    lines = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["frac_reward_zero_std"] for m in lines] == [1.0, 1.0]
    assert all("loss/grpo" not in m and m["loss/teacher_sft"] > 0 for m in lines)
    # the total is the optimized objective: teacher weight x its loss averaged over the 2 accumulation slots
    assert all(
        m["loss/total"] == pytest.approx(m["weight/teacher_sft"] * m["loss/teacher_sft"], rel=1e-6) for m in lines
    )
    assert any(not torch.equal(lora_before[k], v) for k, v in lora_state(trainer.model).items())


def _one_success(groups):
    """Keep exactly one passing sample (group 0, sample 0) in a rollout batch."""
    passed, failed = types.SimpleNamespace(passed=True), types.SimpleNamespace(passed=False)
    return [
        [dataclasses.replace(s, result=passed if (g, j) == (0, 0) else failed) for j, s in enumerate(group)]
        for g, group in enumerate(groups)
    ]


def _grads_at_step(trainer):
    captured = {}

    def record(*args, **kwargs):
        captured.update({n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})

    trainer.optimizer.step = record
    return captured


def test_the_success_buffer_is_deduplicated_and_replays_are_bounded(tmp_path, pool):
    trainer = make_trainer(tmp_path, pool, **{"dual_source.self_sft_max_replays": 2})
    groups = _one_success(trainer.collect_rollouts()[0])
    assert len(trainer._self_sft_examples(groups)) == 1
    assert len(trainer._self_sft_examples(groups)) == 1 and len(trainer.buffer) == 1  # the same success: one entry
    groups = [[dataclasses.replace(s, result=types.SimpleNamespace(passed=False)) for s in group] for group in groups]
    replays = [len(trainer._self_sft_examples(groups)) for _ in range(4)]
    assert replays == [1, 1, 0, 0]  # replayed twice, then retired


def test_a_length_cut_pass_is_not_imitated():
    ok = types.SimpleNamespace(passed=True)
    group = [_scored(ok, [1, 2], "length"), _scored(ok, [1, 2, 3], "stop")]
    assert best_passing_sample(group).completion.token_ids == (1, 2, 3)
    assert best_passing_sample(group[:1]) is None


@pytest.mark.slow
def test_token_mean_is_one_mean_over_the_step_not_per_micro_batch(tmp_path, pool):
    """Uneven micro-batches (different completion lengths): the step's gradient is that of one token-mean
    over all of its tokens; micro-token-mean (TRL's bnpo) averages the micro-batch means instead."""
    settings = {
        "dual_source.teacher_sft_weight": 0.0,
        "dual_source.self_sft_weight": 0.0,
        "grpo.kl_coef": 0.0,
        "training.max_grad_norm": 0.0,
    }
    for mode in ("token-mean", "micro-token-mean"):
        trainer = make_trainer(tmp_path / mode, pool, **settings, **{"grpo.loss_aggregation": mode})
        groups, rollout_metrics = trainer.collect_rollouts()
        samples = [s for g in groups for s in g]
        lengths = [sum(samples[k].completion.num_tokens for k in range(i, len(samples), 2)) for i in (0, 1)]
        assert lengths[0] != lengths[1]  # the two micro-batches hold different numbers of tokens
        correctness = torch.tensor([[s.reward.correctness for s in g] for g in groups])
        bonus = torch.tensor([[0.1 * s.reward.format for s in g] for g in groups])
        advantages = group_advantages(correctness, scale=trainer.grpo.scale_rewards, bonus=bonus)[0].reshape(-1)
        pad = trainer.tokenizer.pad_token_id
        if mode == "token-mean":
            parts = [(list(range(len(samples))), 1.0)]  # one batch of every sample, one token-mean
        else:
            parts = [(list(range(i, len(samples), 2)), 0.5) for i in (0, 1)]  # each micro-batch's mean, averaged
        for rows, weight in parts:
            batch = pad_rollout_batch([samples[k].completion for k in rows], pad)
            logp = completion_logprobs(trainer.model, batch)
            loss, _ = grpo_loss(logp, logp.detach(), advantages[rows], batch["completion_mask"])
            (weight * loss).backward()
        expected = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
        trainer.model.zero_grad(set_to_none=True)
        captured = _grads_at_step(trainer)
        trainer.train_on_rollouts(groups, rollout_metrics)
        for name, grad in expected.items():
            assert torch.allclose(captured[name], grad, rtol=1e-4, atol=1e-8), (mode, name)


def test_best_passing_sample_prefers_the_shortest():
    ok = types.SimpleNamespace(passed=True)
    bad = types.SimpleNamespace(passed=False)
    group = [_scored(bad, [1], "stop"), _scored(ok, [1, 2, 3], "stop"), _scored(ok, [1, 2], "stop")]
    assert best_passing_sample(group).completion.token_ids == (1, 2)
    assert best_passing_sample([_scored(bad, [1], "stop")]) is None


def test_teacher_examples_are_filtered(tmp_path):
    rows = [
        {"task_id": "a/1", "prompt": "p", "thinking": "t", "code": "x = 1", "passed": True},
        {"task_id": "a/2", "prompt": "p", "thinking": "t", "code": "x = 1", "passed": False},
        {"task_id": "val/1", "prompt": "p", "thinking": "t", "code": "x = 1", "passed": True},
        {"task_id": "a/3", "prompt": "p", "thinking": "", "code": None, "passed": False},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({**r, "sample_idx": 0}) + "\n" for r in rows) + '{"torn')
    assert [e.task_id for e in load_teacher_examples(path, {"a/1", "a/2", "a/3"}, True)] == ["a/1"]
    assert [e.task_id for e in load_teacher_examples(path, {"a/1", "a/2", "a/3"}, False)] == ["a/1", "a/2"]
    assert load_teacher_examples(tmp_path / "missing.jsonl", {"a/1"}, True) == []


def test_teacher_traces_of_training_tasks_outside_the_rollout_file_are_kept(tmp_path):
    # GRPO's rollout tasks may be a subset (a pass-rate band) of the training split; the teacher's references of
    # the other training tasks are what teacher-SFT is for. Only the evaluation split's traces stay out.
    rows = [
        {"task_id": "a/1", "prompt": "p", "thinking": "", "code": "x = 1", "passed": True},
        {"task_id": "a/2", "prompt": "p", "thinking": "", "code": "x = 2", "passed": True},
        {"task_id": "val/1", "prompt": "p", "thinking": "", "code": "x = 3", "passed": True},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({**r, "sample_idx": 0}) + "\n" for r in rows))
    kept = load_teacher_examples(path, {"a/1"}, True, held_out={"val/1"})
    assert [e.task_id for e in kept] == ["a/1", "a/2"]
    assert [e.task_id for e in load_teacher_examples(path, {"a/1"}, True)] == ["a/1"]  # no split known: as before


def tiny_phase3_argv(tmp_path) -> list[str]:
    """Phase 1 into tmp_path/data, and phase 3's flags for 2 steps of the tiny model into tmp_path/out."""
    import phase1_prepare_data as phase1
    from config import build_config

    phase1.main(build_config("cpu", overrides=[f"paths.data_dir={tmp_path / 'data'}"]))
    return cpu_argv(
        "--max_steps",
        "2",
        "--output_dir",
        str(tmp_path / "out"),
        "--train_file",
        str(tmp_path / "data" / "train.jsonl"),
        "--teacher_traces",
        str(tmp_path / "none.jsonl"),
        sets=[TINY_STUDENT, "grpo.max_new_tokens=8", "dual_source.teacher_sft_weight=0"],
    )


@pytest.mark.slow
def test_phase3_command_line_on_the_tiny_model(tmp_path):
    out = tmp_path / "out"
    proc = run_script("phase3_train_grpo.py", *tiny_phase3_argv(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "teacher-SFT term off" in proc.stdout
    for name in (
        "final_model/adapter_config.json",
        "final_model/tgrpo_config.json",
        "metrics.jsonl",
        "config.json",
        "training_curves.png",
        "teacher_data.json",
    ):
        assert (out / name).is_file(), name
    assert json.loads((out / "teacher_data.json").read_text())["usable_traces"] == 0  # what teacher-SFT trained on
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    needed = {
        "reward/mean",
        "reward/std",
        "pass_rate",
        "update/skipped",
        "frac_reward_zero_std",
        "completion/mean_length",
        "self_sft/samples",
        "time/rollout_s",
        "time/reward_s",
        "time/update_s",
        "tokens_per_s",
        "lr",
    }
    assert all(needed <= set(row) for row in rows)
    # a step that was taken logs its loss terms (one without signal beyond the format bonus is skipped)
    taken = {"loss/grpo", "loss/total", "weight/grpo", "kl", "clip_ratio/low_mean"}
    assert all(taken <= set(row) for row in rows if row["update/skipped"] == 0.0)
    bad = run_script("phase3_train_grpo.py", *cpu_argv("--train_file", str(tmp_path / "x.jsonl")))
    assert bad.returncode == 1 and "x.jsonl: file not found" in bad.stderr


def test_resume_errors_name_the_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint-") as missing:
        resolve_checkpoint(tmp_path, "latest")
    assert "without --resume_from_checkpoint" in str(missing.value)  # says what to do
    with pytest.raises(FileNotFoundError, match="not a checkpoint folder"):
        resolve_checkpoint(tmp_path, str(tmp_path))


@pytest.mark.slow
def test_metrics_reach_the_accelerator_trackers(tmp_path, pool):
    """training.logging_backends go through accelerate's trackers: config stored once, every step logged."""
    from accelerate import Accelerator
    from accelerate.tracking import GeneralTracker

    from training.metric_sinks import tracker_run_name

    class Recorder(GeneralTracker):
        name = "recorder"
        requires_logging_directory = False

        def __init__(self):
            super().__init__()
            self.config, self.logged, self.finished = None, [], False

        @property
        def tracker(self):
            return self

        def store_init_configuration(self, values):
            self.config = values

        def log(self, values, step=None, **kwargs):
            self.logged.append((step, values))

        def finish(self):
            self.finished = True

    recorder = Recorder()
    overrides = {"training.max_steps": 2, "training.save_steps": 0}
    accelerator = Accelerator(cpu=True, log_with=[recorder])
    trainer = scripted_trainer(tmp_path / "out", pool, accelerator=accelerator, **overrides)
    trainer.train()
    assert [step for step, _ in recorder.logged] == [1, 2] and "reward/mean" in recorder.logged[0][1]
    assert recorder.config["lora.r"] == trainer.parts.files.config.lora.r and recorder.finished
    assert tracker_run_name(trainer.parts.files.config, tmp_path / "out") == "out"
    assert tracker_run_name(tiny_config(tmp_path, **{"training.run_name": "exp-7"}), tmp_path) == "exp-7"


@pytest.mark.slow
def test_a_finished_run_can_be_extended(tmp_path, pool):
    # save_steps 3 does not divide max_steps 2: the last step is checkpointed anyway (as HF Trainer does)
    make_trainer(tmp_path, pool, **{"training.max_steps": 2, "training.save_steps": 3}).train()
    assert (tmp_path / "out" / "checkpoint-2" / "trainer_state.json").is_file()
    longer = make_trainer(tmp_path, pool, **{"training.max_steps": 3, "training.save_steps": 3})
    longer.train(resume_from="latest")
    assert longer.state.global_step == 3
    steps = [json.loads(line)["step"] for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


@pytest.mark.slow
def test_reused_rollouts_start_at_ratio_one_with_lora_dropout_and_then_clip(tmp_path, pool):
    """mu = 2 with LoRA dropout 0.5: the RL forwards must see the policy without dropout."""
    trainer = make_trainer(
        tmp_path, pool, dropout=0.5, **{"grpo.num_iterations": 2, "grpo.clip_range": 0.02, "training.max_steps": 4}
    )
    assert any(isinstance(m, torch.nn.Dropout) and m.p == 0.5 for m in trainer.model.modules())
    # the first batch moves LoRA B away from 0 (before that, dropout on the adapter input changes nothing)
    warm, _ = trainer.train_on_rollouts(*trainer.collect_rollouts())
    assert warm["ratio/mean"] == pytest.approx(1.0, abs=1e-6)
    first, second = trainer.train_on_rollouts(*trainer.collect_rollouts())  # the model is in train mode now
    assert first["ratio/mean"] == pytest.approx(1.0, abs=1e-6)  # old log-probs == current ones before any update
    assert first["clip_ratio/low_mean"] == 0.0 and first["clip_ratio/high_mean"] == 0.0
    assert second["ratio/mean"] != pytest.approx(1.0, abs=1e-6)  # the first step moved the policy
    assert second["clip_ratio/low_mean"] + second["clip_ratio/high_mean"] > 0  # and clipping engages
    assert any(isinstance(m, torch.nn.Dropout) and m.p == 0.5 for m in trainer.model.modules())  # SFT keeps it


def test_logprobs_divide_by_the_temperature_in_float32():
    torch.manual_seed(3)
    logits = (torch.randn(2, 5, 300) * 8).to(torch.bfloat16)  # what a bf16 model returns, (B, P + T, V)

    class BF16Model:
        def __call__(self, input_ids, attention_mask, position_ids, logits_to_keep):
            return types.SimpleNamespace(logits=logits[:, -logits_to_keep:])

    batch = {
        "input_ids": torch.zeros(2, 5, dtype=torch.long),
        "attention_mask": torch.ones(2, 5, dtype=torch.long),
        "position_ids": torch.arange(5).repeat(2, 1),
        "completion_ids": torch.tensor([[1, 2, 3], [4, 5, 6]]),
        "completion_mask": torch.ones(2, 3, dtype=torch.long),
    }
    got = completion_logprobs(BF16Model(), batch, temperature=0.7)
    exact = (
        torch.log_softmax(logits[:, 1:-1].float() / 0.7, -1)
        .gather(-1, batch["completion_ids"].unsqueeze(-1))
        .squeeze(-1)
    )
    assert torch.allclose(got, exact, atol=1e-5)


def test_teacher_traces_that_do_not_fit_are_dropped_and_counted(tmp_path, pool):
    probe = make_trainer(tmp_path / "probe", pool)
    lengths = sorted(len(e["input_ids"]) for e in probe.teacher_sft)
    limit = lengths[len(lengths) // 2]  # about half the traces fit
    trainer = make_trainer(tmp_path, pool, **{"dual_source.sft_max_length": limit})
    kept = sum(n <= limit for n in lengths)
    assert 0 < kept < len(lengths)
    assert trainer.teacher_stats["teacher_sft/dropped_too_long"] == pytest.approx(1 - kept / len(lengths))
    batch = trainer._teacher_batch()
    for row, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True):
        assert row[int(mask.sum()) - 1] == end_of_turn_id(trainer.tokenizer)  # whole targets only: each ends its turn
    metrics = trainer.train_on_rollouts(*trainer.collect_rollouts())[0]
    assert metrics["teacher_sft/dropped_too_long"] == trainer.teacher_stats["teacher_sft/dropped_too_long"]
    assert "teacher_sft/over_rollout_budget" in metrics


def test_a_program_that_breaks_the_harness_twice_scores_as_a_failure(tmp_path, pool, monkeypatch):
    import training.scoring as scoring  # where the trainer scores a rollout batch

    real = scoring.execute_many
    calls = []

    def flaky(jobs, *args, **kwargs):
        results = real(jobs, *args, **kwargs)
        calls.append(len(jobs))
        broken = [0, 1] if len(calls) == 1 else [0]  # sample 0 breaks it twice, sample 1 only the first time
        return [
            dataclasses.replace(r, status="sandbox_error", passed=False, tests_passed=0) if i in broken else r
            for i, r in enumerate(results)
        ]

    monkeypatch.setattr(scoring, "execute_many", flaky)
    trainer = make_trainer(tmp_path, pool)
    groups, metrics = trainer.collect_rollouts()
    assert calls[1] == 2  # the two harness failures were re-run once
    first, second = groups[0][0], groups[0][1]
    assert first.result.status == "sandbox_error" and first.reward.correctness == 0.0  # a failure, not unscorable
    assert second.result.status != "sandbox_error" and second.reward.correctness is not None
    n = sum(len(g) for g in groups)
    assert metrics["sandbox/error_retried"] == pytest.approx(2 / n) and metrics[
        "sandbox/error_confirmed"
    ] == pytest.approx(1 / n)


# ---------------------------------------------------------------- resuming on other hardware (GPU review 4-6)


def saved_then_fresh(tmp_path, pool):
    trainer = make_trainer(tmp_path, pool, **{"training.max_steps": 10})
    trainer.train_on_rollouts(*trainer.collect_rollouts())
    path = trainer.save_checkpoint()
    return path, make_trainer(tmp_path, pool, **{"training.max_steps": 10})


def test_resume_maps_every_saved_tensor_to_the_cpu_first(tmp_path, pool, monkeypatch):
    """Rank 0 saved its optimizer state from cuda:0; loaded without map_location, every rank would put a copy on
    GPU 0 (a CUDA context and the whole state there) before load_state_dict moves it to the rank's device."""
    path, fresh = saved_then_fresh(tmp_path, pool)
    real_load, locations = torch.load, {}

    def recording_load(file, *args, **kwargs):
        locations[getattr(file, "name", str(file))] = kwargs.get("map_location")
        return real_load(file, *args, **kwargs)

    monkeypatch.setattr(torch, "load", recording_load)
    fresh.load_checkpoint(path)
    assert {"optimizer.pt", "scheduler.pt", "rank-0.pt"} <= {name.rsplit("/", 1)[-1] for name in locations}
    assert set(locations.values()) == {"cpu"}, locations


def test_resume_with_fewer_visible_gpus_restores_this_devices_rng_only(tmp_path, pool, monkeypatch):
    """A checkpoint written by a process that saw 4 GPUs, resumed where 2 are visible: torch's
    set_rng_state_all indexes a generator per saved state and raises IndexError; only this process's device
    state is needed."""
    path, fresh = saved_then_fresh(tmp_path, pool)
    rank_state = torch.load(path / "rank-0.pt", weights_only=False)
    states = [torch.full((8,), i, dtype=torch.uint8) for i in range(4)]
    torch.save({**rank_state, "cuda": states}, path / "rank-0.pt")  # the old format: one state per visible GPU
    restored = []

    def set_rng_state_all(all_states):
        if len(all_states) > 2:
            raise IndexError("tuple index out of range")  # torch/cuda/random.py with 2 default generators

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", set_rng_state_all)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": restored.append((state, device)))
    fresh.load_checkpoint(path)
    assert len(restored) == 1 and restored[0][1] == 1 and torch.equal(restored[0][0], states[1])


def test_resume_with_another_number_of_processes_is_refused(tmp_path, pool):
    """The data position (rollout batches x prompts x processes) and an epoch run's total steps depend on the
    number of processes; resuming a 2-process checkpoint in 1 process would re-train seen prompts and move the
    LR schedule, silently."""
    from training.checkpointing import CheckpointMismatchError

    path, fresh = saved_then_fresh(tmp_path, pool)
    saved = json.loads((path / "trainer_state.json").read_text())
    (path / "trainer_state.json").write_text(json.dumps({**saved, "num_processes": 2}))
    torch.save(torch.load(path / "rank-0.pt", weights_only=False), path / "rank-1.pt")
    with pytest.raises(CheckpointMismatchError, match=r"2 processes.*--num_processes 2"):
        fresh.load_checkpoint(path)
    assert fresh.state.global_step == 0  # nothing was restored


def test_metrics_jsonl_holds_strict_json_only(tmp_path, pool):
    trainer = make_trainer(tmp_path, pool, **{"training.max_steps": 1})
    (tmp_path / "out").mkdir(parents=True, exist_ok=True)
    trainer.sinks.open(0)
    trainer.sinks.write({"step": 1, "entropy/token_mean": float("nan"), "grad_norm": float("inf"), "lr": 0.1234567891})
    text = (tmp_path / "out" / "metrics.jsonl").read_text()
    row = json.loads(text, parse_constant=lambda name: pytest.fail(f"bare {name} in metrics.jsonl"))
    assert row == {"step": 1, "entropy/token_mean": None, "grad_norm": None, "lr": 0.123457}


@pytest.mark.slow
def test_two_runs_into_one_output_folder_the_second_is_refused_naming_the_first(tmp_path):
    import os
    import signal
    import subprocess
    import time

    from utils.run_lock import LOCK_NAME, folder_lock, refuse_if_busy

    out = tmp_path / "out"
    argv = tiny_phase3_argv(tmp_path)
    first = start_script("phase3_train_grpo.py", *argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / LOCK_NAME).is_file() or not (out / LOCK_NAME).read_text():
            assert first.poll() is None and time.monotonic() < deadline, "the first run never took the lock"
            time.sleep(0.2)
        # paused while the second starts, however fast the first would otherwise finish
        os.kill(first.pid, signal.SIGSTOP)
        try:
            second = run_script("phase3_train_grpo.py", *argv, timeout=300)
        finally:
            os.kill(first.pid, signal.SIGCONT)
        assert second.returncode == 1
        line = second.stderr.strip().splitlines()[-1]
        assert line.startswith("error:") and "in use by another run" in line and f"pid {first.pid}" in line
        assert "Traceback" not in second.stderr
    finally:
        stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]  # one writer: no interleaved rows
    # released at the end (the lock file with the first run's record stays): the next run may take the folder, by
    # the two calls phase 3 makes before it reads and before it writes
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == first.pid
    refuse_if_busy(out)
    with folder_lock(out):
        pass


def test_a_folder_another_run_is_writing_is_refused_as_busy_even_once_it_holds_checkpoints(tmp_path):
    # the running job's checkpoints are not "an earlier run": the busy message must win, whatever the timing
    import phase3_train_grpo as phase3
    from config import build_config
    from utils.run_lock import folder_lock

    out = tmp_path / "out"
    config = build_config("cpu", overrides=[f"paths.output_dir={out}", "dual_source.teacher_sft_weight=0"])
    with folder_lock(out):
        (out / "checkpoint-2").mkdir()
        with pytest.raises(phase3.FolderBusyError, match="in use by another run"):
            phase3.check_run_setup(config, None, tmp_path / "none.jsonl", False)
    with pytest.raises(phase3.RunSetupError, match="already holds a run"):  # released: now it is an earlier run
        phase3.check_run_setup(config, None, tmp_path / "none.jsonl", False)


def test_a_student_the_kv_sampler_cannot_run_is_one_error_line(tmp_path, gelu_model_dir, capsys):
    import phase3_train_grpo as phase3

    argv = tiny_phase3_argv(tmp_path)
    code = phase3.cli([*argv, "--set", f"student.model_name={gelu_model_dir}", "--set", "grpo.rollout_backend=kv"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.strip().splitlines()[-1].startswith("error: the kv-cache sampler does not implement hidden_act 'gelu'")
    assert "Traceback" not in err


@pytest.mark.slow
def test_the_reference_forward_runs_while_the_sandbox_scores(tmp_path, pool, monkeypatch):
    """The KL term's reference log-probs need only the token ids: they are computed while the sandbox scores the
    rollout batch (the accelerator would otherwise idle until the slowest program ends), the plan takes them as
    they are, and they equal what the plan computes after scoring."""
    import threading

    import training.rollout_batches as trainer_module  # where a rollout batch is scored
    from training.update_plan import plan_update

    trainer = make_trainer(tmp_path, pool)  # kl_coef 0.05: a reference forward per micro-batch
    forward_started = threading.Event()
    trainer.model.get_input_embeddings().register_forward_pre_hook(lambda *args: forward_started.set())
    real_score, seen = trainer_module.score_rollouts, {}

    def score_rollouts(*args, **kwargs):
        seen["forward while scoring"] = forward_started.wait(timeout=30)  # returns at once when it started
        return real_score(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "score_rollouts", score_rollouts)
    groups, metrics = trainer.collect_rollouts()
    assert seen["forward while scoring"]
    assert metrics["time/score_s"] >= 0 and metrics["time/logprobs_s"] >= 0
    forwards = trainer._forwards
    assert forwards is not None and len(forwards.ref_logps) == trainer.micro_batches

    def plan(precomputed):
        return plan_update(
            groups,
            trainer.model,
            pad_id=trainer.tokenizer.pad_token_id,
            device="cpu",
            grpo=trainer.grpo,
            num_slots=trainer.micro_batches,
            forward_chunk_size=trainer.training.forward_chunk_size,
            self_batch=None,
            num_self_examples=0,
            shared_prompt=trainer.training.shared_prompt_forward,
            forwards=precomputed,
        )

    overlapped, sequential = plan(forwards), plan(None)
    assert overlapped.ref_logps is forwards.ref_logps  # taken, not computed again
    for ours, theirs, batch in zip(overlapped.ref_logps, sequential.ref_logps, sequential.batches, strict=True):
        mask = batch["completion_mask"].bool()
        assert torch.allclose(ours[mask], theirs[mask], atol=1e-6)
    assert trainer.train_on_rollouts(groups, metrics)[0]["kl"] == 0.0  # the first step: policy == reference


def test_dynamic_filtering_computes_the_reference_after_scoring(tmp_path, pool):
    """Dynamic filtering picks the micro-batches from the rewards: nothing is computed beside the scoring."""
    trainer = make_trainer(tmp_path, pool, **{"grpo.dynamic_filtering": True})
    assert not trainer.forwards_while_scoring
    groups, metrics = trainer.collect_rollouts()
    assert trainer._forwards is None and "time/logprobs_s" not in metrics and metrics["time/score_s"] >= 0
