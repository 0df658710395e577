"""A batched KV-cache sampler for Llama-family decoders: rollouts at the speed of the CPU.

transformers `generate` spends most of a decode step on Python (cache objects, logits processors,
stopping criteria, ~40 modules per layer) when the model is small: on 2 cores the 135M embedded
student runs at ~50 generated tokens/s, a fraction of what the memory bandwidth and matmul units
allow. This module samples from the same weights with a short hand-written loop:

- `DecoderWeights.from_model` takes a sampling copy of a transformers Llama/Qwen2/Qwen3 model
  (peft-wrapped or not): each active LoRA adapter is merged (W + B @ A * scale, peft's own
  `get_delta_weight`), q/k/v and gate/up are fused into one matrix each, optionally cast to bf16.
  That copy is what a rollout samples from; building it is the per-optimizer-step adapter cost.
- `sample_token_ids` prefills every distinct prompt once, copies its KV cache to its `num_samples`
  rows, decodes all rows together and drops finished rows from the batch as they end.
- The sampling knobs are applied to float32 logits exactly as transformers' processors do
  (`warp_logits`: repetition penalty, temperature, top-k, top-p, min-p, in generate's order).
- Each sampled token comes with its log-prob under softmax(logits / temperature) in float32: the
  quantity the trainer computes (`training.losses.selective_log_softmax`), so the trainer can
  measure and correct the sampler/learner gap (truncated importance sampling) when sampling in bf16.

What this module does not know: configs, prompts, rewards. Callers pass token ids and plain knobs.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from rollouts.completion import RolloutCompletion
from rollouts.protocol import Continuation, SamplerBase
from rollouts.sampling import SamplingSettings

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # inv_freq does not depend on the sequence length


class UnsupportedModelError(ValueError):
    """The model's architecture is one this sampler does not implement; use the `generate` backend."""


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # (H,) float32
    qkv: torch.Tensor  # (Hq*D + 2*Hkv*D, H) in the compute dtype
    qkv_bias: torch.Tensor | None  # (Hq*D + 2*Hkv*D,) float32 (Qwen2)
    q_norm: torch.Tensor | None  # (D,) float32 (Qwen3: RMSNorm per head before RoPE)
    k_norm: torch.Tensor | None
    o: torch.Tensor  # (H, Hq*D)
    post_norm: torch.Tensor  # (H,) float32
    gate_up: torch.Tensor  # (2I, H)
    down: torch.Tensor  # (H, I)


