"""Run by tests/test_trainer_ddp.py under `accelerate launch --multi_gpu --num_processes 2` (gloo on CPU):
two optimizer steps of the trainer, then each rank saves its LoRA weights for comparison.

`uneven` as the second argument: rank 1 only ever samples wrong code and the GRPO term drops
zero-variance groups, teacher-SFT off, so rank 1 has no loss term at all while rank 0 has several;
the ranks must still meet in the gradient all-reduce (and end identical) instead of hanging."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402

from tests.trainer_helpers import ScriptedRollout, lora_state, small_tasks, teacher_examples, tiny_config  # noqa: E402
from training.grpo_trainer import GRPOTrainer  # noqa: E402
from utils.student_model import attach_lora, load_student  # noqa: E402


def main(out_dir: str, uneven: bool = False) -> None:
    accelerator = Accelerator(cpu=True)
    overrides = {"training.max_steps": 2, "training.save_steps": 0, "sandbox.max_workers": 1}
    if uneven:
        overrides.update({"grpo.dynamic_filtering": True, "dual_source.teacher_sft_weight": 0.0})
    config = tiny_config(out_dir, **overrides)
    torch.manual_seed(1234 + accelerator.process_index)  # ranks sample differently; DDP must still agree
    model, tokenizer = load_student(config.student.model_name, "float32", device="cpu")
    torch.manual_seed(0)  # identical adapter initialisation on every rank
    model = attach_lora(model, config.lora.r, config.lora.lora_alpha, 0.0, config.lora.target_modules)
    torch.manual_seed(1234 + accelerator.process_index)
    tasks = small_tasks(16)  # more tasks than one rollout batch of both ranks: no epoch wrap
    trainer = GRPOTrainer(config, model, tokenizer, tasks, teacher_examples(tasks), out_dir, accelerator,
                          rollout=ScriptedRollout(tokenizer, {t.problem: t for t in tasks},
                                                  always_wrong=uneven and accelerator.process_index == 1))
    trainer.train()
    rank = accelerator.process_index
    seen = trainer._prompt_indices(0)
    torch.save({"lora": lora_state(accelerator.unwrap_model(trainer.model)), "prompts": seen,
                "world": accelerator.num_processes}, Path(out_dir) / f"rank{rank}.pt")


if __name__ == "__main__":
    main(sys.argv[1], uneven=sys.argv[2:] == ["uneven"])
