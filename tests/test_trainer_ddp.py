"""Scale-out on an existing engine: the same trainer under `accelerate launch` with 2 CPU processes."""

import shutil
import subprocess

import pytest
import torch

from tests.conftest import ROOT


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["even", "uneven"])
def test_two_processes_end_with_identical_adapters(tmp_path, scenario):
    accelerate = shutil.which("accelerate", path=str(ROOT / ".venv" / "bin")) or shutil.which("accelerate")
    # --multi_gpu selects accelerate's torchrun launcher; without GPUs the processes use gloo on the CPU
    # (`--cpu` alone would start a single process unless mpirun is set up).
    command = [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
               "--dynamo_backend", "no", "--main_process_port", "29517", str(ROOT / "tests" / "ddp_two_steps.py"), str(tmp_path), scenario]
    # a rank waiting for an all-reduce its peer never starts would hang: the timeout turns that into a failure
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert rank0["world"] == rank1["world"] == 2
    assert set(rank0["prompts"]).isdisjoint(rank1["prompts"])  # each rank rolled out its own prompts
    moved = False
    for key, value in rank0["lora"].items():
        assert torch.allclose(value, rank1["lora"][key], atol=1e-7), key  # gradients were synchronized
        moved = moved or "lora_B" in key and value.abs().sum() > 0
    assert moved  # and training did change the adapter
