"""Rollout backends built from the config, written once for phase 3 (training), phase 4 (evaluation)
and the preflight.

- `training_rollout`: the backend `grpo.rollout_backend` names, sampling with `grpo`'s settings.
- `evaluation_rollout`: phase 4's transformers-side sampler (`evaluation.backend`: kv or hf).
- `colocated_engine`: a `vllm.LLM` for this process sized for the tasks' prompts (phase 3; phase 4
  builds its own, its multi-turn prompts are longer).

This is the one library module that reads several config sections: building a backend needs the
student, the LoRA shape, the sampling settings and the run's seed and paths.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from config import Config
from rollouts.hf import HFRollout
from rollouts.kv_sampler import KVCacheRollout
from rollouts.sampling import SamplingSettings
from rollouts.vllm_colocated import VLLMRollout
from rollouts.vllm_engine import AdapterHandoff, RankInfo, build_engine, engine_kwargs, max_model_len
from utils.prompts import get_unified_prompt
from utils.sft_data import encode_prompt
from utils.student_model import DTYPES, resolve_model_path, save_adapter


def chat_template_kwargs(config: Config) -> dict[str, Any]:
    """What the student's chat template is rendered with, in every phase."""
    return {"enable_thinking": config.student.enable_thinking}


def prompt_lengths(
    tokenizer: Any,
    tasks: Sequence,
    num_visible_tests: int,
    chat_template_kwargs: dict | None = None,
    mode: str = "single",
) -> list[int]:
    """Token count of each task's templated prompt in `mode` (what sizes vLLM's `max_model_len`)."""
    return [
        len(
            encode_prompt(
                tokenizer,
                get_unified_prompt(t, num_visible_tests, mode=mode),
                chat_template_kwargs=chat_template_kwargs,
            )
        )
        for t in tasks
    ]


def colocated_engine(
    config: Config,
    tokenizer: Any,
    model_name: str,
    tasks: Sequence,
    visible_tests: int,
    max_new_tokens: int,
    lora_rank: int | None,
    ranks: RankInfo | None = None,
    sleep_mode: bool = False,
    logprobs: bool = True,
) -> tuple[Any, Any]:
    """(vllm module, a `vllm.LLM` for this process) sized for these tasks' prompts plus the budget."""
    import vllm  # lazy: the optional GPU extra

    ranks = ranks or RankInfo()
    lengths = prompt_lengths(tokenizer, tasks, visible_tests, chat_template_kwargs(config), config.multi_turn.mode)
    kwargs = engine_kwargs(
        resolve_model_path(model_name, config.paths.model_cache_dir),
        max_model_len=max_model_len(lengths, max_new_tokens),
        gpu_memory_utilization=config.grpo.vllm_gpu_memory_utilization,
        dtype=config.student.torch_dtype,
        seed=config.training.seed,
        lora_rank=lora_rank,
        ranks=ranks,
        sleep_mode=sleep_mode,
        logprobs=logprobs,
    )
    return vllm, build_engine(vllm, kwargs, ranks)


def sample_budget(config: Config) -> int:
    """Tokens one sample may add after its prompt: grpo.max_new_tokens single-turn; in tool/feedback mode the whole
    sample (turns, results, feedback) up to multi_turn.max_total_tokens, re-sent with the prompt each turn."""
    if config.multi_turn.mode == "single":
        return config.grpo.max_new_tokens
    return max(config.grpo.max_new_tokens, config.multi_turn.max_total_tokens)


def budget_name(config: Config) -> str:
    return "grpo.max_new_tokens" if config.multi_turn.mode == "single" else "multi_turn.max_total_tokens"


