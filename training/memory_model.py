"""Peak GPU memory of phase 3, predicted from the student's shapes and the config (arithmetic; only
`student_shape` reads a model's config.json).

The terms are the tensors autograd and the loss actually hold, counted from what
`benchmarks/bench_memory.py` measured on CPU for a Qwen3 decoder layer with the project's LoRA (bf16 base,
peft's fp32 adapter weights) and for the project's own log-prob code (`training.batching.completion_logprobs`,
`training.losses.selective_log_softmax`); `tests/integration/training/test_memory_model.py` pins the formula
against a measured small shape. Every figure is in bytes. Shapes: c sequences per forward
(`training.forward_chunk_size`), L tokens per sequence (prompt P + completion T), V vocabulary, h hidden,
I MLP width, r the LoRA rank.

What one GRPO pass holds at its peak (`policy_pass`):
- static: the frozen base weights, and per LoRA parameter its fp32 weight, gradient and Adam m and v (16 B);
- kept activations: per token and decoder layer `kept_per_token_layer` (peft casts every adapted layer's
  input to fp32 and `lora_A` keeps that copy: seven copies per layer, q, k and v each casting the same input);
  with gradient checkpointing only each layer's input (2h B in bf16), plus one layer recomputed in the backward;
- the log-prob head: `selective_log_softmax` keeps each row's fp32 logits (4cTV) for `logsumexp`'s backward;
  the backward of the first row adds three fp32 row temporaries (x - lse, its exp, times the gradient: 12TV),
  the forward holds the model's bf16 logits (2c(T+1)V) and one fp32 row temporary. The larger of the two.

Not counted: the CUDA context (~0.5-1 GB per process, outside `torch.cuda.max_memory_allocated`), the caching
allocator's fragmentation, and kernel workspaces; `GPU_ALLOWANCE` stands for them in the preflight (docs/gpu.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

GB = 1e9
FP32 = 4
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# What the CPU measurement leaves out and a GPU adds (allocator slack, kernel workspaces, the attention kernels'
# own saved tensors): the two GPU peaks of the Qwen3-1.7B update (H200, 4 x (512 + 1,024) tokens: 41.5 GB without
# gradient checkpointing, 14.7 GB with) are 4.9 GB and 5.1 GB above this model's 36.6 GB and 9.6 GB.
GPU_ALLOWANCE = 5.5 * GB


@dataclass(frozen=True)
class ModelShape:
    """A Llama/Qwen-style decoder: what the memory terms depend on."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = True

    @classmethod
    def from_hf_config(cls, cfg: Any) -> ModelShape:
        heads = cfg.num_attention_heads
        return cls(
            layers=cfg.num_hidden_layers,
            hidden=cfg.hidden_size,
            intermediate=cfg.intermediate_size,
            heads=heads,
            kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
            vocab=cfg.vocab_size,
            tied=bool(getattr(cfg, "tie_word_embeddings", False)),
        )

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each projection of one decoder layer."""
        h, i, q, kv = self.hidden, self.intermediate, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def parameters(self) -> int:
        per_layer = sum(a * b for a, b in self.linear_shapes().values()) + 2 * self.hidden + 2 * self.head_dim
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * per_layer + embeddings + self.hidden


# Published shapes of the students the recipes name (their config.json), for a preflight without the hub.
KNOWN_SHAPES = {
    "Qwen/Qwen3-0.6B": ModelShape(28, 1024, 3072, 16, 8, 128, 151936),
    "Qwen/Qwen3-1.7B": ModelShape(28, 2048, 6144, 16, 8, 128, 151936),
    "Qwen/Qwen3-4B": ModelShape(36, 2560, 9728, 32, 8, 128, 151936),
}


def student_shape(name: str, cache_dir: str = "") -> ModelShape | None:
    """The decoder shape of model `name`: the recipes' students from `KNOWN_SHAPES`, any other from its config.json
    (a folder's, or the hub's); None when that cannot be read."""
    if name in KNOWN_SHAPES:
        return KNOWN_SHAPES[name]
    try:
        from transformers import AutoConfig

        from utils.student_model import resolve_model_path

        return ModelShape.from_hf_config(AutoConfig.from_pretrained(resolve_model_path(name, cache_dir)))
    except Exception:  # noqa: BLE001 - no shape means no estimate, never a failed run
        return None


def lora_targets(target_modules: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The projections an adapter covers ('all-linear' is all seven)."""
    if list(target_modules) == ["all-linear"]:
        return LORA_TARGETS
    return tuple(t for t in LORA_TARGETS if t in target_modules)


