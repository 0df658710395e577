"""Run by tests/e2e/test_trainer_ddp.py under `accelerate launch --multi_gpu --num_processes 2` (gloo on CPU):
two optimizer steps of the trainer, then each rank saves what the test compares.

`even`: a linearly decaying learning rate (the logged `lr` sequence must be the 1-process one), and
after training each rank reloads the final checkpoint, which must give it back its own RNG states,
teacher-sampling RNG and self-SFT buffer (not rank 0's).

`uneven`: rank 1 only ever samples wrong code and the GRPO term drops zero-variance groups,
teacher- and self-SFT off, so rank 1 has no loss term at all while rank 0 has several; the ranks must
still meet in the gradient all-reduce (and end identical) instead of hanging, and the first step's
synchronized gradient must be that of one token-mean over the kept samples of both ranks."""

import sys
from pathlib import Path

import torch
from accelerate import Accelerator

from tests.trainer_helpers import (
    ScriptedRollout,
    lora_state,
    small_tasks,
    teacher_examples,
    tiny_config,
    tiny_lora_student,
)
from training.checkpointing import resolve_checkpoint
from training.grpo_trainer import GRPOTrainer
from training.setup import build_run


def main(out_dir: str, uneven: bool = False) -> None:
    accelerator = Accelerator(cpu=True)
    overrides: dict[str, object] = {"training.max_steps": 2, "training.save_steps": 0, "sandbox.max_workers": 1}
    if uneven:
        overrides.update(
            {
                "grpo.dynamic_filtering": True,
                "dual_source.teacher_sft_weight": 0.0,
                "dual_source.self_sft_weight": 0.0,
                "grpo.kl_coef": 0.0,
                "training.max_grad_norm": 0.0,
            }
        )
    else:
        overrides.update({"training.lr_scheduler": "linear"})
    config = tiny_config(out_dir, **overrides)
    torch.manual_seed(1234 + accelerator.process_index)  # ranks sample differently; DDP must still agree
    model, tokenizer = tiny_lora_student(config, adapter_seed=0)  # identical adapter on every rank
    torch.manual_seed(1234 + accelerator.process_index)
    tasks = small_tasks(16)  # more tasks than one rollout batch of both ranks: no epoch wrap
    rollout = ScriptedRollout(
        tokenizer, {t.problem: t for t in tasks}, always_wrong=uneven and accelerator.process_index == 1
    )
    parts = build_run(
        config,
        tasks=tasks,
        teacher_examples=teacher_examples(tasks),
        output_dir=out_dir,
        model=model,
        tokenizer=tokenizer,
        accelerator=accelerator,
        rollout=rollout,
    )
    trainer = GRPOTrainer(parts)
    first: dict = {}
    real_collect, real_step = trainer.collect_rollouts, trainer.optimizer.step

    def collect():
        groups, metrics = real_collect()
        first.setdefault(
            "samples",
            [
                [
                    {
                        "prompt_ids": list(s.completion.prompt_ids),
                        "token_ids": list(s.completion.token_ids),
                        "correctness": s.reward.correctness,
                        "format": s.reward.format,
                    }
                    for s in g
                ]
                for g in groups
            ],
        )
        return groups, metrics

    def step(*args, **kwargs):
        first.setdefault(
            "grads", {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
        )
        return real_step(*args, **kwargs)

    trainer.collect_rollouts, trainer.optimizer.step = collect, step  # type: ignore[method-assign]
    trainer.train()
    rank = accelerator.process_index
    assert trainer.rollouts is not None
    result = {
        "lora": lora_state(accelerator.unwrap_model(trainer.model)),
        "prompts": trainer.rollouts.maker.batch_indices(0)[accelerator.process_index],
        "world": accelerator.num_processes,
        **first,
    }
    if not uneven:
        saved = {
            "teacher": trainer.teacher_rng.getstate(),
            "torch": torch.get_rng_state(),
            "buffer": trainer.buffer.state(),
        }
        trainer.teacher_rng.seed(999)  # forget this rank's state, then get it back from the checkpoint
        torch.manual_seed(999)
        trainer.buffer.load([])
        trainer.load_checkpoint(resolve_checkpoint(trainer.output_dir, "latest"))
        result["saved"] = saved
        result["reloaded"] = {
            "teacher": trainer.teacher_rng.getstate(),
            "torch": torch.get_rng_state(),
            "buffer": trainer.buffer.state(),
        }
        result["teacher_draw"] = trainer.teacher_rng.random()
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")


if __name__ == "__main__":
    main(sys.argv[1], uneven=sys.argv[2:] == ["uneven"])