def training_rollout(
    config: Config, tokenizer: Any, output_dir: Path, accelerator: Any = None, tasks: Sequence | None = None
) -> Any:
    """The configured rollout backend for phase 3. vLLM: one colocated engine per process, on that process's GPU."""
    g = config.grpo
    template = chat_template_kwargs(config)
    sampling = SamplingSettings.from_section(g)

    def vllm_rollout_args() -> tuple[Any, int, SamplingSettings, AdapterHandoff, int, dict[str, Any]]:
        """What both vLLM backends take after their engine; the adapter hand-off folder is made only when asked."""
        handoff = adapter_handoff(config, output_dir, accelerator)
        return tokenizer, g.max_new_tokens, sampling, handoff, g.gen_update_steps, template

    if g.rollout_backend == "vllm_server":
        from rollouts.vllm_server import VLLMServerRollout, server_client

        server = VLLMServerRollout(
            server_client(g.vllm_server_url), *vllm_rollout_args(), share=share_from_main(accelerator)
        )
        if tasks:  # the server's context must hold the longest prompt plus what the mode appends to it
            lengths = prompt_lengths(
                tokenizer, tasks, config.prompt.num_visible_tests, template, config.multi_turn.mode
            )
            server.check_context(max(lengths), sample_budget(config), budget_name(config))
        return server
    if g.rollout_backend == "vllm":
        ranks = RankInfo.from_accelerator(accelerator) if accelerator is not None else RankInfo()
        vllm, llm = colocated_engine(
            config,
            tokenizer,
            config.student.model_name,
            tasks or [],
            config.prompt.num_visible_tests,
            sample_budget(config),  # multi-turn: a sample grows to max_total_tokens after its prompt
            config.lora.r,
            ranks,
            g.vllm_sleep_mode,
        )
        # Under external_launcher (several processes) vLLM's worker runs in this process and selected its device
        # here: say which (scripts/gpu_smoke.sh checks it). One process: the engine lives in vLLM's own
        # subprocess, and this process's current device says nothing about it.
        if ranks.world_size > 1 and _has_cuda():
            import torch

            print(
                f"vLLM engine: rank {ranks.rank} (local {ranks.local_rank}) on cuda:{torch.cuda.current_device()}",
                flush=True,
            )
        return VLLMRollout(llm, *vllm_rollout_args(), sleep_mode=g.vllm_sleep_mode, vllm_module=vllm)
    if g.rollout_backend == "kv":
        return KVCacheRollout(tokenizer, g.max_new_tokens, sampling, template, g.sampler_dtype)
    return HFRollout(
        tokenizer,
        g.max_new_tokens,
        sampling,
        template,
        # prompts per `generate` call (each returns G sequences): one micro-batch of per_device x G sequences;
        # multi-turn continues that many sequences per call too
        batch_size=config.training.per_device_train_batch_size,
        sequences_per_call=config.training.per_device_train_batch_size * g.num_samples_per_prompt,
    )


def evaluation_rollout(config: Config, tokenizer: Any, template: dict[str, Any]) -> Any:
    """Phase 4's single-turn sampler over a loaded transformers model (`config.evaluation_backend` kv or hf;
    phase 4 builds its vLLM engine itself), sampling with `evaluation`'s settings."""
    ev = config.evaluation
    sampling = SamplingSettings.from_section(ev)
    if config.evaluation_backend == "kv":
        return KVCacheRollout(tokenizer, ev.max_new_tokens, sampling, template, config.grpo.sampler_dtype)
    return HFRollout(
        tokenizer, ev.max_new_tokens, sampling, template, batch_size=8, sequences_per_call=8 * ev.num_samples
    )


def adapter_handoff(config: Config, output_dir: Path, accelerator: Any = None) -> AdapterHandoff:
    """Adapter folders for vLLM under output_dir/.vllm_adapters, written by the main process in the training dtype."""
    is_main = accelerator.is_main_process if accelerator is not None else True
    barrier = accelerator.wait_for_everyone if accelerator is not None else (lambda: None)
    import torch

    configured = DTYPES[config.student.torch_dtype]
    dtype = configured if isinstance(configured, torch.dtype) else None  # "auto": saved as peft holds the weights
    return AdapterHandoff(
        Path(output_dir) / ".vllm_adapters",
        lambda model, path: save_adapter(model, None, path, dtype),
        is_main,
        barrier,
    )


def share_from_main(accelerator: Any = None) -> Callable[[Any], Any]:
    """value -> the main process's value, on every process (identity with one process)."""
    if accelerator is None or accelerator.num_processes == 1:
        return lambda value: value
    from accelerate.utils import broadcast_object_list

    return lambda value: broadcast_object_list([value], from_process=0)[0]


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
