"""Teacher-guided rollouts inside the trainer: an all-fail batch gets guided samples from the teacher's prefix, the
update then has a signal, the metrics and the checkpoint carry the guidance, and the combinations work or refuse."""

from __future__ import annotations

import json

import pytest
import torch

from config import ConfigError
from rollouts.protocol import Continuation
from tests.trainer_helpers import ScriptedRollout, small_tasks, teacher_examples, tiny_config
from training.guidance import answer_ids


class PrefixFinisher(ScriptedRollout):
    """Every first sample is wrong code; a guided sample (prompt + a prefix of a teacher answer) is finished with
    the rest of that answer, so it passes."""

    def __init__(self, tokenizer, tasks_by_problem) -> None:
        super().__init__(tokenizer, tasks_by_problem, always_wrong=True)
        self.max_new_tokens = 64  # the config's grpo.max_new_tokens
        traces = teacher_examples(list(tasks_by_problem.values()))
        self.answers = [answer_ids(tokenizer, trace, thinking) for trace in traces for thinking in (True, False)]
        self.asked: list[tuple[list[int], int]] = []

    def continue_sequences(self, sequences, max_new_tokens, stop_strings):
        out = []
        for sequence, budget in zip(sequences, max_new_tokens, strict=True):
            self.asked.append((sequence, budget))
            answer, cut = max(
                ((a, n) for a in self.answers for n in range(1, len(a)) if sequence[-n:] == a[:n]), key=lambda x: x[1]
            )
            rest = answer[cut:] + [self.tokenizer.convert_tokens_to_ids("<|im_end|>")]
            out.append(Continuation(rest, self.tokenizer.decode(rest, skip_special_tokens=True), "stop"))
        return out


def guided_trainer(folder, pool, **overrides):
    from training.grpo_trainer import GRPOTrainer
    from training.setup import build_run
    from utils.student_model import attach_lora, load_student

    config = tiny_config(folder, **{"guidance.enabled": "true", "training.max_steps": 2, **overrides})
    torch.manual_seed(0)
    model, tokenizer = load_student(config.student.model_name, "float32", device="cpu")
    model = attach_lora(model, config.lora.r, config.lora.lora_alpha, 0.0, config.lora.target_modules)
    tasks = small_tasks(6)
    rollout = PrefixFinisher(tokenizer, {t.problem: t for t in tasks})
    parts = build_run(
        config,
        tasks=tasks,
        teacher_examples=teacher_examples(tasks[:5]),  # the sixth task has no trace: never guided
        output_dir=folder,
        model=model,
        tokenizer=tokenizer,
        rollout=rollout,
        pool=pool,
        teacher_traces="traces.jsonl",
    )
    return GRPOTrainer(parts), rollout


