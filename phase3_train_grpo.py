"""Phase 3: train the LoRA student with GRPO (sandbox rewards) + teacher-SFT + self-SFT.

    python phase3_train_grpo.py                                   # the resolved preset's settings
    python phase3_train_grpo.py --max_steps 8 --preset cpu        # a short CPU run
    python phase3_train_grpo.py --resume_from_checkpoint latest   # continue exactly where it stopped
    python phase3_train_grpo.py --mode feedback                   # multi-turn rollouts (tool | feedback)
    accelerate launch --num_processes 4 phase3_train_grpo.py      # data-parallel on 4 GPUs

Reads data/train.jsonl and data/teacher_traces.jsonl; writes outputs/checkpoint-*/,
outputs/final_model/ (adapter + tokenizer + config), outputs/metrics.jsonl, outputs/config.json and
outputs/training_curves.png.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from config import Config, ConfigFlag, check_command_line, phase_command_line, run_phase

FLAGS = (
    ConfigFlag("--max_steps", "training.max_steps"),
    ConfigFlag("--output_dir", "paths.output_dir"),
    ConfigFlag("--mode", "multi_turn.mode"),
)


DESCRIPTION = (
    "Phase 3: GRPO on sandbox rewards + teacher-SFT on verified traces + self-SFT on the student's own "
    "best passing samples, training a LoRA adapter on the student."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--teacher_traces", help="Trace file for teacher-SFT (default: teacher_traces.jsonl in paths.data_dir)."
    )
    parser.add_argument("--train_file", help="Task file (default: train.jsonl in paths.data_dir).")
    parser.add_argument(
        "--overwrite_output_dir",
        action="store_true",
        help="Start a fresh run even though --output_dir holds checkpoints or a final_model of an earlier "
        "one (they are deleted). Without it such a run is refused, so 'latest' never means another run.",
    )
    parser.add_argument(
        "--resume_from_checkpoint",
        metavar="latest|PATH",
        help="Continue from the newest checkpoint in --output_dir ('latest') or from PATH: same step, "
        "learning rate, data order and random state.",
    )


# --help and argument mistakes are answered before the heavy imports below (torch: seconds, more on a busy machine)
if __name__ == "__main__":
    check_command_line(DESCRIPTION, FLAGS, add_arguments)

from clients.openai_compat import TeacherFatalError
from rollouts.from_config import (
    auto_backend_note,
    build_sampler,
    merged_precision_note,
    sample_budget,
    tasks_within_prompt_length,
)
from rollouts.kv_sampler import UnsupportedModelError
from synthesis.generate_traces import held_out_task_ids, load_teacher_examples, teacher_data_record
from training.async_rollouts import ProducerError
from training.checkpointing import (
    CHECKPOINT_PREFIX,
    CheckpointMismatchError,
    DiskFullError,
    checkpoint_folders,
    sweep_temp_folders,
)
from training.export import push_folder
from training.grpo_trainer import GRPOTrainer
from training.launch import LaunchError, check_launch_environment, data_digests, unshared_output_dir
from training.memory_model import hf_prompts_for_run
from training.plot import plot_metrics
from training.rewards import RewardFunctionError, load_reward_functions
from training.run_summary import read_metrics, step_time_split
from training.sampler_guard import SamplerMismatchError
from training.setup import build_accelerator, build_run, build_student
from training.sft_sources import max_scheduled_weight
from training.teacher_logprobs import TeacherScoringError, TokenizerMismatchError
from utils.dataset_loader import DataFormatError, Task, dataset_name_note, read_tasks, require_tasks
from utils.jsonl import write_json_atomic
from utils.run_lock import FolderBusyError, folder_lock, refuse_if_busy
from utils.sft_data import check_thinking_targets
from utils.student_model import ModelLoadError, load_tokenizer


class RunSetupError(ValueError):
    """A problem with what this run was asked to do, found before any model loads; one line, exit 1."""


TRACKER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}  # logging backend -> the package it imports


def previous_run(output_dir: Path) -> list[str]:
    """What an earlier run left in `output_dir` that a new run would confuse with its own."""
    found = sorted(
        (p.name for p in output_dir.glob(f"{CHECKPOINT_PREFIX}*") if p.is_dir()),
        key=lambda n: int(n[len(CHECKPOINT_PREFIX) :]) if n[len(CHECKPOINT_PREFIX) :].isdigit() else -1,
    )
    return found + (["final_model"] if (output_dir / "final_model").is_dir() else [])


def _checkpoint_to_resume(output_dir: Path, spec: str) -> Path | None:
    if spec != "latest":
        return Path(spec)
    found = checkpoint_folders(output_dir)
    return found[-1] if found else None  # none: the trainer reports it


# Keys a checkpoint's adapter and optimizer state depend on: resuming with other values cannot work.
RESUME_KEYS = (("student", "model_name"), ("lora", "r"), ("lora", "lora_alpha"), ("lora", "target_modules"))


def check_run_setup(config: Config, resume_from: str | None, traces: Path, overwrite_output_dir: bool) -> None:
    """Everything that would otherwise fail late (after the model loads) or silently do something else."""
    for backend in config.training.logging_backends:
        package = TRACKER_PACKAGES[backend]
        if importlib.util.find_spec(package) is None:
            raise RunSetupError(
                f"training.logging_backends includes {backend}, but the {package} package is not "
                f"installed: pip install -r requirements-{backend}.txt (or remove {backend})."
            )
    try:  # each function is called once on a probe sample: one that cannot run is refused here
        rewards = load_reward_functions(config.grpo.reward_funcs, config.grpo.reward_weights)
    except RewardFunctionError as error:
        raise RunSetupError(str(error)) from None
    for reward in rewards:
        if reward.form == "conversational" and os.environ.get("RANK", "0") == "0":
            print(
                f"reward function {reward.name}: takes TRL's conversational form, so its prompts and completions "
                "are passed as chat messages ([{'role': 'assistant', 'content': ...}])",
                flush=True,
            )
    ds = config.dual_source
    if ds.teacher_sft_weight > 0 and ds.teacher_sft_batch_size > 0 and not traces.is_file():
        raise RunSetupError(
            f"no teacher traces at {traces}: run phase 2 first, pass --teacher_traces FILE, or train "
            "without teacher-SFT: --set dual_source.teacher_sft_weight=0."
        )
    if config.guidance.enabled and not traces.is_file():
        raise RunSetupError(
            f"guidance.enabled needs teacher traces and there are none at {traces}: run phase 2 first, pass "
            "--teacher_traces FILE, or set guidance.enabled=false."
        )
    adapter = config.teacher.local_adapter
    if ds.opd_weight > 0 and config.teacher.logprob_source == "local" and adapter:
        if not (Path(adapter) / "adapter_config.json").is_file():
            raise RunSetupError(
                f"teacher.local_adapter={adapter} is not a LoRA adapter folder (no adapter_config.json): point it at "
                "a phase 3 final_model or checkpoint-*/adapter, or leave it empty for the bare teacher.model_name."
            )
    if config.grpo.rollout_backend == "vllm_server":
        from clients.openai_compat import models_endpoint_status, not_an_openai_server

        if models_endpoint_status(config.grpo.vllm_server_url) == 404:  # before the model loads
            raise RunSetupError(not_an_openai_server(config.grpo.vllm_server_url, "rollout server"))
    output_dir = Path(config.paths.output_dir)
    if os.environ.get("RANK", "0") == "0":
        refuse_if_busy(output_dir)  # a live run's own checkpoints are not an earlier run
    earlier = previous_run(output_dir)
    if resume_from is None and earlier and not overwrite_output_dir:
        raise RunSetupError(
            f"{output_dir} already holds a run ({', '.join(earlier)}): continue it with "
            "--resume_from_checkpoint latest, start over with --overwrite_output_dir (deletes those), "
            "or pick another --output_dir."
        )
    checkpoint = _checkpoint_to_resume(output_dir, resume_from) if resume_from else None
    if checkpoint is not None and (checkpoint / "config.json").is_file():
        saved = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
        changed = []
        for section, key in RESUME_KEYS:
            ours = getattr(getattr(config, section), key)
            theirs = saved.get(section, {}).get(key, ours)
            if (list(ours) if isinstance(ours, tuple) else ours) != theirs:
                changed.append(f"{section}.{key}={theirs!r} there, {ours!r} here")
        if changed:
            raise RunSetupError(
                f"cannot resume from {checkpoint}: it was trained with other settings "
                f"({'; '.join(changed)}). Resume with its settings, or start a new run in another "
                "--output_dir."
            )


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0")


def check_teacher_gpu(config: Config, device: Any) -> None:
    """On-policy distillation asks the served teacher during the whole of phase 3. A teacher on this machine that
    shares the trainer's GPU (`vllm serve` takes 0.92 of a GPU by default) leaves the update too little memory, and
    it would fail at the first step: refused here when the trainer's GPU has less free memory than phase 3's
    predicted peak (`training.memory_model`, with its CUDA allowance and any colocated vLLM share)."""
    from urllib.parse import urlparse

    teacher = config.teacher
    if config.dual_source.opd_weight <= 0 or teacher.logprob_source != "server" or torch_device_type(device) != "cuda":
        return
    host = urlparse(teacher.api_url).hostname or ""
    if host not in LOOPBACK_HOSTS:
        return
    import torch

    from training import memory_model

    shape = memory_model.student_shape(config.student.model_name, config.paths.model_cache_dir)
    if shape is None:
        return
    free, total = torch.cuda.mem_get_info(device)
    need = memory_model.required_bytes(config, memory_model.estimate(config, shape), total)
    if free < need:
        gb = memory_model.GB
        raise RunSetupError(
            f"on-policy distillation with the teacher at {teacher.api_url}: this process's GPU ({device}) has "
            f"{free / gb:.1f} GB free of {total / gb:.1f} GB and phase 3 needs ~{need / gb:.1f} GB. The teacher is "
            "asked every step, so it must be served on other GPUs for the whole run, e.g. "
            "`CUDA_VISIBLE_DEVICES=1 vllm serve ...` and `CUDA_VISIBLE_DEVICES=0 python phase3_train_grpo.py ...` "
            "(docs/gpu.md, 'On-policy distillation')."
        )


def torch_device_type(device: Any) -> str:
    return str(getattr(device, "type", device)).split(":")[0]


def main(
    config: Config,
    resume_from: str | None = None,
    teacher_traces: Path | None = None,
    train_file: Path | None = None,
    overwrite_output_dir: bool = False,
) -> dict:
    check_launch_environment()  # DeepSpeed/FSDP are refused before anything is loaded
    output_dir = Path(config.paths.output_dir)
    source = train_file or config.paths.train_file
    note, refuse = dataset_name_note(config.data.dataset_name, Path(source))
    if refuse:  # TRL's habit: the dataset in the training config; here phase 1 turns it into the task file
        raise RunSetupError(note)
    if note and os.environ.get("RANK", "0") == "0":
        print(note, flush=True)
    tasks = require_tasks(read_tasks(source), source)
    traces = Path(teacher_traces or config.paths.teacher_traces_file)
    check_run_setup(config, resume_from, traces, overwrite_output_dir)  # refusals write nothing
    main_rank = os.environ.get("RANK", "0") == "0"
    tasks = _tasks_within_prompt_length(config, tasks, source, main_rank)
    # one run per output folder: the global main process holds its lock (a second run is refused, naming the first)
    with folder_lock(output_dir) if main_rank else contextlib.nullcontext():
        if main_rank:
            sweep_temp_folders(output_dir)
        return _train(config, resume_from, tasks, traces, overwrite_output_dir, Path(source))


def _train(
    config: Config,
    resume_from: str | None,
    tasks: list[Task],
    traces: Path,
    overwrite_output_dir: bool,
    source: Path,
) -> dict:
    from transformers import set_seed

    output_dir = Path(config.paths.output_dir)
    set_seed(config.training.seed)
    accelerator = build_accelerator(config, output_dir)
    # before any model loads: a node-local output folder fails late, node-local data differs silently
    unshared = unshared_output_dir(accelerator, output_dir, lambda: data_digests(tasks, traces))
    if unshared:
        if accelerator.is_main_process:
            raise LaunchError(unshared)
        raise SystemExit(1)  # the main process says why, in one line
    check_teacher_gpu(config, accelerator.device)  # before the student takes its share of the GPU
    if resume_from is None and overwrite_output_dir and accelerator.is_main_process:
        for name in previous_run(output_dir):
            shutil.rmtree(output_dir / name)
    accelerator.wait_for_everyone()
    task_ids = {t.task_id for t in tasks}
    teacher_examples = load_teacher_examples(
        traces, task_ids, config.dual_source.teacher_sft_only_passed, held_out_task_ids(config.paths.val_file)
    )
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(output_dir / "teacher_data.json", teacher_data_record(teacher_examples, traces, task_ids))
        off = (
            max_scheduled_weight(config.dual_source, "teacher_sft") == 0
            or config.dual_source.teacher_sft_batch_size == 0
        )
        print(
            f"{len(tasks)} training tasks from {source}; {len(teacher_examples)} usable teacher traces from {traces}"
            + (
                " (teacher-SFT term off: dual_source.teacher_sft_weight or teacher_sft_batch_size is 0)"
                if off
                else ""
                if teacher_examples
                else " (teacher-SFT term off: none of them passed or has code)"
            )
        )
    if config.guidance.enabled and not any(t.passed and t.code for t in teacher_examples):
        raise RunSetupError(
            f"guidance.enabled needs a passed teacher trace for the tasks it guides: none of the {len(tasks)} "
            f"training tasks has one in {traces}; run phase 2 (or the reference teacher) first, or set "
            "guidance.enabled=false."
        )
    model, tokenizer = build_student(config, accelerator)
    if teacher_examples and config.dual_source.teacher_sft_weight > 0:
        try:  # a second think block in teacher-SFT targets (Qwen3 template, enable_thinking=false)
            check_thinking_targets(tokenizer, config.dual_source.include_thinking, config.student.chat_template_kwargs)
        except ValueError as error:
            raise RunSetupError(str(error)) from None
    if accelerator.is_main_process:
        model.print_trainable_parameters()
    hf_prompts = hf_prompts_for_run(config, tokenizer, tasks) if config.rollout_backend == "hf" else None
    if accelerator.is_main_process:
        for line in rollout_lines(config, hf_prompts):
            print(line, flush=True)
    rollout = build_sampler(
        config,
        purpose="train",
        tokenizer=tokenizer,
        output_dir=output_dir,
        accelerator=accelerator,
        tasks=tasks,
        hf_prompts_per_call=hf_prompts,
    )
    parts = build_run(
        config,
        tasks=tasks,
        teacher_examples=teacher_examples,
        output_dir=output_dir,
        model=model,
        tokenizer=tokenizer,
        accelerator=accelerator,
        rollout=rollout,
        teacher_traces=traces,
    )
    trainer = GRPOTrainer(parts)
    try:
        summary = trainer.train(resume_from)
    finally:  # the server backend unloads its last adapter and closes its connections
        rollout.close()
    if accelerator.is_main_process:
        png = plot_metrics(
            output_dir / "metrics.jsonl", output_dir / "training_curves.png", config.training.run_name or None
        )
        split = step_time_split(read_metrics(output_dir / "metrics.jsonl"))
        if split:
            print(f"\n{split}")
        print(f"\nfinal adapter: {output_dir / 'final_model'}; metrics: {output_dir / 'metrics.jsonl'}; curves: {png}")
        if config.training.push_to_hub:
            push_final_adapter(config, output_dir / "final_model")
    return summary


def rollout_lines(config: Config, hf_prompts: int | None) -> list[str]:
    """What phase 3 says about its sampler before it starts: with hf, the prompts per generate call; with 'auto'
    fallen back to hf, the line naming the install and the expected time (`auto_backend_note`); with a merged vLLM
    sync in bf16, what the cast loses (`merged_precision_note`)."""
    if config.rollout_backend != "hf":
        return [note for note in (merged_precision_note(config),) if note]
    t = config.training
    prompts = hf_prompts or t.per_device_train_batch_size
    rollout_prompts = t.per_device_train_batch_size * t.gradient_accumulation_steps
    calls = -(-rollout_prompts // prompts)
    lines = [
        f"hf rollouts: {prompts} of the {rollout_prompts} prompts of a rollout batch per generate call "
        f"({prompts * config.grpo.num_samples_per_prompt} sequences; the most the memory model lets sampling hold "
        "without raising the update's peak)"
        if hf_prompts
        else f"hf rollouts: {prompts} prompts per generate call (one micro-batch: the student's shape is unknown)"
    ]
    note = auto_backend_note(config, "train", calls=calls, tokens=sample_budget(config))
    return lines + ([note] if note else [])


def push_final_adapter(config: Config, final: Path) -> None:
    """Upload the final adapter folder to training.hub_model_id. A failed upload is one line, not an error: the
    run and its folder are complete, and the export command retries the push."""
    repo_id = config.training.hub_model_id
    failure = push_folder(final, repo_id)
    if failure:
        print(
            f"warning: could not push {final} to {repo_id} ({failure}); the adapter folder is complete, retry with "
            f"python -m training.export --no_merge --model_path {final} --push_to_hub {repo_id} (and this run's "
            "--preset/--config)",
            file=sys.stderr,
        )


def _tasks_within_prompt_length(
    config: Config, tasks: list[Task], source: str | Path, main_process: bool
) -> list[Task]:
    """The tasks whose prompt fits grpo.max_prompt_length (all when it is 0); a DataFormatError when none does."""
    limit = config.grpo.max_prompt_length
    if limit <= 0:
        return tasks
    tokenizer = load_tokenizer(config.student.model_name, config.paths.model_cache_dir)
    kept, note = tasks_within_prompt_length(
        tokenizer,
        tasks,
        limit,
        config.prompt.num_visible_tests,
        config.student.chat_template_kwargs,
        config.multi_turn.mode,
    )
    if note and main_process:
        print(note)
    if not kept:
        raise DataFormatError(
            f"{source}: all {len(tasks)} training tasks have prompts longer than grpo.max_prompt_length={limit} "
            "tokens; raise it, or set it to 0 for no limit."
        )
    return kept


def cli(argv: list[str] | None = None) -> int:
    args, config = phase_command_line(DESCRIPTION, FLAGS, argv, add_arguments)
    traces = Path(args.teacher_traces) if args.teacher_traces else None
    train_file = Path(args.train_file) if args.train_file else None
    return run_phase(
        lambda: main(config, args.resume_from_checkpoint, traces, train_file, args.overwrite_output_dir),
        (
            DataFormatError,
            ModelLoadError,
            UnsupportedModelError,
            FileNotFoundError,
            RunSetupError,
            RewardFunctionError,
            LaunchError,
            TokenizerMismatchError,
            TeacherScoringError,
            TeacherFatalError,
            CheckpointMismatchError,
            DiskFullError,
            FolderBusyError,
            ProducerError,
            SamplerMismatchError,
        ),
        lambda: interrupted_message(
            Path(config.paths.output_dir), config.training.save_steps, args.resume_from_checkpoint is not None
        ),
    )


def interrupted_message(output_dir: Path, save_steps: int, resuming: bool) -> str:
    """What Ctrl-C leaves: the checkpoints to continue from, or none yet (then a rerun starts over)."""
    if checkpoint_folders(output_dir) or resuming:
        return f"checkpoints saved so far are in {output_dir}; continue with --resume_from_checkpoint latest."
    first = f" (the first is saved at step {save_steps})" if save_steps > 0 else ""
    return f"no checkpoint was saved yet{first}: rerun the same command to start over."


if __name__ == "__main__":
    sys.exit(cli())
