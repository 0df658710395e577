"""Shared pieces for trainer tests (also run under `accelerate launch` by tests/ddp_two_steps.py)."""

from __future__ import annotations

import shutil
import socket
import subprocess

import torch

from config import build_config
from rollouts.completion import RolloutCompletion
from rollouts.protocol import SamplerBase
from tests.canned_responses import WRONG_CODE, student_answer
from tests.conftest import ROOT
from utils.dataset_loader import EMBEDDED_MBPP, load_mbpp
from utils.sft_data import encode_prompt, end_of_turn_id


class ScriptedRollout(SamplerBase):
    """A stand-in policy sampler: for each prompt, G completions of which a random subset (drawn from
    torch's RNG, so resuming must restore it) is the task's reference solution and the rest wrong code.
    Rewards then differ within groups, so the GRPO term has real gradients on the tiny model."""

    def __init__(self, tokenizer, tasks_by_problem: dict[str, object], always_wrong: bool = False) -> None:
        self.tokenizer = tokenizer
        self.tasks_by_problem = tasks_by_problem
        self.always_wrong = always_wrong  # every group all wrong: zero-variance rewards, no self-SFT sample

    def sample(self, prompts, num_samples, *, seed=None):
        eot = end_of_turn_id(self.tokenizer)
        out = []
        for prompt in prompts:
            task = next(t for p, t in self.tasks_by_problem.items() if p in prompt)
            ids = encode_prompt(self.tokenizer, prompt)
            good = torch.randint(0, 2, (num_samples,)).tolist()
            good = [0] * num_samples if self.always_wrong else good
            samples = []
            for ok in good:
                text = student_answer(task.reference_solutions[0] if ok else WRONG_CODE)
                token_ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [eot]
                samples.append(RolloutCompletion(text, tuple(token_ids), tuple(ids), "stop"))
            out.append(samples)
        return out

    def continue_sequences(self, sequences, max_new_tokens, stop_strings):
        raise AssertionError("ScriptedRollout samples single-turn rollouts only")


def tiny_config(output_dir, **overrides):
    sets = [
        f"paths.output_dir={output_dir}",
        "student.model_name=embedded:tiny-random",
        "grpo.max_new_tokens=64",
        "grpo.num_samples_per_prompt=4",
        "training.per_device_train_batch_size=2",
        "training.gradient_accumulation_steps=2",
        "training.learning_rate=0.01",
        "training.save_steps=2",
        "training.warmup_steps=0",
        "training.lr_scheduler=constant",
        "grpo.kl_coef=0.05",
        "dual_source.teacher_sft_batch_size=1",
        # the fake engines and servers make their log-probs up (~6 nats from the tiny model's): the log-prob gap's
        # stop is off here, and its own tests set the bound (training.sampler_guard; non-finite ones still stop)
        "grpo.max_logp_abs_diff=0",
    ]
    sets += [f"{k}={v}" for k, v in overrides.items()]
    return build_config("cpu", overrides=sets)


def tiny_lora_student(config, adapter_seed: int = 0):
    """The config's student in float32 on CPU with a fresh LoRA adapter; `adapter_seed` fixes the adapter's
    initialisation, so two trainers built by this helper start from the same weights."""
    from utils.student_model import attach_lora, load_student

    model, tokenizer = load_student(config.student.model_name, "float32", device="cpu")
    torch.manual_seed(adapter_seed)
    model = attach_lora(model, config.lora.r, config.lora.lora_alpha, 0.0, config.lora.target_modules)
    return model, tokenizer


def scripted_trainer(
    output_dir, pool, rollout_class=ScriptedRollout, teacher_scorer=None, accelerator=None, **overrides
):
    """A GRPOTrainer on six embedded MBPP tasks with a scripted rollout (no sampling), for trainer-path tests."""
    from training.grpo_trainer import GRPOTrainer
    from training.setup import build_run

    config = tiny_config(output_dir, **overrides)
    model, tokenizer = tiny_lora_student(config)
    tasks = small_tasks()
    parts = build_run(
        config,
        tasks=tasks,
        teacher_examples=teacher_examples(tasks),
        output_dir=output_dir,
        model=model,
        tokenizer=tokenizer,
        accelerator=accelerator,
        rollout=rollout_class(tokenizer, {t.problem: t for t in tasks}),
        pool=pool,
        teacher_scorer=teacher_scorer,
    )
    return GRPOTrainer(parts)


def small_tasks(n: int = 6):
    return load_mbpp(EMBEDDED_MBPP)[0][:n]


def teacher_examples(tasks):
    from synthesis.generate_traces import TeacherTrace
    from utils.prompts import get_unified_prompt

    return [
        TeacherTrace(
            t.task_id, 0, get_unified_prompt(t), thinking="Add them.", code=t.reference_solutions[0], passed=True
        )
        for t in tasks
    ]


def lora_state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters() if "lora_" in k}


def base_state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters() if "lora_" not in k}


def launch_two_processes(module: str, *args: str) -> None:
    """`accelerate launch -m tests.<module>` with 2 processes, from the repository root. --multi_gpu selects
    accelerate's torchrun launcher; without GPUs the processes use gloo on the CPU (`--cpu` alone would start a
    single process unless mpirun is set up). A rank waiting for an all-reduce its peer never starts would hang:
    the timeout turns that into a failure, with both ranks' output. The rendezvous port is a free one: launches in
    other test workers run at the same time."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    accelerate = shutil.which("accelerate", path=str(ROOT / ".venv" / "bin")) or shutil.which("accelerate")
    assert accelerate is not None, "accelerate is not installed"
    launcher = ["launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no"]
    launcher += ["--dynamo_backend", "no", "--main_process_port", str(port)]
    command = [accelerate, *launcher, "-m", f"tests.{module}", *args]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


def plan_one_slot(trainer, groups, model=None, grpo=None):
    """The trainer's update plan for `groups` in one slot, no self-SFT, no forward chunking (its grpo section unless
    another is given)."""
    from training.update_plan import plan_update

    return plan_update(
        groups,
        trainer.model if model is None else model,
        pad_id=trainer.tokenizer.pad_token_id,
        device="cpu",
        grpo=trainer.grpo if grpo is None else grpo,
        num_slots=1,
        forward_chunk_size=0,
        self_batch=None,
        num_self_examples=0,
    )