@dataclass
class DecoderWeights:
    """A sampling copy of a decoder: merged, fused, in `dtype`. Norms, biases and RoPE stay float32."""

    embed: torch.Tensor  # (V, H)
    layers: list[LayerWeights]
    norm: torch.Tensor  # (H,) float32
    lm_head: torch.Tensor  # (V, H)
    inv_freq: torch.Tensor  # (D/2,) float32
    rope_scale: float  # transformers' `attention_scaling` (1 for default RoPE)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    dtype: torch.dtype = torch.float32
    build_seconds: float = field(default=0.0)

    @property
    def num_bytes(self) -> int:
        """Bytes of weights one decode step reads (the embedding table is only gathered from)."""
        tensors = [self.norm, self.lm_head]
        for layer in self.layers:
            tensors += [
                t
                for t in (
                    layer.input_norm,
                    layer.qkv,
                    layer.qkv_bias,
                    layer.q_norm,
                    layer.k_norm,
                    layer.o,
                    layer.post_norm,
                    layer.gate_up,
                    layer.down,
                )
                if t is not None
            ]
        return sum(t.numel() * t.element_size() for t in tensors)

    @classmethod
    @torch.no_grad()
    def from_model(cls, model: Any, dtype: torch.dtype = torch.float32) -> DecoderWeights:
        """The sampling copy of `model` with its active LoRA adapters merged (none when they are disabled)."""
        start = time.perf_counter()
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = base.config
        check_supported(config)
        device = next(base.parameters()).device
        if device.type != "cpu":
            raise UnsupportedModelError(
                f"the kv-cache sampler runs on CPU, the model is on {device}; sample with the "
                "hf or vllm backend (grpo.rollout_backend, evaluation.backend)."
            )
        inner = base.model
        rotary = inner.rotary_emb
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads

        def f32(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.detach().float().clone()

        def norm_weight(t: torch.Tensor) -> torch.Tensor:  # RMSNorm weights: always present
            return t.detach().float().clone()

        def empty(*modules: Any) -> torch.Tensor:  # filled by `refresh`
            shapes = [linear_base(m).weight.shape for m in modules]
            return torch.empty(sum(s[0] for s in shapes), shapes[0][1], dtype=dtype)

        layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            biases = [linear_base(p).bias for p in (attn.q_proj, attn.k_proj, attn.v_proj)]
            layers.append(
                LayerWeights(
                    input_norm=norm_weight(layer.input_layernorm.weight),
                    qkv=empty(attn.q_proj, attn.k_proj, attn.v_proj),
                    qkv_bias=f32(torch.cat(biases)) if all(b is not None for b in biases) else None,
                    q_norm=f32(attn.q_norm.weight) if hasattr(attn, "q_norm") else None,
                    k_norm=f32(attn.k_norm.weight) if hasattr(attn, "k_norm") else None,
                    o=empty(attn.o_proj),
                    post_norm=norm_weight(layer.post_attention_layernorm.weight),
                    gate_up=empty(mlp.gate_proj, mlp.up_proj),
                    down=empty(mlp.down_proj),
                )
            )
        embed = inner.embed_tokens.weight.detach().to(dtype).clone()
        tied = linear_base(base.lm_head).weight.data_ptr() == inner.embed_tokens.weight.data_ptr()
        lm_head = embed if tied else empty(base.lm_head)  # tied: one copy
        weights = cls(
            embed=embed,
            layers=layers,
            norm=norm_weight(inner.norm.weight),
            lm_head=lm_head,
            inv_freq=rotary.inv_freq.detach().float().clone(),
            rope_scale=float(getattr(rotary, "attention_scaling", 1.0)),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            eps=float(config.rms_norm_eps),
            dtype=dtype,
        )
        weights.refresh(model)
        weights.build_seconds = time.perf_counter() - start
        return weights

    @torch.no_grad()
    def refresh(self, model: Any) -> float:
        """Write `model`'s current adapted weights into this copy, in place (the per-optimizer-step adapter
        update: only LoRA-wrapped layers and an untied head change; embedding and norms are frozen). Returns
        the seconds it took (also kept in `build_seconds`)."""
        start = time.perf_counter()
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        for target, layer in zip(self.layers, base.model.layers, strict=True):
            attn, mlp = layer.self_attn, layer.mlp
            write_weights(target.qkv, (attn.q_proj, attn.k_proj, attn.v_proj))
            write_weights(target.o, (attn.o_proj,))
            write_weights(target.gate_up, (mlp.gate_proj, mlp.up_proj))
            write_weights(target.down, (mlp.down_proj,))
        if self.lm_head.data_ptr() != self.embed.data_ptr():
            write_weights(self.lm_head, (base.lm_head,))
        self.build_seconds = time.perf_counter() - start
        return self.build_seconds


def check_supported(config: Any) -> None:
    """Refuse, with the way out, an architecture whose forward this module does not reproduce."""
    problems = unsupported_features(config)
    if problems:
        raise UnsupportedModelError(
            f"the kv-cache sampler does not implement {'; '.join(problems)}; sample with the "
            "transformers backend instead (grpo.rollout_backend=hf / evaluation backend hf)."
        )


def unsupported_features(config: Any) -> list[str]:
    """What of a model config's architecture this module does not implement (empty: it can sample the model)."""
    kind = getattr(config, "model_type", "?")
    problems = []
    if kind not in SUPPORTED_MODEL_TYPES:
        problems.append(f"model_type {kind!r} (supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    if getattr(config, "hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {config.hidden_act!r}")
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type not in STATIC_ROPE_TYPES:
        problems.append(f"rope_type {rope_type!r}")
    if getattr(config, "use_sliding_window", False) or getattr(config, "sliding_window", None) and kind == "mistral":
        problems.append("sliding-window attention")
    return problems


def linear_base(module: Any) -> Any:
    """The plain linear layer under a peft LoRA wrapper (or the layer itself)."""
    return getattr(module, "base_layer", module)


def write_weights(target: torch.Tensor, modules: tuple[Any, ...]) -> None:
    """Stack the effective weights of `modules` (rows in order) into `target`, cast to its dtype."""
    row = 0
    for module in modules:
        weight = linear_base(module).weight
        rows = weight.shape[0]
        out = target[row : row + rows]
        lora = active_lora(module)
        if not lora:
            out.copy_(weight)
        elif len(lora) == 1 and out.dtype == weight.dtype and not getattr(module, "fan_in_fan_out", False):
            a, b, scale = lora[0]
            torch.addmm(weight, b, a, alpha=scale, out=out)  # W + scale * B @ A, written in place
        elif len(lora) == 1 and not getattr(module, "fan_in_fan_out", False):
            a, b, scale = lora[0]
            out.copy_(torch.addmm(weight, b, a, alpha=scale))  # rounded once, from the float32 sum
        else:
            merged = weight.clone()
            for a, b, scale in lora:
                delta = b @ a * scale
                merged += delta.T if getattr(module, "fan_in_fan_out", False) else delta
            out.copy_(merged)
        row += rows


def active_lora(module: Any) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """(A (r, in), B (out, r), scale) of each adapter a peft LoRA layer applies now (peft's merge math:
    W + B @ A * scale, `get_delta_weight`). None for a plain layer, a merged adapter (already inside W) or
    adapters switched off by `disable_adapter()`."""
    if (
        not hasattr(module, "base_layer")
        or getattr(module, "merged", False)
        or getattr(module, "disable_adapters", False)
    ):
        return []
    found = []
    for name in module.active_adapters:
        if name not in getattr(module, "lora_A", {}):
            continue
        if getattr(module, "use_dora", {}).get(name, False):
            raise UnsupportedModelError("DoRA adapters are not supported by the kv-cache sampler; use the hf backend.")
        found.append(
            (module.lora_A[name].weight.detach(), module.lora_B[name].weight.detach(), float(module.scaling[name]))
        )
    return found


# ------------------------------------------------------------------------------------------------
# Sampling knobs (rollouts.sampling.SamplingSettings), as transformers' logits processors apply them


def warp_logits(logits: torch.Tensor, knobs: SamplingSettings, seen: torch.Tensor | None = None) -> torch.Tensor:
    """Scores (B, V) float32 after transformers' processors, in `generate`'s order: repetition penalty
    (on every token in `seen` (B, V) bool: the prompt and what was sampled), then temperature, top-k,
    top-p, min-p (removed tokens are -inf). Each step equals the transformers processor of the same name
    with min_tokens_to_keep = 1 (tests/integration/rollouts/test_kv_sampler.py compares them). One difference
    from `generate` with left padding: transformers also penalizes the pad id (its input_ids hold the padding);
    here only real prompt tokens count."""
    scores = logits.float()
    if knobs.repetition_penalty != 1.0 and seen is not None:
        penalized = torch.where(scores < 0, scores * knobs.repetition_penalty, scores / knobs.repetition_penalty)
        scores = torch.where(seen, penalized, scores)
    if knobs.temperature <= 0:  # greedy: generate applies no warper
        return scores
    if knobs.temperature != 1.0:
        scores = scores / knobs.temperature
    if knobs.top_k and knobs.top_k > 0:
        k = min(knobs.top_k, scores.shape[-1])
        kth = torch.topk(scores, k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, -math.inf)
    if knobs.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= 1 - knobs.top_p
        remove[..., -1:] = False  # keep at least one token
        scores = scores.masked_fill(remove.scatter(1, order, remove), -math.inf)
    if knobs.min_p and knobs.min_p > 0:
        probs = scores.softmax(dim=-1)
        threshold = knobs.min_p * probs.amax(dim=-1, keepdim=True)
        remove = probs < threshold
        order = torch.argsort(scores, dim=-1, descending=True)
        keep_first = torch.zeros_like(remove).scatter_(1, order[:, :1], True)
        scores = scores.masked_fill(remove & ~keep_first, -math.inf)
    return scores


def choose_tokens(
    scores: torch.Tensor, knobs: SamplingSettings, generator: torch.Generator | None = None
) -> torch.Tensor:
    """(B,) token ids: argmax when greedy, else a draw from softmax(scores) (torch's global RNG unless given one)."""
    if knobs.temperature <= 0:
        return scores.argmax(dim=-1)
    return torch.multinomial(scores.softmax(dim=-1), 1, generator=generator).squeeze(-1)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / temperature)[token] in float32 (B,): what the trainer computes for the token."""
    scores = logits.float()
    if temperature > 0 and temperature != 1.0:
        scores = scores / temperature
    return scores.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scores, dim=-1)


# ------------------------------------------------------------------------------------------------
# The forward pass


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm on float32 x (..., H)."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, transformers' rotate_half convention; x (B, h, T, D), cos/sin (B, 1, T, D)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class KVCache:
    """Keys and values of every layer for B rows and up to `length` positions, in the compute dtype."""

    def __init__(
        self, num_layers: int, rows: int, kv_heads: int, length: int, head_dim: int, dtype: torch.dtype
    ) -> None:
        shape = (num_layers, rows, kv_heads, length, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype)
        self.values = torch.zeros(shape, dtype=dtype)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (a drop of finished rows, or a copy of each prompt's cache to its samples)."""
        self.keys = self.keys.index_select(1, rows)
        self.values = self.values.index_select(1, rows)


def forward(
    weights: DecoderWeights,
    ids: torch.Tensor,
    positions: torch.Tensor,
    cache: KVCache,
    start: int,
    key_bias: torch.Tensor,
    last_only: bool = True,
) -> torch.Tensor:
    """Run `ids` (B, T) at cache columns [start, start + T); returns float32 logits (B, V) of the last column
    (or (B, T, V)).

    positions (B, T): each token's RoPE position (real tokens before it; left padding is not counted).
    key_bias (B, start + T): 0 for a real key, -inf for a padding column. Queries attend causally; a padding
    query also attends to itself, so that no row is all -inf (its output is never used).
    """
    rows, steps = ids.shape
    heads, kv_heads, dim = weights.num_heads, weights.num_kv_heads, weights.head_dim
    group = heads // kv_heads
    end = start + steps
    dtype = weights.dtype
    angles = positions.unsqueeze(-1).float() * weights.inv_freq  # (B, T, D/2)
    angles = torch.cat((angles, angles), dim=-1)
    cos = (angles.cos() * weights.rope_scale).unsqueeze(1)  # (B, 1, T, D)
    sin = (angles.sin() * weights.rope_scale).unsqueeze(1)
    mask = key_bias[:, None, None, None, :end].expand(rows, 1, 1, steps, end)  # (B, 1, 1, T, L)
    if steps > 1:
        causal = torch.ones(steps, end, dtype=torch.bool).tril(diagonal=start)
        diagonal = torch.zeros(steps, end, dtype=torch.bool)
        diagonal[torch.arange(steps), torch.arange(start, end)] = True
        mask = torch.where(causal, mask, -math.inf)
        mask = torch.where(diagonal, torch.zeros((), dtype=mask.dtype), mask)
    mask = mask.to(dtype)
    scale = dim**-0.5
    x = weights.embed[ids].float()  # (B, T, H): the residual stream stays float32
    for index, layer in enumerate(weights.layers):
        h = rms_norm(x, layer.input_norm, weights.eps).to(dtype)
        qkv = h @ layer.qkv.T  # (B, T, (Hq + 2 Hkv) D)
        if layer.qkv_bias is not None:
            qkv = qkv + layer.qkv_bias.to(dtype)
        q, k, v = qkv.split((heads * dim, kv_heads * dim, kv_heads * dim), dim=-1)
        q = q.view(rows, steps, heads, dim).transpose(1, 2).float()  # (B, Hq, T, D)
        k = k.view(rows, steps, kv_heads, dim).transpose(1, 2).float()
        if layer.q_norm is not None and layer.k_norm is not None:  # Qwen3: both or neither
            q, k = rms_norm(q, layer.q_norm, weights.eps), rms_norm(k, layer.k_norm, weights.eps)
        q, k = rope(q, cos, sin).to(dtype), rope(k, cos, sin).to(dtype)
        cache.keys[index, :, :, start:end] = k
        cache.values[index, :, :, start:end] = v.view(rows, steps, kv_heads, dim).transpose(1, 2)
        keys, values = cache.keys[index, :, :, :end], cache.values[index, :, :, :end]  # (B, Hkv, L, D)
        # grouped-query attention without repeating K/V: the G query heads of a KV head share one matmul
        # (keys @ q^T, not q @ keys^T: a transposed view of the cache would be copied whole by a bf16 matmul)
        qg = q.reshape(rows, kv_heads, group * steps, dim)
        scores = (keys @ qg.transpose(-1, -2)).transpose(-1, -2)  # (B, Hkv, G*T, L)
        scores = scores.reshape(rows, kv_heads, group, steps, end) * scale + mask  # (B, Hkv, G, T, L)
        probs = scores.float().softmax(dim=-1).to(dtype).view(rows, kv_heads, group * steps, end)
        attended = (probs @ values).view(rows, heads, steps, dim).transpose(1, 2)
        x = x + (attended.reshape(rows, steps, heads * dim) @ layer.o.T).float()
        h = rms_norm(x, layer.post_norm, weights.eps).to(dtype)
        gate, up = (h @ layer.gate_up.T).chunk(2, dim=-1)
        x = x + ((torch.nn.functional.silu(gate) * up) @ layer.down.T).float()
    if last_only:
        x = x[:, -1]
    x = rms_norm(x, weights.norm, weights.eps).to(dtype)
    return (x @ weights.lm_head.T).float()


# ------------------------------------------------------------------------------------------------
# The sampling loop


@dataclass(frozen=True)
class SampledRow:
    """One continuation `sample_token_ids` returns (`KVCacheRollout` makes a `RolloutCompletion` of it)."""

    token_ids: tuple[int, ...]  # the new ids, ending with the stop token or the token that completed a stop string
    logprobs: tuple[float, ...]  # float32 log-prob of each new id at the sampling temperature
    finish_reason: str  # "stop" or "length"
    stop_string: str | None  # the stop string it stopped at, if any


@dataclass
class _Row:
    """A row while it is being sampled."""

    prompt: int  # index of its prompt
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = ""
    stop_string: str | None = None


def _stop_string_hit(tokenizer: Any, tokens: list[int], stop_strings: tuple[str, ...], window: int) -> str | None:
    """The stop string the newest tokens completed, if any (only text this row generated is searched)."""
    tail_text = tokenizer.decode(tokens[-window:], skip_special_tokens=False)
    newest = tokenizer.decode(tokens[-1:], skip_special_tokens=False)
    for stop in stop_strings:
        at = tail_text.rfind(stop)
        if at >= 0 and at + len(stop) > len(tail_text) - len(newest):  # it ends inside the newest token
            return stop
    return None


@torch.no_grad()
def sample_token_ids(
    weights: DecoderWeights,
    prompts: list[list[int]],
    num_samples: int,
    max_new_tokens: int,
    *,
    knobs: SamplingSettings,
    stop_token_ids: set[int] | frozenset[int],
    pad_id: int,
    stop_strings: tuple[str, ...] = (),
    tokenizer: Any = None,
    max_batch_rows: int = 64,
    generator: torch.Generator | None = None,
) -> list[list[SampledRow]]:
    """`num_samples` continuations of each token-id sequence in `prompts`, up to `max_new_tokens` each.

    A row ends at a stop token id (kept as its last token, finish_reason "stop"), at a stop string (the
    token that completes it is the last one kept, finish_reason "stop", `stop_string` says which; needs
    `tokenizer`), or after `max_new_tokens` ("length"). Prompts go through in groups of at most
    `max_batch_rows // num_samples` (at least one prompt). Returns, per prompt, a list of `SampledRow`s.
    """
    if stop_strings and tokenizer is None:
        raise ValueError("stop strings need the tokenizer")
    per_group = max(1, max_batch_rows // max(num_samples, 1))
    results: list[list[SampledRow]] = []
    for start in range(0, len(prompts), per_group):
        results.extend(
            _sample_group(
                weights,
                prompts[start : start + per_group],
                num_samples,
                max_new_tokens,
                knobs,
                frozenset(stop_token_ids),
                pad_id,
                tuple(stop_strings),
                tokenizer,
                generator,
            )
        )
    return results


def _sample_group(
    weights: DecoderWeights,
    prompts: list[list[int]],
    num_samples: int,
    max_new_tokens: int,
    knobs: SamplingSettings,
    stop_ids: frozenset[int],
    pad_id: int,
    stop_strings: tuple[str, ...],
    tokenizer: Any,
    generator: torch.Generator | None,
) -> list[list[SampledRow]]:
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    width = max(len(p) for p in prompts)
    length = width + max_new_tokens
    lengths = torch.tensor([len(p) for p in prompts])
    ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts])
    real = torch.arange(width).unsqueeze(0) >= (width - lengths).unsqueeze(1)  # (P, W)
    key_bias = torch.full((len(prompts), length), 0.0)
    key_bias[:, :width] = torch.where(real, 0.0, -math.inf)
    positions = (real.long().cumsum(-1) - 1).clamp(min=0)
    cache = KVCache(len(weights.layers), len(prompts), weights.num_kv_heads, length, weights.head_dim, weights.dtype)
    logits = forward(weights, ids, positions, cache, 0, key_bias)  # (P, V): each prompt once

    # every prompt's cache, bias and logits copied to its num_samples rows
    expand = torch.arange(len(prompts)).repeat_interleave(num_samples)
    cache.select(expand)
    key_bias, logits, next_position = key_bias[expand], logits[expand], lengths[expand]
    rows = [_Row(prompt=int(p)) for p in expand]
    alive = list(range(len(rows)))  # row index of each batch position
    seen = None
    if knobs.repetition_penalty != 1.0:
        seen = torch.zeros(len(rows), logits.shape[-1], dtype=torch.bool)
        for i, row in enumerate(rows):
            seen[i, torch.tensor(prompts[row.prompt])] = True
    window = max((len(s) for s in stop_strings), default=0) + 2
    # With a truncation or penalty on, the sampled distribution is the warped one: its log-probs are what the
    # trainer's importance weights must see (as vLLM's processed_logprobs). Plain temperature sampling keeps
    # the full-softmax log-probs, which are the same distribution.
    warped = knobs.temperature > 0 and (
        (knobs.top_k or 0) > 0 or knobs.top_p < 1.0 or knobs.min_p > 0 or knobs.repetition_penalty != 1.0
    )
    for step in range(max_new_tokens):
        scores = warp_logits(logits, knobs, seen)  # (B, V) float32
        tokens = choose_tokens(scores, knobs, generator)
        if warped:
            chosen_logp = scores.log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (B,)
        else:
            chosen_logp = token_logprobs(logits, tokens, knobs.temperature)
        keep = []
        for position, (token, logp) in enumerate(zip(tokens.tolist(), chosen_logp.tolist(), strict=True)):
            row = rows[alive[position]]
            row.tokens.append(token)
            row.logprobs.append(logp)
            if token in stop_ids:
                row.finish_reason = "stop"
            elif stop_strings and (hit := _stop_string_hit(tokenizer, row.tokens, stop_strings, window)) is not None:
                row.finish_reason, row.stop_string = "stop", hit
            elif step + 1 == max_new_tokens:
                row.finish_reason = "length"
            else:
                keep.append(position)
        if not keep:
            break
        if len(keep) < len(alive):  # finished rows leave the batch
            index = torch.tensor(keep)
            cache.select(index)
            tokens, key_bias, next_position = tokens[index], key_bias[index], next_position[index]
            if seen is not None:
                seen = seen[index]
            alive = [alive[p] for p in keep]
        if seen is not None:
            seen[torch.arange(len(alive)), tokens] = True
        logits = forward(weights, tokens.unsqueeze(1), next_position.unsqueeze(1), cache, width + step, key_bias)
        next_position = next_position + 1
    grouped: list[list[SampledRow]] = [[] for _ in prompts]
    for row in rows:
        sampled = SampledRow(tuple(row.tokens), tuple(row.logprobs), row.finish_reason, row.stop_string)
        grouped[row.prompt].append(sampled)
    return grouped