def lora_parameters(shape: ModelShape, r: int, targets: tuple[str, ...]) -> int:
    return shape.layers * sum(r * (a + b) for name, (a, b) in shape.linear_shapes().items() if name in targets)


def kept_per_token_layer(
    shape: ModelShape, r: int, targets: tuple[str, ...], dtype: int = 2, seq_len: int = 0, dropout_mask: int = 0
) -> int:
    """Bytes autograd keeps per token for one decoder layer (frozen base in `dtype` bytes, fp32 LoRA, SDPA).

    `seq_len` adds the attention mask the SDPA backward keeps per layer (dtype bytes x L per token).
    `dropout_mask`: LoRA dropout on (the SFT passes; RL passes disable it) keeps, per element of each adapted
    input, its mask: 1 byte on CUDA (`native_dropout`'s bool mask), 4 on CPU (an fp32 noise tensor); 0: off.
    """
    h, i = shape.hidden, shape.intermediate
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    shapes = shape.linear_shapes()
    total = 2 * (FP32 * h + FP32)  # the two RMSNorms: fp32 input and 1/rms
    total += FP32 * (q + kv) + FP32 * (shape.heads + shape.kv_heads)  # q_norm, k_norm (fp32 per head)
    total += dtype * 4 * q + FP32 * shape.heads  # SDPA: rotated q, k and v repeated to all heads, output, lse
    total += dtype * 3 * i  # gate and up outputs, silu(gate)
    total += dtype * seq_len
    cast = dtype != FP32  # peft casts each adapted input to fp32: one copy per module (in fp32: one per group)
    groups: list[tuple[str, ...]] = [
        ("q_proj", "k_proj", "v_proj"),
        ("o_proj",),
        ("gate_proj", "up_proj"),
        ("down_proj",),
    ]
    for group in groups:
        adapted = [name for name in group if name in targets]
        copies = len(adapted) if cast else min(len(adapted), 1)
        width = shapes[group[0]][0]
        total += copies * width * (FP32 + dropout_mask) + len(adapted) * FP32 * r
    return total


def per_token_extras(shape: ModelShape, dtype: int = 2, seq_len: int = 0) -> int:
    """Bytes kept once per token outside the layers: rotary cos and sin, the shared attention mask."""
    return 2 * dtype * shape.head_dim + dtype * seq_len


@dataclass(frozen=True)
class PassPeak:
    """One pass's peak, by term (bytes); `total` is their sum."""

    static: float
    activations: float
    head: float

    @property
    def total(self) -> float:
        return self.static + self.activations + self.head


def static_bytes(shape: ModelShape, r: int, targets: tuple[str, ...], dtype: int = 2) -> float:
    """Frozen base weights plus LoRA weight, gradient, Adam m and v (fp32 each)."""
    return shape.parameters() * dtype + lora_parameters(shape, r, targets) * 4 * FP32


def head_bytes(
    rows: int, scored: int, vocab: int, dtype: int = 2, grad: bool = True, logits_alive: bool = False
) -> float:
    """The log-prob head over `scored` positions of `rows` sequences (selective_log_softmax, one row at a time).

    `logits_alive`: the model's logits stay referenced through the backward (the SFT pass holds its output)."""
    tv = scored * vocab
    logits = dtype * rows * (scored + 1) * vocab
    if not grad:  # bf16 logits, one fp32 row and logsumexp's temporary
        return logits + 2 * FP32 * tv
    forward = logits + FP32 * rows * tv + FP32 * tv
    backward = FP32 * rows * tv + 3 * FP32 * tv + (logits if logits_alive else 0)
    return max(forward, backward)


