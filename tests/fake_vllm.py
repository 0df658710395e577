"""A stand-in for the parts of vLLM 0.33.0 the project uses, behaving as vLLM does (read from its source).

It is not a mock that accepts anything: what vLLM rejects, it rejects; what vLLM returns, it returns.
- `LLM(**kwargs)`: `max_lora_rank` must be one of LoRAConfig's allowed ranks (1, 8, …, 512);
  unknown keyword arguments fail (EngineArgs is a dataclass); the worker's device is `cuda:0`
  unless `distributed_executor_backend="external_launcher"`, which reads RANK and LOCAL_RANK from
  the environment (KeyError when they are missing) and takes `cuda:{LOCAL_RANK}`.
- `generate`: a LoRA request needs `enable_lora`; the adapter folder is read when an adapter id is
  first seen (a folder without adapter_config.json, or an adapter whose rank exceeds max_lora_rank,
  fails as in vLLM); the stop token stays the last id of `token_ids` (vLLM keeps it, and the text
  leaves it out); an EOS of the model's generation config stops generation too; with
  `logprobs=0` each position carries {sampled id: Logprob}. Every call is recorded with the LoRA
  request (or None) and the digest of the adapter weights it used.
- `sleep` needs `enable_sleep_mode`; generating while asleep fails; `wake_up` restores.

`install(monkeypatch)` puts it in sys.modules as `vllm` and `vllm.lora.request`.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ALLOWED_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# The EngineArgs fields the project may pass (a subset of vLLM's; anything else is a TypeError here).
ENGINE_FIELDS = {
    "model",
    "dtype",
    "gpu_memory_utilization",
    "max_model_len",
    "seed",
    "enable_lora",
    "max_lora_rank",
    "max_loras",
    "enable_chunked_prefill",
    "enforce_eager",
    "distributed_executor_backend",
    "enable_sleep_mode",
    "logprobs_mode",
    "tensor_parallel_size",
}
SAMPLING_FIELDS = {
    "n",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "stop_token_ids",
    "skip_special_tokens",
    "seed",
    "logprobs",
    "stop",
    "include_stop_str_in_output",
}
LOGPROBS_MODES = ("raw_logits", "raw_logprobs", "processed_logits", "processed_logprobs")

ENGINES: list[FakeLLM] = []  # every engine built in this process, in order


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True


class SamplingParams:
    def __init__(self, **kwargs: Any) -> None:
        unknown = set(kwargs) - SAMPLING_FIELDS
        if unknown:
            raise TypeError(f"SamplingParams got unexpected keyword arguments {sorted(unknown)}")
        self.n = kwargs.get("n", 1)
        self.max_tokens = kwargs.get("max_tokens", 16)
        self.temperature = kwargs.get("temperature", 1.0)
        self.stop_token_ids = list(kwargs.get("stop_token_ids") or [])
        self.stop = list(kwargs.get("stop") or [])  # stop strings
        self.include_stop_str_in_output = bool(kwargs.get("include_stop_str_in_output", False))
        self.logprobs = kwargs.get("logprobs")
        self.seed = kwargs.get("seed")
        self.kwargs = kwargs


class LoRARequest:
    def __init__(self, lora_name: str, lora_int_id: int, lora_path: str = "", **extra: Any) -> None:
        if lora_int_id < 1:
            raise ValueError(f"id must be > 0, got {lora_int_id}")
        assert lora_path, "lora_path cannot be empty"
        self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path


def default_responder(prompt_ids: list[int], index: int, rng: random.Random) -> tuple[str, list[int]]:
    """A completion body (text, token ids) without its stop token: a few arbitrary tokens."""
    ids = [rng.randrange(100, 1000) for _ in range(rng.randrange(3, 8))]
    return "x" * len(ids), ids


@dataclass
class Call:
    lora: LoRARequest | None
    adapter_digest: str | None
    num_prompts: int
    params: SamplingParams


# vLLM's fused layers in the Llama/Qwen family (`packed_modules_mapping`): its in-place reload processes a layer once
# every element of it was loaded; one that got only some shards is materialised from `torch.empty_strided` at the end
# and copied whole into the live weight (vLLM 0.33.0 model_loader/reload/layerwise.py, meta.py).
FUSED_SHARDS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def partial_fused_groups(names: list[str]) -> list[str]:
    """The fused layers (as `prefix.qkv_proj.weight`) of which `names` hold some shards but not all."""
    partial = []
    for fused, shards in FUSED_SHARDS.items():
        for suffix in ("weight", "bias"):
            prefixes = {n[: -len(f"{s}.{suffix}")] for n in names for s in shards if n.endswith(f".{s}.{suffix}")}
            for prefix in sorted(prefixes):
                if any(f"{prefix}{s}.{suffix}" not in names for s in shards):
                    partial.append(f"{prefix}{fused}.{suffix}")
    return partial


class FakeLLM:
    """Set `responder`, `stop_with` (None: our first stop id; an int: e.g. a generation-config EOS;
    "length": run to max_tokens) and `logprob_of` on the class or the instance before generating."""

    responder = staticmethod(default_responder)
    stop_with: Any = None
    generation_config_eos: tuple[int, ...] = ()

    def __init__(self, model: str, **kwargs: Any) -> None:
        unknown = set(kwargs) - ENGINE_FIELDS
        if unknown:
            raise TypeError(f"EngineArgs.__init__() got unexpected keyword arguments {sorted(unknown)}")
        if kwargs.get("enable_lora") and kwargs.get("max_lora_rank", 16) not in ALLOWED_RANKS:
            raise ValueError(
                f"1 validation error for LoRAConfig\nmax_lora_rank\n  Input should be "
                f"{', '.join(map(str, ALLOWED_RANKS[:-1]))} or 512 [input_value={kwargs['max_lora_rank']}]"
            )
        if kwargs.get("logprobs_mode", "raw_logprobs") not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode {kwargs['logprobs_mode']!r}")
        if kwargs.get("distributed_executor_backend") == "external_launcher":
            rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
            self.device = f"cuda:{local_rank}"
        else:
            rank, self.device = 0, "cuda:0"  # the uniproc executor's worker uses local rank 0
        self.rank = rank
        self.model, self.kwargs = model, kwargs
        self.calls: list[Call] = []
        self.call_params: list[list[SamplingParams]] = []  # every call's SamplingParams, one per prompt
        self.loaded: dict[int, str] = {}  # adapter id -> digest of the weights read when first seen
        self.asleep = False
        self.merged_digest: str | None = None  # the merged weights last loaded (grpo.vllm_weight_sync=merged)
        self.merged_names: list[str] = []
        self.events: list[str] = []
        self.rng = random.Random(kwargs.get("seed", 0))
        ENGINES.append(self)

    def _load(self, request: LoRARequest) -> str:
        if request.lora_int_id not in self.loaded:
            folder = Path(request.lora_path)
            config = folder / "adapter_config.json"
            if not config.is_file():
                raise ValueError(f"Loading lora {request.lora_name} failed: No adapter found for {request.lora_path}")
            rank = json.loads(config.read_text())["r"]
            if rank > self.kwargs.get("max_lora_rank", 16):
                raise ValueError(
                    f"LoRA rank {rank} is greater than max_lora_rank {self.kwargs.get('max_lora_rank', 16)}."
                )
            weights = folder / "adapter_model.safetensors"
            self.loaded[request.lora_int_id] = hashlib.sha256(weights.read_bytes()).hexdigest()[:16]
        return self.loaded[request.lora_int_id]

    def generate(
        self,
        prompts: Any,
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        lora_request: LoRARequest | None = None,
        **kwargs: Any,
    ) -> list[RequestOutput]:
        if self.asleep:
            raise RuntimeError("the engine is asleep (its weights are offloaded): call wake_up() first")
        if lora_request is not None and not self.kwargs.get("enable_lora"):
            raise ValueError(f"LoRA is not enabled! Got lora_request={lora_request.lora_name}")
        digest = self._load(lora_request) if lora_request is not None else None
        if isinstance(sampling_params, list):  # one per prompt (vllm/entrypoints/llm.py: lengths must match)
            if len(sampling_params) != len(prompts):
                raise ValueError("The lengths of prompts and sampling_params must be the same.")
            per_prompt = sampling_params
        else:
            per_prompt = [sampling_params or SamplingParams()] * len(prompts)
        digest = digest if lora_request is not None else self.merged_digest
        self.calls.append(Call(lora_request, digest, len(prompts), per_prompt[0] if per_prompt else SamplingParams()))
        self.call_params.append(per_prompt)
        self.events.append("generate")
        limit = self.kwargs.get("max_model_len")
        outputs = []
        for number, (prompt, params) in enumerate(zip(prompts, per_prompt, strict=True)):
            ids = list(prompt["prompt_token_ids"])
            if limit is not None and len(ids) + 1 > limit:
                raise ValueError(
                    f"The decoder prompt (length {len(ids)}) is longer than the maximum model length of {limit}."
                )
            completions = []
            # a seeded request draws from its own generator (vLLM: per-request generators); others share the
            # engine's stream, which continues from call to call
            rng = random.Random(params.seed) if params.seed is not None else self.rng
            for i in range(params.n):
                text, body = type(self).responder(ids, i, rng)
                stop = self.stop_with if self.stop_with is not None else (params.stop_token_ids or [None])[0]
                hit = min(((text.index(s), s) for s in params.stop if s in text), default=None)
                if hit is not None and len(body) <= params.max_tokens:
                    # a stop string: vLLM keeps the ids up to the token that completed it (a responder that
                    # writes one returns exactly those ids) and cuts the text at it (or after it)
                    end = hit[0] + (len(hit[1]) if params.include_stop_str_in_output else 0)
                    token_ids, finish, reason, text = list(body), "stop", hit[1], text[:end]
                elif stop == "length" or stop is None:
                    token_ids, finish, reason = (body * params.max_tokens)[: params.max_tokens], "length", None
                else:
                    token_ids, finish, reason = (body[: params.max_tokens - 1] + [stop]), "stop", stop
                logprobs = None
                if params.logprobs is not None:
                    logprobs = [{t: Logprob(self.logprob_of(ids, j, t), rank=1)} for j, t in enumerate(token_ids)]
                completions.append(CompletionOutput(i, text, token_ids, None, logprobs, finish, reason))
            outputs.append(RequestOutput(str(number), None, ids, completions))
        return outputs

    @property
    def llm_engine(self) -> Any:
        """vLLM's LLMEngine has `model_executor` only when the worker runs in this process (the external launcher),
        which the merged weight sync needs."""
        in_process = self.kwargs.get("distributed_executor_backend") == "external_launcher"
        return types.SimpleNamespace(model_executor=object()) if in_process else types.SimpleNamespace()

    def collective_rpc(
        self, method: Any, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None
    ) -> list[Any]:
        """`reload_weights(weights_iterator=..., is_checkpoint_format=True)`: the merged weights are read (a
        digest of them is kept, as `loaded` keeps one per adapter) and the engine samples with them."""
        if method != "reload_weights":
            raise AttributeError(f"the fake worker has no method {method!r}")
        kwargs = kwargs or {}
        if self.kwargs.get("enable_lora"):
            raise AssertionError("merged weights were loaded into an engine built with LoRA")
        digest = hashlib.sha256()
        names = []
        for name, tensor in kwargs["weights_iterator"]:
            names.append(name)
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().float().numpy().tobytes())
        partial = partial_fused_groups(names)
        if partial:  # vLLM builds such a layer from uninitialised memory (reload/meta.py) and loads it whole
            raise AssertionError(f"reload_weights got part of a fused layer: {partial[:3]}")
        self.merged_names = names
        self.merged_digest = digest.hexdigest()[:16]
        self.events.append("reload_weights")
        return [None]

    def reset_prefix_cache(self) -> bool:
        self.events.append("reset_prefix_cache")
        return True

    def logprob_of(self, prompt_ids: list[int], position: int, token: int) -> float:
        return -0.5 - 0.01 * ((token + position) % 7)

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        if not self.kwargs.get("enable_sleep_mode"):
            raise ValueError("Sleep mode is not enabled: build the engine with enable_sleep_mode=True.")
        self.asleep = True
        self.events.append(f"sleep{level}")

    def wake_up(self, tags: list[str] | None = None) -> bool:
        self.asleep = False
        self.events.append("wake_up")
        return True


def module() -> types.SimpleNamespace:
    return types.SimpleNamespace(LLM=FakeLLM, SamplingParams=SamplingParams, __version__="0.33.0")


def install(monkeypatch: Any = None) -> types.SimpleNamespace:
    """Make `import vllm` and `from vllm.lora.request import LoRARequest` find the fake."""
    fake = module()
    request_module = types.SimpleNamespace(LoRARequest=LoRARequest)
    entries: dict[str, Any] = {
        "vllm": fake,
        "vllm.lora": types.SimpleNamespace(request=request_module),
        "vllm.lora.request": request_module,
    }
    for name, value in entries.items():
        if monkeypatch is not None:
            monkeypatch.setitem(sys.modules, name, value)
        else:
            sys.modules[name] = value
    return fake
