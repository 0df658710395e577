"""Checkpoints of a training run: save, load, prune, resolve; and `save_config`, the resolved config written
beside an output (a checkpoint, the final model, phase 2's trace file).

A checkpoint is one folder `checkpoint-N/` that appears by a single rename (written to a hidden
temporary folder first, so a crash mid-save leaves the previous one intact):

    adapter/             the LoRA adapter only (loadable by peft and vLLM as it is), rank 0
    optimizer.pt         optimizer state, rank 0
    scheduler.pt         LR scheduler state, rank 0
    trainer_state.json   {global_step, rollout_batches, total_steps, num_processes}, rank 0
    config.json          the run's resolved config, rank 0
    rank-N.pt            per process: torch/numpy/python/CUDA RNG states plus what the trainer hands
                         in as `rank_state` (its teacher-sampling RNG and self-SFT buffer)

Why not `Accelerator.save_state`: it writes the whole model's state dict (the frozen base too, 3.4 GB
per checkpoint for Qwen3-1.7B) and knows nothing of the trainer's own per-rank state.
"""

from __future__ import annotations

import errno
import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from config import Config, config_to_dict
from utils.disk import DiskFullError, out_of_space
from utils.jsonl import replace_folder, write_json_atomic
from utils.provenance import build_provenance, write_model_card, write_provenance
from utils.student_model import save_adapter

CHECKPOINT_PREFIX = "checkpoint-"


@dataclass
class TrainerState:
    global_step: int = 0  # optimizer steps done
    rollout_batches: int = 0  # rollout batches consumed (the position in the data order)


def checkpoint_folders(output_dir: str | Path) -> list[Path]:
    """The `checkpoint-N` folders of `output_dir`, oldest (smallest N) first."""
    found = [
        p
        for p in Path(output_dir).glob(f"{CHECKPOINT_PREFIX}*")
        if p.is_dir() and p.name[len(CHECKPOINT_PREFIX) :].isdigit()
    ]
    return sorted(found, key=lambda p: int(p.name[len(CHECKPOINT_PREFIX) :]))


def resolve_checkpoint(output_dir: str | Path, spec: str) -> Path:
    """`--resume_from_checkpoint`'s value as a folder: "latest" (the newest in `output_dir`) or a path."""
    if spec != "latest":
        path = Path(spec)
        if not (path / "trainer_state.json").is_file():
            raise FileNotFoundError(f"{path} is not a checkpoint folder (no trainer_state.json).")
        return path
    found = checkpoint_folders(output_dir)
    if not found:
        raise FileNotFoundError(
            f"no {CHECKPOINT_PREFIX}* folder in {output_dir} to resume from. Start a new run without "
            f"--resume_from_checkpoint, pass the --output_dir of the run to continue, or name a checkpoint "
            f"folder: --resume_from_checkpoint {output_dir}/{CHECKPOINT_PREFIX}N."
        )
    return found[-1]


def prune_checkpoints(output_dir: str | Path, limit: int) -> None:
    """Keep the newest `limit` checkpoints (0: keep all)."""
    for old in checkpoint_folders(output_dir)[:-limit] if limit > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


def save_config(config: Config, path: str | Path) -> Path:
    """Write the resolved config as JSON next to an output (atomically)."""
    return write_json_atomic(path, config_to_dict(config))


def rank_state_name(process_index: int) -> str:
    return f"rank-{process_index}.pt"


def save_checkpoint(
    output_dir: Path,
    *,
    accelerator: Any,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    config: Config,
    state: TrainerState,
    total_steps: int,
    rank_state: dict,
) -> Path:
    """Write `checkpoint-<global_step>` (see the module docstring); every process must call it."""
    accelerator.wait_for_everyone()
    final = output_dir / f"{CHECKPOINT_PREFIX}{state.global_step}"
    tmp = output_dir / f".{final.name}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    torch.save(
        {
            "torch": torch.get_rng_state(),
            "numpy": np.random.get_state(),
            "python": random.getstate(),
            **rank_state,
            # this process's own device only: a resume may see fewer GPUs than this process did
            "cuda": {"device": torch.cuda.current_device(), "state": torch.cuda.get_rng_state()}
            if torch.cuda.is_available()
            else None,
        },
        tmp / rank_state_name(accelerator.process_index),
    )
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        try:
            accelerator.unwrap_model(model).save_pretrained(tmp / "adapter", save_embedding_layers=False)  # no hub
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
            trainer_state = {
                "global_step": state.global_step,
                "rollout_batches": state.rollout_batches,
                "total_steps": total_steps,
                "num_processes": accelerator.num_processes,
            }
            (tmp / "trainer_state.json").write_text(json.dumps(trainer_state))
            save_config(config, tmp / "config.json")
            write_provenance(tmp, build_provenance(config))
        except Exception as error:  # re-raised unless out of space
            shutil.rmtree(tmp, ignore_errors=True)
            if out_of_space(error):
                raise _disk_full(output_dir, final.name) from None
            raise
        replace_folder(tmp, final)  # the checkpoint appears whole or not at all, and never disappears
        prune_checkpoints(output_dir, config.training.save_total_limit)
    accelerator.wait_for_everyone()
    return final


