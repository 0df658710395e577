"""The one sampler builder, `build_sampler(config, purpose=...)`, for phases 3 and 4, `evaluation.solve`, the preflight,
and `episodes_for(config, pool)`, how a multi-turn sample goes on after its first turn.

- `purpose="train"`: the backend `Config.rollout_backend` names (grpo.rollout_backend, 'auto' resolved: vllm when
  installed, else hf, `auto_backend_note`), sampling with `grpo`'s settings.
- `purpose="eval"`: the backend `Config.evaluation_backend` names (kv, hf or vllm), sampling with `evaluation`'s
  settings; vLLM gets an engine of its own, alone on the GPU, that reads the evaluated adapter folder itself.
- `colocated_engine`: a `vllm.LLM` for this process sized for the tasks' prompts in the mode plus the sample budget.

This is the one library module that reads several config sections: building a backend needs the
student, the LoRA shape, the sampling settings and the run's seed and paths.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from config import Config
from rollouts.groups import Episodes
from rollouts.hf import HFRollout
from rollouts.kv_sampler import KVCacheRollout
from rollouts.models import adapter_rank
from rollouts.protocol import Sampler
from rollouts.sampling import SamplingSettings
from rollouts.vllm_colocated import VLLMRollout
from rollouts.vllm_engine import AdapterHandoff, RankInfo, build_engine, engine_kwargs, is_cpu_platform, max_model_len
from utils.prompts import get_unified_prompt
from utils.sft_data import encode_prompt
from utils.student_model import DTYPES, resolve_model_path, save_adapter


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


def tasks_within_prompt_length(
    tokenizer: Any,
    tasks: Sequence,
    max_prompt_length: int,
    num_visible_tests: int,
    chat_template_kwargs: dict | None = None,
    mode: str = "single",
) -> tuple[list, str]:
    """The tasks whose templated prompt (as prompt_lengths counts it) fits `max_prompt_length` tokens (0: all),
    and a line saying how many were skipped ("" when none). Skipped, not truncated: TRL cuts long prompts from
    the left, which removes the system prompt and the instructions."""
    if max_prompt_length <= 0:
        return list(tasks), ""
    lengths = prompt_lengths(tokenizer, tasks, num_visible_tests, chat_template_kwargs, mode)
    kept = [task for task, length in zip(tasks, lengths, strict=True) if length <= max_prompt_length]
    skipped = len(tasks) - len(kept)
    if not skipped:
        return kept, ""
    return kept, (
        f"{skipped} of {len(tasks)} tasks have prompts longer than max_prompt_length={max_prompt_length} tokens: "
        "skipped (TRL truncates them from the left, which cuts the instructions)"
    )


def colocated_engine(
    config: Config,
    tokenizer: Any,
    *,
    model_name: str,
    tasks: Sequence,
    visible_tests: int,
    max_new_tokens: int,
    lora_rank: int | None,
    gpu_memory_utilization: float,
    ranks: RankInfo | None = None,
    sleep_mode: bool = False,
    logprobs: bool = True,
    cpu_platform: bool = False,
    in_process: bool = False,
) -> tuple[Any, Any]:
    """(vllm module, a `vllm.LLM` for this process) sized for these tasks' prompts in the configured mode (its
    instructions lengthen them) plus the budget; `in_process`: its worker runs in this process (merged weights)."""
    import vllm  # lazy: the optional GPU extra

    ranks = ranks or RankInfo()
    lengths = prompt_lengths(
        tokenizer, tasks, visible_tests, config.student.chat_template_kwargs, config.multi_turn.mode
    )
    kwargs = engine_kwargs(
        resolve_model_path(model_name, config.paths.model_cache_dir),
        max_model_len=max_model_len(lengths, max_new_tokens),
        gpu_memory_utilization=gpu_memory_utilization,
        dtype=config.student.torch_dtype,
        seed=config.training.seed,
        lora_rank=lora_rank,
        ranks=ranks,
        sleep_mode=sleep_mode,
        logprobs=logprobs,
        cpu_platform=cpu_platform,
        enforce_eager=config.grpo.vllm_enforce_eager,
    )
    return vllm, build_engine(vllm, kwargs, ranks, in_process=in_process)


# Seconds per decode step of transformers `generate` for Qwen3-1.7B with the preset's LoRA, measured on an H200 at 8
# sequences per call (benchmarks/results/gpu_check_h200.md: 105-109 s for 1,024 tokens); the base of the hf
# backend's expected sampling time. vLLM on the same GPU takes a few milliseconds per step.
HF_SECONDS_PER_DECODE_STEP = 0.1
HF_EVAL_PROMPTS_PER_CALL = 8  # phase 4's hf sampler: tasks per generate call (x evaluation.num_samples sequences)
VLLM_INSTALL = "pip install -r requirements-gpu.txt (vllm==0.33.0)"


def merged_precision_note(config: Config) -> str:
    """One line when the colocated engine gets merged weights in a dtype that rounds a small update away (''
    otherwise): `grpo.vllm_weight_sync=merged` chosen for a student that is not float32 ('auto' picks 'adapter')."""
    if (
        config.rollout_backend != "vllm"
        or config.vllm_weight_sync != "merged"
        or config.student.torch_dtype == "float32"
    ):
        return ""
    return (
        f"grpo.vllm_weight_sync=merged with student.torch_dtype={config.student.torch_dtype}: the engine holds "
        f"{config.student.torch_dtype}(W + dW), which loses every element of dW below half a step of its weight (~3/4 "
        "of dW at |dW|/|W| = 1e-3), so early updates barely reach the sampler; 'adapter' (auto's choice) keeps dW at "
        "its own precision (docs/gpu.md, 'The weight sync')"
    )


def auto_backend_note(config: Config, purpose: Literal["train", "eval"], *, calls: int, tokens: int) -> str:
    """One line when 'auto' fell back to hf because vLLM is not installed ('' otherwise): the install, how to choose
    hf without this line, and the expected sampling time of `calls` generate calls of up to `tokens` new tokens
    (per optimizer step for "train", per evaluated model for "eval")."""
    if config.grpo.rollout_backend != "auto" or config.rollout_backend != "hf":
        return ""
    if purpose == "eval" and config.evaluation.backend != "rollout":
        return ""
    minutes = calls * tokens * HF_SECONDS_PER_DECODE_STEP / 60
    if purpose == "train":
        what = f"phase 3 samples with transformers generate (hf): {calls} generate call(s) per optimizer step"
        per, choose = "per step", "--set grpo.rollout_backend=hf"
    else:
        what = f"phase 4 samples with transformers generate (hf): {calls} generate calls per evaluated model"
        per, choose = "per model", "--set evaluation.backend=hf"
    return (
        f"grpo.rollout_backend=auto: vllm is not installed, so {what}, up to ~{minutes:.0f} min {per} at the "
        f"~{HF_SECONDS_PER_DECODE_STEP:.1f} s per decode step of {tokens} tokens measured on an H200 (vLLM: a few ms "
        f"per step). For vLLM: {VLLM_INSTALL}; to keep hf without this line: {choose}."
    )


def sample_budget(config: Config, max_new_tokens: int | None = None) -> int:
    """Tokens one sample may add after its prompt: max_new_tokens (grpo's unless given) single-turn; in tool/feedback
    mode the whole sample (turns, results, feedback) up to multi_turn.max_total_tokens, re-sent with the prompt each
    turn."""
    per_turn = config.grpo.max_new_tokens if max_new_tokens is None else max_new_tokens
    if config.multi_turn.mode == "single":
        return per_turn
    return max(per_turn, config.multi_turn.max_total_tokens)


def budget_name(config: Config) -> str:
    return "grpo.max_new_tokens" if config.multi_turn.mode == "single" else "multi_turn.max_total_tokens"


def build_sampler(
    config: Config,
    *,
    purpose: Literal["train", "eval"],
    tokenizer: Any,
    output_dir: Path | None = None,
    accelerator: Any = None,
    tasks: Sequence | None = None,
    model_name: str | None = None,
    adapter: Path | None = None,
    visible_tests: int | None = None,
    hf_prompts_per_call: int | None = None,
) -> Sampler:
    """The configured sampler. train: phase 3's (output_dir holds vLLM's adapter hand-off; tasks size the engine;
    the hf backend puts `hf_prompts_per_call` prompts in one generate call, one micro-batch's if None).
    eval: phase 4's and `evaluation.solve`'s (evaluation.backend=hf); a vLLM engine loads `model_name`
    (student.model_name if None), reads `adapter` itself and is sized for `tasks` shown `visible_tests` tests
    (prompt.num_visible_tests if None)."""
    if purpose == "train":
        return _training_sampler(config, tokenizer, Path(output_dir or "."), accelerator, tasks, hf_prompts_per_call)
    ev = config.evaluation
    sampling = SamplingSettings.from_section(ev)
    template = config.student.chat_template_kwargs
    if config.evaluation_backend == "vllm":
        vllm, llm = colocated_engine(
            config,
            tokenizer,
            model_name=model_name or config.student.model_name,
            tasks=tasks or [],
            visible_tests=config.prompt.num_visible_tests if visible_tests is None else visible_tests,
            max_new_tokens=sample_budget(config, ev.max_new_tokens),
            lora_rank=adapter_rank(adapter) if adapter is not None else None,
            gpu_memory_utilization=ev.vllm_gpu_memory_utilization,  # alone on the GPU: not the training share
            logprobs=False,
            cpu_platform=is_cpu_platform(),  # every prompt phase 4 sends is seeded
        )
        return VLLMRollout(
            llm, tokenizer, ev.max_new_tokens, sampling, chat_template_kwargs=template, logprobs=False, vllm_module=vllm
        )
    if config.evaluation_backend == "kv":
        return KVCacheRollout(tokenizer, ev.max_new_tokens, sampling, template, config.grpo.sampler_dtype)
    return HFRollout(
        tokenizer,
        ev.max_new_tokens,
        sampling,
        template,
        batch_size=HF_EVAL_PROMPTS_PER_CALL,
        sequences_per_call=HF_EVAL_PROMPTS_PER_CALL * ev.num_samples,
    )


def _training_sampler(
    config: Config,
    tokenizer: Any,
    output_dir: Path,
    accelerator: Any,
    tasks: Sequence | None,
    hf_prompts_per_call: int | None = None,
) -> Sampler:
    """Phase 3's backend. vLLM: one colocated engine per process, on that process's GPU."""
    g = config.grpo
    template = config.student.chat_template_kwargs
    sampling = SamplingSettings.from_section(g)

    def vllm_rollout_args() -> tuple[Any, int, SamplingSettings, AdapterHandoff, int, dict[str, Any]]:
        """What both vLLM backends take after their engine; the adapter hand-off folder is made only when asked."""
        handoff = adapter_handoff(config, output_dir, accelerator)
        return tokenizer, g.max_new_tokens, sampling, handoff, g.gen_update_steps, template

    backend = config.rollout_backend  # 'auto' resolved
    if backend == "vllm_server":
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
    if backend == "vllm":
        ranks = RankInfo.from_accelerator(accelerator) if accelerator is not None else RankInfo()
        merged = config.vllm_weight_sync == "merged"  # 'auto' resolved by the student's dtype
        vllm, llm = colocated_engine(
            config,
            tokenizer,
            model_name=config.student.model_name,
            tasks=tasks or [],
            visible_tests=config.prompt.num_visible_tests,
            max_new_tokens=sample_budget(config),  # multi-turn: a sample grows to max_total_tokens after its prompt
            lora_rank=None if merged else config.lora.r,  # merged: no LoRA in the engine at all
            gpu_memory_utilization=g.vllm_gpu_memory_utilization,
            ranks=ranks,
            sleep_mode=g.vllm_sleep_mode,
            in_process=merged,
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
        if merged:  # the weights go to the engine in memory: no adapter folder
            import torch

            configured = DTYPES[config.student.torch_dtype]
            return VLLMRollout(
                llm,
                tokenizer,
                g.max_new_tokens,
                sampling,
                None,
                g.gen_update_steps,
                template,
                sleep_mode=g.vllm_sleep_mode,
                vllm_module=vllm,
                weight_sync="merged",
                engine_dtype=configured if isinstance(configured, torch.dtype) else None,
            )
        return VLLMRollout(llm, *vllm_rollout_args(), sleep_mode=g.vllm_sleep_mode, vllm_module=vllm)
    if backend == "kv":
        return KVCacheRollout(tokenizer, g.max_new_tokens, sampling, template, g.sampler_dtype)
    # prompts per `generate` call (each returns G sequences): phase 3 passes as many of the rollout batch as the
    # memory model lets sampling hold (training.memory_model.hf_prompts_per_call), else one micro-batch;
    # multi-turn continues that many sequences per call too
    prompts = hf_prompts_per_call or config.training.per_device_train_batch_size
    return HFRollout(
        tokenizer,
        g.max_new_tokens,
        sampling,
        template,
        batch_size=prompts,
        sequences_per_call=prompts * g.num_samples_per_prompt,
    )


def episodes_for(
    config: Config,
    pool: Any,
    *,
    visible_tests: int | None = None,
    max_new_tokens: int | None = None,
) -> Episodes | None:
    """How a sample of `multi_turn.mode` goes on after its first turn (None in single mode): its environment on
    `pool`, shown `visible_tests` tests (prompt.num_visible_tests if None), each turn bounded by `max_new_tokens`
    (grpo's if None) and the sample by `multi_turn.max_total_tokens`."""
    mode = config.multi_turn.mode
    if mode == "single":
        return None
    from environments.code_env import make_environment

    shown = config.prompt.num_visible_tests if visible_tests is None else visible_tests
    return Episodes(
        make_environment(mode, pool, config.multi_turn, shown),
        mode,
        config.grpo.max_new_tokens if max_new_tokens is None else max_new_tokens,
        config.multi_turn.max_total_tokens,
        config.student.chat_template_kwargs,
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
