"""What a training launch may be, decided before any model is loaded.

- Launch type. Plain processes and DDP (`accelerate launch --multi_gpu`) only. DeepSpeed and FSDP
  are refused: accelerate's DeepSpeed engine steps the optimizer and scheduler on every `backward`
  (this trainer calls it once per chunk and loss term, ~30 times per optimizer step), ZeRO-3 saves
  empty adapters and gathers parameters for every decoded token, and for a LoRA of ~70 M parameters
  sharding saves nothing worth having. DDP replicates the frozen base on each GPU, which fits.
- Several machines. Every process reads and writes the output folder at the same path (the adapter
  hand-off to vLLM, each rank's checkpoint file in the folder the main process made), so it must be one
  folder shared by every machine; `unshared_output_dir` checks that at start with a token the main
  process writes and every process reads back.
- Sandbox workers. With `sandbox.max_workers=0` each of the N processes on a machine takes
  cpu_count // N workers, not cpu_count each: oversubscribed cores turn correct-but-slow programs
  into timeouts (reward noise).
"""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path
from typing import Any

UNSUPPORTED_LAUNCHES = ("DEEPSPEED", "FSDP")
SHARED_FOLDER_TOKEN = ".tgrpo-shared-folder-check"
_LAUNCH_ENV = {"ACCELERATE_USE_DEEPSPEED": "DeepSpeed", "ACCELERATE_USE_FSDP": "FSDP"}


class LaunchError(RuntimeError):
    """A launch configuration this trainer does not support; the message says what to run instead."""


def _refusal(kind: str) -> LaunchError:
    return LaunchError(
        f"{kind} launches are not supported (a LoRA trains correctly only under plain DDP here); "
        "run `accelerate launch --multi_gpu --num_processes N phase3_train_grpo.py` instead."
    )


def check_launch_environment(environ: dict[str, str] | None = None) -> None:
    """Refuse DeepSpeed/FSDP from the variables `accelerate launch` sets, before anything is built."""
    env = os.environ if environ is None else environ
    for variable, kind in _LAUNCH_ENV.items():
        if env.get(variable, "").lower() in ("1", "true", "yes"):
            raise _refusal(kind)


def check_accelerator(accelerator: Any) -> None:
    """The same refusal from a built Accelerator (its distributed type names the launch)."""
    kind = str(getattr(getattr(accelerator, "distributed_type", None), "name", ""))
    if kind in UNSUPPORTED_LAUNCHES:
        raise _refusal("DeepSpeed" if kind == "DEEPSPEED" else "FSDP")


def local_world_size(accelerator: Any = None, environ: dict[str, str] | None = None) -> int:
    """Training processes on this machine: torchrun's LOCAL_WORLD_SIZE, else every process."""
    env = os.environ if environ is None else environ
    if env.get("LOCAL_WORLD_SIZE"):
        return max(1, int(env["LOCAL_WORLD_SIZE"]))
    return max(1, getattr(accelerator, "num_processes", 1) if accelerator is not None else 1)


def sandbox_workers(configured: int, processes_per_machine: int, cpu_count: int | None = None) -> int:
    """Sandbox workers for one process: the configured number, or its share of the machine's cores."""
    if configured > 0:
        return configured
    cores = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    return max(1, cores // max(1, processes_per_machine))


def unshared_output_dir(accelerator: Any, output_dir: str | Path) -> str:
    """'' when every process reads, in its own `output_dir`, the token the main process wrote in its own (one
    folder shared at one path); otherwise the line that says which processes could not, on every process. Called
    by every process together (a broadcast, a gather and a barrier); one process: '' without touching the disk."""
    if accelerator.num_processes == 1:
        return ""
    from accelerate.utils import broadcast_object_list, gather_object

    path = Path(output_dir).resolve() / SHARED_FOLDER_TOKEN
    token = [uuid.uuid4().hex if accelerator.is_main_process else ""]
    if accelerator.is_main_process:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(token[0])
            handle.flush()
            os.fsync(handle.fileno())  # on a network file system the others open it after this close
    expected = broadcast_object_list(token, from_process=0)[0]  # sent after the write: the others read after it
    try:
        seen = path.read_text(encoding="utf-8") == expected  # a token left by an earlier run does not match
    except OSError:
        seen = False
    everyone = gather_object([(accelerator.process_index, socket.gethostname(), str(path), seen)])
    if accelerator.is_main_process:  # every process has read it (the gather): gone before anyone returns
        path.unlink(missing_ok=True)
    accelerator.wait_for_everyone()
    failed = [f"process {rank} on {host} cannot read {where}" for rank, host, where, ok in everyone if not ok]
    if not failed:
        return ""
    _, main_host, main_path, _ = everyone[0]
    return (
        f"{'; '.join(failed)}, which process 0 wrote on {main_host} at {main_path}: paths.output_dir must be one "
        "folder shared by every machine at the same path (a network file system mounted alike on each; "
        "docs/gpu.md, 'Several machines')"
    )


class Peers:
    """The processes of a launch, seen from one of them, and the collectives over them (each runs on the training
    thread of every process together; with one process none communicates)."""

    def __init__(self, accelerator: Any) -> None:
        self.accelerator = accelerator

    @property
    def world(self) -> int:
        return self.accelerator.num_processes

    @property
    def rank(self) -> int:
        return self.accelerator.process_index

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    def sums(self, values: list[float]) -> list[float]:
        """`values` summed over every process (one all-reduce)."""
        if self.world == 1:
            return list(values)
        import torch

        reduced = self.accelerator.reduce(
            torch.tensor(values, dtype=torch.float64, device=self.accelerator.device), reduction="sum"
        )
        return [float(v) for v in reduced.cpu()]

    def gather(self, rows: Any) -> Any:
        """Every process's `rows` (a CPU tensor, the same shape on each), concatenated in rank order."""
        if self.world == 1:
            return rows
        return self.accelerator.gather(rows.to(self.accelerator.device)).cpu()

    def scatter(self, items: list | None) -> Any:
        """The main process's `items[rank]` on every process (`items`: one per rank on the main process, None
        elsewhere): one scatter of Python objects."""
        import torch.distributed as dist

        received: list[Any] = [None]
        dist.scatter_object_list(received, items if self.is_main else None, src=0)
        return received[0]

    def broadcast(self, item: Any) -> Any:
        """The main process's `item` on every process."""
        if self.world == 1:
            return item
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([item], from_process=0)[0]