def policy_pass(
    shape: ModelShape,
    r: int,
    targets: tuple[str, ...],
    rows: int,
    prompt: int,
    completion: int,
    checkpointing: bool,
    dtype: int = 2,
    dropout_mask: int = 0,
    sft: bool = False,
) -> PassPeak:
    """Peak of one forward + backward over `rows` sequences of prompt + completion tokens, with log-probs of
    the completion (GRPO), or with `sft` of every position but the first (the SFT pass, whose logits stay
    alive through its backward; give it prompt 0 and the whole sequence as the completion)."""
    length = prompt + completion
    tokens = rows * length
    layer = kept_per_token_layer(shape, r, targets, dtype, length, dropout_mask)
    extras = tokens * per_token_extras(shape, dtype, length)
    if checkpointing:  # every layer's input, plus one layer recomputed (and its gradients) in the backward
        kept = tokens * shape.layers * dtype * shape.hidden + extras
        recompute = 2 * tokens * layer
    else:
        kept = tokens * shape.layers * layer + extras
        recompute = 0
    head = head_bytes(rows, length - 1 if sft else completion, shape.vocab, dtype, logits_alive=sft)
    return PassPeak(static_bytes(shape, r, targets, dtype), kept, max(head, recompute))


def no_grad_pass(shape: ModelShape, rows: int, prompt: int, completion: int, dtype: int = 2) -> float:
    """A forward without gradients (the reference, or a local teacher): the head's logits and temporaries
    plus one layer's transient activations (bounded by the MLP's three I-wide tensors)."""
    tokens = rows * (prompt + completion)
    return head_bytes(rows, completion, shape.vocab, dtype, grad=False) + tokens * dtype * (
        3 * shape.intermediate + 2 * shape.hidden
    )


def generate_bytes(shape: ModelShape, sequences: int, length: int, dtype: int = 2) -> float:
    """KV cache of `sequences` x `length` tokens plus one step's fp32 logits (hf `generate`)."""
    kv = sequences * length * shape.layers * 2 * shape.kv_heads * shape.head_dim * dtype
    return kv + sequences * shape.vocab * FP32 * 2


@dataclass(frozen=True)
class Estimate:
    """Phase 3's predicted peak on one GPU, by phase (bytes), and the term that sets it."""

    parts: dict[str, float]

    @property
    def peak(self) -> float:
        return max(self.parts.values())

    @property
    def largest(self) -> str:
        return max(self.parts, key=lambda k: self.parts[k])


def hf_prompts_per_call(
    config: Any, shape: ModelShape, prompt_tokens: int = 512, update_parts: dict[str, float] | None = None
) -> int:
    """Prompts per hf `generate` call in phase 3: the whole rollout batch (per_device_train_batch_size x
    gradient_accumulation_steps prompts, G sequences each), or as many as keep sampling (weights + KV cache of
    prompt_tokens + the budget + one step's logits) within the update's predicted peak, so sampling never sets the
    run's peak; at least one prompt. Decoding is bound by kernel launches at these sizes, so one call of 64 sequences
    takes about as long per step as one of 8."""
    t, g = config.training, config.grpo
    dtype = 4 if config.student.torch_dtype == "float32" else 2
    completion = config.multi_turn.max_total_tokens if config.multi_turn.mode != "single" else g.max_new_tokens
    if update_parts is None:
        update_parts = {k: v for k, v in estimate(config, shape, prompt_tokens).parts.items() if "rollout" not in k}
    limit = max(update_parts.values())
    static = static_bytes(shape, config.lora.r, lora_targets(config.lora.target_modules), dtype)
    prompts = t.per_device_train_batch_size * t.gradient_accumulation_steps
    while (
        prompts > 1
        and static + generate_bytes(shape, prompts * g.num_samples_per_prompt, prompt_tokens + completion, dtype)
        > limit
    ):
        prompts -= 1
    return prompts


