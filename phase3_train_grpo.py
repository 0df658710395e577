"""Phase 3: train the LoRA student with GRPO (sandbox rewards) + teacher-SFT + self-SFT.

    python phase3_train_grpo.py                                   # the resolved preset's settings
    python phase3_train_grpo.py --max_steps 8 --preset cpu        # a short CPU run
    python phase3_train_grpo.py --resume_from_checkpoint latest   # continue exactly where it stopped
    accelerate launch --num_processes 4 phase3_train_grpo.py      # data-parallel on 4 GPUs

Reads data/train.jsonl and data/teacher_traces.jsonl; writes outputs/checkpoint-*/,
outputs/final_model/ (adapter + tokenizer + config), outputs/metrics.jsonl, outputs/config.json and
outputs/training_curves.png.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from config import (
    Config,
    add_config_arguments,
    config_from_args_or_exit,
)
from synthesis.generate_traces import load_teacher_examples
from training.grpo_trainer import GRPOTrainer
from training.plot import plot_metrics
from training.rollout import HFRollout, VLLMRollout
from utils.dataset_loader import DataFormatError, read_tasks
from utils.student_model import ModelLoadError, attach_lora, load_student, resolve_model_path


def build_rollout(config: Config, tokenizer, output_dir: Path):
    g = config.grpo
    template = {"enable_thinking": config.student.enable_thinking}
    if g.rollout_backend == "vllm":
        return VLLMRollout(resolve_model_path(config.student.model_name, config.paths.model_cache_dir), tokenizer,
                           output_dir / ".vllm_adapters", config.lora.r, g.max_new_tokens, g.temperature, g.top_p,
                           g.gen_update_steps, g.vllm_gpu_memory_utilization, config.student.torch_dtype, template)
    return HFRollout(tokenizer, g.max_new_tokens, g.temperature, g.top_p, template,
                     batch_size=config.training.per_device_train_batch_size * g.num_samples_per_prompt)


def main(config: Config, resume_from: str | None = None, teacher_traces: Path | None = None,
         train_file: Path | None = None) -> dict:
    from accelerate import Accelerator
    from transformers import set_seed

    set_seed(config.training.seed)
    accelerator = Accelerator(cpu=config.student.torch_dtype == "float32" and not _has_cuda())
    output_dir = Path(config.paths.output_dir)
    tasks = read_tasks(train_file or config.paths.train_file)
    traces = teacher_traces or config.paths.teacher_traces_file
    teacher_examples = load_teacher_examples(Path(traces), {t.task_id for t in tasks},
                                             config.dual_source.teacher_sft_only_passed)
    if accelerator.is_main_process:
        print(f"{len(tasks)} training tasks; {len(teacher_examples)} usable teacher traces from {traces}"
              + ("" if teacher_examples else " (teacher-SFT term off: run phase 2 first for teacher traces)"))
    model, tokenizer = load_student(config.student.model_name, config.student.torch_dtype, config.student.load_in_8bit,
                                    config.paths.model_cache_dir, device=accelerator.device)
    lora = config.lora
    model = attach_lora(model, lora.r, lora.lora_alpha, lora.lora_dropout, lora.target_modules)
    if accelerator.is_main_process:
        model.print_trainable_parameters()
    trainer = GRPOTrainer(config, model, tokenizer, tasks, teacher_examples, output_dir, accelerator,
                          rollout=build_rollout(config, tokenizer, output_dir))
    summary = trainer.train(resume_from)
    if accelerator.is_main_process:
        png = plot_metrics(output_dir / "metrics.jsonl", output_dir / "training_curves.png")
        print(f"\nfinal adapter: {output_dir / 'final_model'}; metrics: {output_dir / 'metrics.jsonl'}; curves: {png}")
    return summary


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, dict]:
    parser = argparse.ArgumentParser(
        description="Phase 3: GRPO on sandbox rewards + teacher-SFT on verified traces + self-SFT on the student's own "
        "best passing samples, training a LoRA adapter on the student.",
    )
    parser.add_argument("--max_steps", type=int, help="Stop after N optimizer steps (training.max_steps; overrides epochs).")
    parser.add_argument("--output_dir", help="Checkpoints, final model and metrics go here (paths.output_dir).")
    parser.add_argument("--teacher_traces", help="Trace file for teacher-SFT (default data/teacher_traces.jsonl).")
    parser.add_argument("--train_file", help="Task file (default data/train.jsonl).")
    parser.add_argument("--resume_from_checkpoint", metavar="latest|PATH",
                        help="Continue from the newest checkpoint in --output_dir ('latest') or from PATH: same step, "
                        "learning rate, data order and random state.")
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    extra: dict = {}
    if args.max_steps is not None:
        extra["training"] = {"max_steps": args.max_steps}
    if args.output_dir:
        extra["paths"] = {"output_dir": args.output_dir}
    return args, extra


if __name__ == "__main__":
    cli_args, flags = parse_args()
    resolved = config_from_args_or_exit(cli_args, flags)
    try:
        main(resolved, cli_args.resume_from_checkpoint, Path(cli_args.teacher_traces) if cli_args.teacher_traces else None,
             Path(cli_args.train_file) if cli_args.train_file else None)
    except (DataFormatError, ModelLoadError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