@pytest.mark.slow
def test_all_fail_groups_are_guided_and_give_the_update_a_signal(tmp_path, pool, capsys):
    from training.checkpointing import rank_state_name

    trainer, rollout = guided_trainer(tmp_path / "out", pool, **{"training.save_steps": 1})
    assert "guidance: 1 of 6 training tasks have no passed teacher trace in traces.jsonl" in capsys.readouterr().out
    traced = {t.task_id for t in trainer.tasks[:5]}
    batch = [trainer.tasks[i].task_id for i in trainer.rollouts.maker.batch_indices(0)[0]]
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    first = rows[0]
    # 4 prompts per batch, every first sample wrong: each group of a task with a trace is guided, 2 of its 4 samples
    assert first["pass_rate"] == 0.0 and first["guidance/pass_rate_unguided"] == 0.0
    assert first["guidance/groups"] == sum(t in traced for t in batch) > 0
    assert first["guidance/pass_rate_guided"] == 1.0  # the scripted policy finishes every teacher prefix
    assert first["update/skipped"] == 0.0 and first["loss/grpo"] != 0.0  # the all-fail batch now has a signal
    assert 0 < first["guidance/prefix_fraction_mean"] <= 0.5 + 1e-9
    # every guided row is prompt + prefix, its budget what the prefix leaves of the 64 tokens
    assert rollout.asked and all(budget < 64 for _, budget in rollout.asked)
    # completions.jsonl: every sample trained on, a guided one with the teacher prefix its text starts with
    logged = [json.loads(line) for line in (tmp_path / "out" / "completions.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [1] * 16 + [2] * 16  # 4 prompts x G 4, each step
    guided = [r for r in logged if r["step"] == 1 and r["teacher_prefix_tokens"]]
    assert len(guided) == 2 * first["guidance/groups"]
    assert all(r["text"].startswith(r["teacher_prefix"]) and r["correctness"] == 1.0 for r in guided)
    assert {r["task_id"] for r in guided} <= traced
    # a task guided once, whose 2 guided samples both passed: its share moved from 0.5 to 0.5 + 0.4 x (0.5 - 1)
    once = [
        t
        for t in batch
        if t in traced and t not in [trainer.tasks[i].task_id for i in trainer.rollouts.maker.batch_indices(1)[0]]
    ]
    assert all(trainer.guide.state.fractions[t] == pytest.approx(0.3) for t in once)
    last = rows[-1]
    assert last["guidance/total_guided_groups"] == trainer.guide.state.guided_groups >= first["guidance/groups"]
    assert last["guidance/total_tasks_guided"] == len(trainer.guide.state.guided_tasks)
    assert trainer.guide.state.guided_tasks <= traced
    saved = torch.load(tmp_path / "out" / "checkpoint-2" / rank_state_name(0), weights_only=False)["guidance"]
    assert saved == trainer.guide.state.state()
    resumed, _ = guided_trainer(tmp_path / "out", pool, **{"training.save_steps": 1})
    resumed.load_checkpoint(tmp_path / "out" / "checkpoint-2")
    assert resumed.guide.state == trainer.guide.state


def test_guidance_refuses_multi_turn_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="guidance.enabled cannot be combined with multi_turn.mode=tool"):
        tiny_config(tmp_path, **{"guidance.enabled": "true", "multi_turn.mode": "tool"})
    with pytest.raises(ConfigError, match="guidance.guided_samples=5 is more than a group holds"):
        tiny_config(tmp_path, **{"guidance.enabled": "true", "guidance.guided_samples": 5})
    with pytest.raises(ConfigError, match="guidance.initial_fraction=0.95 must lie between"):
        tiny_config(tmp_path, **{"guidance.enabled": "true", "guidance.initial_fraction": 0.95})


def test_guidance_without_any_passed_trace_is_refused_in_one_line():
    from config import GuidanceConfig
    from training.guidance import build_guide

    with pytest.raises(ValueError, match="none of the 2 training tasks has one in data/t.jsonl"):
        build_guide(
            GuidanceConfig(enabled=True),
            [],
            None,
            task_ids=["a", "b"],
            include_thinking=True,
            budget=8,
            source="data/t.jsonl",
        )


@pytest.mark.slow
def test_guidance_with_dynamic_sampling_and_the_curriculum(tmp_path, pool):
    """Guidance runs in every round before dynamic sampling keeps the groups with spread (a guided group counts
    toward the batch), and the curriculum's estimate of a guided task holds its unguided samples only."""
    trainer, _ = guided_trainer(
        tmp_path / "out",
        pool,
        **{
            "grpo.dynamic_sampling": "true",
            "grpo.dynamic_sampling_max_rounds": 3,
            "curriculum.enabled": "true",
            "curriculum.window": 8,
            "training.max_steps": 1,
        },
    )
    groups, metrics = trainer.collect_rollouts()
    assert metrics["sampling/groups_kept"] == 4 == len(groups)  # every kept group has spread: guided ones
    assert all(any(s.completion.teacher_prefix_tokens for s in g) for g in groups)
    guided = {trainer.tasks.index(g[0].task) for g in groups}
    history = trainer.curriculum.history
    assert all(len(history[i]) % 2 == 0 and set(history[i]) == {0.0} for i in guided)  # 2 unguided zeros per group
    assert metrics["guidance/groups"] > 0


def test_phase3_refuses_guidance_without_a_traces_file_in_one_line(tmp_path):
    import phase3_train_grpo as phase3

    config = tiny_config(tmp_path, **{"guidance.enabled": "true", "dual_source.teacher_sft_weight": 0})
    with pytest.raises(phase3.RunSetupError, match="guidance.enabled needs teacher traces and there are none at"):
        phase3.check_run_setup(config, None, tmp_path / "none.jsonl", False)