# ------------------------------------------------------------------------------------------------
# The rollout backend (the interface of rollouts.hf.HFRollout)

SAMPLER_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def sampler_stop_ids(tokenizer: Any, model: Any) -> set[int]:
    """What ends a completion, as `rollouts.hf.generate_completions` decides it: the chat template's
    end-of-turn, the tokenizer's EOS and every EOS id of the model's generation config."""
    from rollouts.hf import generation_eos_ids
    from utils.sft_data import end_of_turn_id

    return ({end_of_turn_id(tokenizer)} | generation_eos_ids(model) | {tokenizer.eos_token_id}) - {None}


class KVCacheRollout(SamplerBase):
    """The `Sampler` over `sample_token_ids`: G completions per prompt from a sampling copy of the policy.

    `sync` refreshes the copy from the model (`DecoderWeights.refresh`: the current adapter merged in place,
    ~0.1-0.5 s for the 135M student), so every rollout samples the current policy; inside
    `model.disable_adapter()` it is the base model. Records are those of `generate_completions` plus `logprobs`
    (the sampler's float32 log-prob of each token at the sampling temperature): the trainer turns the bf16/fp32
    gap into truncated importance weights (`grpo.importance_sampling`), as for vLLM, and logs it as
    rollout/logp_abs_diff.
    """

    def __init__(
        self,
        tokenizer: Any,
        max_new_tokens: int,
        sampling: SamplingSettings,
        chat_template_kwargs: dict | None = None,
        dtype: str = "bfloat16",
        *,
        max_batch_rows: int = 64,
    ) -> None:
        if dtype not in SAMPLER_DTYPES:
            raise ValueError(f"sampler dtype {dtype!r}: choose one of {', '.join(SAMPLER_DTYPES)}")
        super().__init__(tokenizer, max_new_tokens, sampling, chat_template_kwargs)
        self.dtype = SAMPLER_DTYPES[dtype]
        self.max_batch_rows = max_batch_rows
        self.weights: DecoderWeights | None = None
        self._source: int | None = None

    def sync(self, policy: Any, step: int) -> None:
        """The sampling copy of `policy` as it is now (built once, refreshed in place afterwards)."""
        self.policy = policy
        if self.weights is None or self._source != id(policy):
            self.weights, self._source = DecoderWeights.from_model(policy, self.dtype), id(policy)
        else:
            self.weights.refresh(policy)

    def sample(self, prompts: list[str], num_samples: int, *, seed: int | None = None) -> list[list[RolloutCompletion]]:
        """`seed` is not used: the sampler draws from the process's (seeded) torch generator."""
        return self._continue([self.encode(p) for p in prompts], num_samples, self.max_new_tokens, ())

    def continue_sequences(
        self, sequences: list[list[int]], max_new_tokens: list[int], stop_strings: tuple[str, ...]
    ) -> list[Continuation]:
        """One `sample_token_ids` call per distinct budget; the records keep the sampler's float32 log-probs."""
        results: list[Continuation | None] = [None] * len(sequences)
        for budget in sorted(set(max_new_tokens)):
            rows = [i for i, b in enumerate(max_new_tokens) if b == budget]
            groups = self._continue([sequences[i] for i in rows], 1, budget, stop_strings)
            for i, [record] in zip(rows, groups, strict=True):
                results[i] = Continuation.from_record(record)
        return results  # type: ignore[return-value]

    def continue_ids(
        self,
        model: Any,
        sequences: list[list[int]],
        num_samples: int = 1,
        max_new_tokens: int | None = None,
        stop_strings: tuple[str, ...] = (),
    ) -> list[list[RolloutCompletion]]:
        """Continue each token-id sequence (a templated prompt, or a multi-turn conversation so far) by up to
        `max_new_tokens` tokens, `num_samples` times, stopping at a stop token or at the first of `stop_strings`
        found in the generated text (e.g. a closing tag; the token completing it is the last one kept), sampling
        `model` as it is now.

        Returns per sequence a list of `RolloutCompletion`s with `logprobs` and `stop_string`: token_ids are the
        new tokens only (with the stop token or the token that completed the stop string), text their decoding
        without special tokens (a stop string is in it)."""
        self.sync(model, 0)
        budget = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        return self._continue(sequences, num_samples, budget, tuple(stop_strings))

    def _continue(
        self, sequences: list[list[int]], num_samples: int, budget: int, stop_strings: tuple[str, ...]
    ) -> list[list[RolloutCompletion]]:
        assert self.weights is not None, "sync the sampler with a policy first"
        stops = sampler_stop_ids(self.tokenizer, self.policy)
        groups = sample_token_ids(
            self.weights,
            sequences,
            num_samples,
            budget,
            knobs=self.sampling,
            stop_token_ids=stops,
            pad_id=self.tokenizer.pad_token_id,
            stop_strings=stop_strings,
            tokenizer=self.tokenizer,
            max_batch_rows=self.max_batch_rows,
        )
        results = []
        for prompt_ids, group in zip(sequences, groups, strict=True):
            samples = []
            for row in group:
                ids = list(row.token_ids)
                ended_on_id = bool(ids) and ids[-1] in stops and row.finish_reason == "stop"
                samples.append(
                    RolloutCompletion(
                        text=self.tokenizer.decode(ids[:-1] if ended_on_id else ids, skip_special_tokens=True),
                        token_ids=row.token_ids,
                        prompt_ids=tuple(prompt_ids),
                        finish_reason=row.finish_reason,
                        logprobs=row.logprobs,
                        stop_string=row.stop_string,
                    )
                )
            results.append(samples)
        return results
