"""The curriculum inside the trainer: all-fail tasks are skipped, the filter is logged and checkpointed."""

from __future__ import annotations

import json

import pytest
import torch

from training.curriculum import order_position


@pytest.mark.slow
def test_the_trainer_skips_all_fail_tasks_logs_the_filter_and_checkpoints_it(tmp_path, pool):
    from tests.trainer_helpers import ScriptedRollout, small_tasks, teacher_examples, tiny_config
    from training.checkpointing import resolve_checkpoint
    from training.grpo_trainer import GRPOTrainer
    from training.setup import build_run
    from utils.student_model import attach_lora, load_student

    def trainer(folder):
        config = tiny_config(
            folder, **{"curriculum.enabled": "true", "curriculum.revisit_after": 0, "training.max_steps": 2}
        )
        torch.manual_seed(0)
        model, tokenizer = load_student(config.student.model_name, "float32", device="cpu")
        model = attach_lora(model, config.lora.r, config.lora.lora_alpha, 0.0, config.lora.target_modules)
        tasks = small_tasks(6)
        rollout = ScriptedRollout(tokenizer, {t.problem: t for t in tasks}, always_wrong=True)
        parts = build_run(
            config,
            tasks=tasks,
            teacher_examples=teacher_examples(tasks),
            output_dir=folder,
            model=model,
            tokenizer=tokenizer,
            rollout=rollout,
            pool=pool,
        )
        return GRPOTrainer(parts)

    t = trainer(tmp_path / "out")
    assert t.curriculum is not None
    batches: list[list[int]] = []
    draw = t.curriculum.draw

    def recording_draw(count):
        chosen, metrics = draw(count)
        batches.append(chosen)
        return chosen, metrics

    t.curriculum.draw = recording_draw
    t.train()
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    first, second = rows
    assert first["curriculum/skipped"] == 0 and first["curriculum/zero_spread_share"] == 1.0
    assert first["curriculum/settled_all_fail"] == 4  # the first batch's 4 tasks: every sample failed
    # batch 2: the epoch's last 2 tasks, then the next epoch's order without the 4 settled tasks
    assert not set(batches[1]) & set(batches[0]) and second["curriculum/skipped"] >= 1
    assert second["curriculum/settled_all_fail"] == 6 and all(t.curriculum.history)
    plain = [order_position(t.training.seed, 6, p) for p in range(4, 8)]  # what the plain order draws
    assert second["curriculum/settled_share_plain_draw"] == sum(i in batches[0] for i in plain) / 4
    # every task is settled (never revisited): the next draw skips them all and is forced to fill the batch
    state = t.curriculum.state()
    resumed = trainer(tmp_path / "out")
    resumed.load_checkpoint(resolve_checkpoint(tmp_path / "out", "latest"))
    assert resumed.curriculum is not None and resumed.curriculum.state() == state
    _, metrics = resumed.curriculum.draw(4)
    assert metrics["curriculum/skipped"] >= 6 and metrics["curriculum/forced"] == 4