def sweep_temp_folders(output_dir: str | Path) -> list[Path]:
    """Remove the hidden temporary folders a failed or killed save left (`.checkpoint-N.tmp`,
    `.final_model.tmp<pid>`); call it while holding the folder's run lock. Returns what was removed."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    stale = [p for p in output_dir.iterdir() if p.is_dir() and p.name.startswith(".") and ".tmp" in p.name]
    stale = [p for p in stale if p.name.startswith((f".{CHECKPOINT_PREFIX}", ".final_model."))]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def _disk_full(output_dir: Path, what: str) -> DiskFullError:
    intact = [p.name for p in checkpoint_folders(output_dir)]
    kept = f"{intact[-1]} is intact" if intact else "no earlier checkpoint is kept"
    return DiskFullError(
        errno.ENOSPC,
        f"no space left on {output_dir} while saving {what} ({kept}); free space and rerun with "
        "--resume_from_checkpoint latest",
    )


class CheckpointMismatchError(ValueError):
    """A checkpoint that this run cannot continue exactly (another number of processes)."""


def restore_cuda_rng(saved: Any) -> None:
    """This process's CUDA generator from a rank file: {"device", "state"} (this process's device when it was
    saved), or, in checkpoints written before that, one state per GPU the saving process saw, of which only the
    current device's is restored (torch's set_rng_state_all raises IndexError when fewer GPUs are visible)."""
    if saved is None or not torch.cuda.is_available():
        return
    device = torch.cuda.current_device()
    if isinstance(saved, dict):
        torch.cuda.set_rng_state(saved["state"], device)
    elif device < len(saved):
        torch.cuda.set_rng_state(saved[device], device)


def load_checkpoint(
    path: Path, accelerator: Any, model: Any, optimizer: Any, scheduler: Any, state: TrainerState
) -> dict:
    """Restore a checkpoint into the given objects and this process's RNG states; returns this process's
    `rank_state` as it was saved (the caller restores its own parts of it)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    saved = json.loads((path / "trainer_state.json").read_text())
    saved_processes = saved.get("num_processes", accelerator.num_processes)
    if saved_processes != accelerator.num_processes:
        raise CheckpointMismatchError(
            f"{path} was saved by {saved_processes} processes and this run has {accelerator.num_processes}: the "
            f"data position and the learning-rate schedule depend on the number of processes, so resume with "
            f"accelerate launch --num_processes {saved_processes} (or start a fresh run)."
        )
    set_peft_model_state_dict(
        accelerator.unwrap_model(model), load_file(str(path / "adapter" / "adapter_model.safetensors"))
    )
    # map_location: rank 0 saved its state from its own GPU; unmapped, every rank would first put a copy on
    # that GPU (load_state_dict then moves each value to the parameter's device)
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu", weights_only=False))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", map_location="cpu", weights_only=False))
    rank_file = path / rank_state_name(accelerator.process_index)
    if not rank_file.is_file():
        raise FileNotFoundError(
            f"{rank_file} is missing: {path} was saved by {saved.get('num_processes', '?')} process(es); resume "
            f"with the same number (accelerate launch --num_processes N)."
        )
    rank_state = torch.load(rank_file, map_location="cpu", weights_only=False)
    torch.set_rng_state(rank_state["torch"])
    np.random.set_state(rank_state["numpy"])
    random.setstate(rank_state["python"])
    restore_cuda_rng(rank_state.get("cuda"))
    state.global_step = saved["global_step"]
    state.rollout_batches = saved["rollout_batches"]
    if accelerator.is_main_process:
        print(f"resumed from {path} at step {state.global_step}", flush=True)
    return rank_state


def save_final(output_dir: Path, accelerator: Any, model: Any, tokenizer: Any, config: Config) -> Path:
    """`final_model/`: the adapter, the tokenizer, the run's config (`tgrpo_config.json`), its provenance
    (`provenance.json`) and a model card (`README.md`) filled from them."""
    final = output_dir / "final_model"
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        try:
            save_adapter(accelerator.unwrap_model(model), tokenizer, final)
            save_config(config, final / "tgrpo_config.json")
            write_model_card(final, build_provenance(config), config)
        except Exception as error:  # re-raised unless out of space
            if out_of_space(error):
                raise _disk_full(output_dir, "final_model") from None
            raise
    accelerator.wait_for_everyone()
    return final


@dataclass(frozen=True)
class RunFiles:
    """What a run writes into its output folder besides metrics: `config.json` at the start, the checkpoints and
    the final model. Each carries the whole resolved config and its provenance, so this record holds the config;
    the trainer hands it on and reads nothing from it."""

    output_dir: Path
    config: Config

    def write_config(self) -> Path:
        """`config.json` in the output folder (the main process's)."""
        return save_config(self.config, self.output_dir / "config.json")

    def save_checkpoint(
        self,
        *,
        accelerator: Any,
        model: Any,
        optimizer: Any,
        scheduler: Any,
        state: TrainerState,
        total_steps: int,
        rank_state: dict,
    ) -> Path:
        """`save_checkpoint` into the output folder."""
        return save_checkpoint(
            self.output_dir,
            accelerator=accelerator,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            config=self.config,
            state=state,
            total_steps=total_steps,
            rank_state=rank_state,
        )

    def save_final(self, accelerator: Any, model: Any, tokenizer: Any) -> Path:
        """`save_final` into the output folder."""
        return save_final(self.output_dir, accelerator, model, tokenizer, self.config)