def hf_prompts_for_run(config: Any, tokenizer: Any, tasks: Sequence[Any]) -> int | None:
    """`hf_prompts_per_call` for phase 3's tasks (their longest templated prompt; hf pads a call to it); None when
    the student's shape cannot be read (the sampler then keeps one micro-batch per call)."""
    from rollouts.from_config import prompt_lengths

    shape = student_shape(config.student.model_name, config.paths.model_cache_dir)
    if shape is None:
        return None
    lengths = prompt_lengths(
        tokenizer, tasks, config.prompt.num_visible_tests, config.student.chat_template_kwargs, config.multi_turn.mode
    )
    return hf_prompts_per_call(config, shape, max(lengths) if lengths else 512)


def estimate(config: Any, shape: ModelShape, prompt_tokens: int = 512, teacher: ModelShape | None = None) -> Estimate:
    """Phase 3's peaks under `config` for a student of `shape`, prompts of `prompt_tokens` (bytes, no allowance).

    Parts: the GRPO pass (one `forward_chunk_size` chunk), the teacher-SFT pass (`sft_max_length` tokens), the
    reference pass (kl_coef > 0), the rollout (hf: `generate` over one rollout batch; vllm: the engine's
    share is added to every part unless it sleeps), and a local OPD teacher's weights and forward.
    """
    t, g, ds = config.training, config.grpo, config.dual_source
    dtype = 4 if config.student.torch_dtype == "float32" else 2
    targets = lora_targets(config.lora.target_modules)
    r = config.lora.r
    sequences = t.per_device_train_batch_size * g.num_samples_per_prompt
    rows = min(t.forward_chunk_size or sequences, sequences)
    completion = config.multi_turn.max_total_tokens if config.multi_turn.mode != "single" else g.max_new_tokens
    static = static_bytes(shape, r, targets, dtype)
    ckpt = t.gradient_checkpointing
    parts = {"grpo update": policy_pass(shape, r, targets, rows, prompt_tokens, completion, ckpt, dtype).total}
    if ds.teacher_sft_weight > 0 and ds.teacher_sft_batch_size > 0:
        sft_rows = min(t.forward_chunk_size or ds.teacher_sft_batch_size, ds.teacher_sft_batch_size)
        mask = 1 if config.lora.lora_dropout > 0 else 0  # CUDA's bool dropout mask
        sft = policy_pass(shape, r, targets, sft_rows, 0, ds.sft_max_length, ckpt, dtype, mask, sft=True)
        parts["teacher-SFT update"] = sft.total
    if g.kl_coef > 0:
        parts["reference forward"] = static + no_grad_pass(shape, rows, prompt_tokens, completion, dtype)
    if config.rollout_backend == "hf":
        prompts = hf_prompts_per_call(config, shape, prompt_tokens, parts)
        parts["rollout (hf generate)"] = static + generate_bytes(
            shape, prompts * g.num_samples_per_prompt, prompt_tokens + completion, dtype
        )
    if ds.opd_weight > 0 and config.teacher.logprob_source == "local" and teacher is not None:
        teacher_static = teacher.parameters() * dtype
        parts = {k: v + teacher_static for k, v in parts.items()}
        parts["local teacher forward"] = (
            static + teacher_static + no_grad_pass(teacher, rows, prompt_tokens, completion, dtype)
        )
    return Estimate(parts)


def required_bytes(config: Any, est: Estimate, total_memory: float) -> float:
    """What the GPU must hold: the estimate plus `GPU_ALLOWANCE`, plus the colocated vLLM engine's share of
    `total_memory` when it stays awake through the update."""
    need = est.peak + GPU_ALLOWANCE
    if config.rollout_backend == "vllm" and not config.grpo.vllm_sleep_mode:
        need += config.grpo.vllm_gpu_memory_utilization * total_memory
    return need
