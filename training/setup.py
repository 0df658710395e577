"""Phase 3's composition root: the parts of a training run, each made by one named builder, in one place.

`build_run` takes the config apart and calls the builders in the order a run needs them: the accelerator, the
teacher-SFT set, the on-policy-distillation teacher, the sandbox pool, the episodes on it, the metric sinks, the
user reward functions, the curriculum, teacher guidance and the rollout source. `GRPOTrainer(parts)` receives the
`RunParts` and builds only what is its own (optimizer, schedule, passes, state).
The rollout source is chosen here, once: synchronous, asynchronous (`grpo.async_rollouts`), or none when no term
of the objective reads rollouts. Phase 3 loads the student (`build_student`) and its sampler
before calling `build_run`; a test passes a fake for any part by keyword, or swaps one afterwards with
`dataclasses.replace`.

The pool is closed by whoever made it: `RunParts.owns_pool` is true only for a pool `build_run` made, and the
trainer closes such a pool when its run ends. A pool passed in is the caller's to close.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from config import Config, DualSourceConfig, GRPOConfig, TrainingConfig
from rollouts.from_config import budget_name, episodes_for, prompt_lengths, sample_budget
from rollouts.groups import Episodes
from rollouts.protocol import AdapterPublisher, Sampler
from sandbox.executor import SandboxPool, task_secret_paths
from training import curriculum, guidance, sft_sources, teacher_logprobs
from training.batching import autocast_forward, cpu_features, resolve_autocast
from training.checkpointing import RunFiles
from training.completion_log import CompletionLog
from training.curriculum import Curriculum
from training.guidance import Guide
from training.launch import Peers, local_world_size, sandbox_workers
from training.metric_sinks import MetricSinks, make_accelerator
from training.rewards import RewardProgress, UserReward, load_reward_functions
from training.rollout_batches import BatchMaker
from training.rollout_sources import AsyncRollouts, RolloutSource, SyncRollouts
from training.sft_sources import max_scheduled_weight
from training.teacher_logprobs import ServedTeacherScorer, TeacherScorer
from utils.dataset_loader import Task

if TYPE_CHECKING:  # the record only: phase 3 reads the trace file through synthesis.generate_traces
    from synthesis.generate_traces import TeacherTrace


@dataclass(frozen=True, kw_only=True)
class RunParts:
    """Everything a `GRPOTrainer` runs with, made by `build_run`: its collaborators and the three config sections
    the loop reads."""

    accelerator: Any  # an accelerate.Accelerator (or a stand-in with its attributes)
    model: Any  # the student with its LoRA adapter, not yet `prepare`d
    tokenizer: Any
    tasks: list[Task]
    teacher_sft: list[dict]  # the usable teacher traces that fit dual_source.sft_max_length, tokenized once
    teacher_sft_stats: dict[str, float]  # the share dropped as too long, and of kept targets over the rollout budget
    output_dir: Path
    rollout: Sampler | None  # None: the run samples nothing (a run without rollout terms, or a test)
    pool: SandboxPool
    owns_pool: bool  # made by build_run: the trainer closes it when the run ends
    teacher_scorer: TeacherScorer | None  # on-policy distillation's teacher; None when dual_source.opd_weight is 0
    episodes: Episodes | None  # how a multi-turn sample goes on; None in single-turn mode
    sinks: MetricSinks
    user_rewards: list[UserReward]
    curriculum: Curriculum | None  # None when curriculum.enabled is off
    rollouts: RolloutSource | None  # where the loop's batches come from; None when no term reads rollouts
    files: RunFiles  # config.json, the checkpoints and the final model (each carries the whole config)
    grpo: GRPOConfig
    training: TrainingConfig
    dual_source: DualSourceConfig
    guide: Guide | None = None  # teacher-guided rollouts, the batch maker's reviser; None when guidance.enabled is off
    completion_log: CompletionLog | None = None  # completions.jsonl; None when training.log_completions is off


def build_run(
    config: Config,
    *,
    tasks: list[Task],
    teacher_examples: list[TeacherTrace],
    output_dir: str | Path,
    model: Any,
    tokenizer: Any,
    accelerator: Any = None,
    rollout: Sampler | None = None,
    pool: SandboxPool | None = None,
    teacher_scorer: TeacherScorer | None = None,
    teacher_traces: str | Path = "the teacher traces",
) -> RunParts:
    """The parts of a phase 3 run. `accelerator`, `pool` and `teacher_scorer` are built from the config when
    not given; `model`, `tokenizer` and `rollout` are phase 3's (`build_student`, `rollouts.from_config`).
    `teacher_traces` names where `teacher_examples` came from (guidance's messages say it)."""
    output_dir = Path(output_dir)
    accelerator = accelerator if accelerator is not None else build_accelerator(config, output_dir)
    teacher_sft, teacher_sft_stats = build_teacher_sft(config, teacher_examples, tokenizer, accelerator)
    if teacher_scorer is None:
        teacher_scorer = build_teacher_scorer(config, tokenizer, accelerator)
    check_teacher_context(config, teacher_scorer, tokenizer, tasks)
    owns_pool = pool is None
    pool = pool if pool is not None else build_pool(config, accelerator)
    progress = RewardProgress(max_steps=config.training.max_steps)  # reward functions' trainer_state
    episodes = build_episodes(config, pool)
    user_rewards = build_user_rewards(config, progress)
    difficulty = build_curriculum(config, tasks)
    guide = build_guidance(config, teacher_examples, tokenizer, tasks, accelerator, str(teacher_traces))
    maker = build_batch_maker(config, accelerator, rollout, tasks, pool, episodes, user_rewards, difficulty, guide)
    return RunParts(
        accelerator=accelerator,
        model=model,
        tokenizer=tokenizer,
        tasks=tasks,
        teacher_sft=teacher_sft,
        teacher_sft_stats=teacher_sft_stats,
        output_dir=output_dir,
        rollout=rollout,
        pool=pool,
        owns_pool=owns_pool,
        teacher_scorer=teacher_scorer,
        episodes=episodes,
        sinks=build_sinks(config, output_dir, accelerator, progress),
        user_rewards=user_rewards,
        curriculum=difficulty,
        rollouts=build_rollouts(config, maker),
        files=RunFiles(output_dir, config),
        grpo=config.grpo,
        training=config.training,
        dual_source=config.dual_source,
        guide=guide,
        completion_log=build_completion_log(config, output_dir, accelerator, tokenizer),
    )


# ---------------------------------------------------------------- the builders, in the order build_run calls them


def build_accelerator(config: Config, output_dir: Path) -> Any:
    """The run's Accelerator. A float32 student without CUDA runs on the CPU (not on Apple's MPS)."""
    return make_accelerator(config, output_dir, cpu=config.student.torch_dtype == "float32" and not _has_cuda())


def build_student(config: Config, accelerator: Any) -> tuple[Any, Any]:
    """(model, tokenizer): the student on the accelerator's device with a fresh LoRA adapter from `config.lora`."""
    from utils.student_model import attach_lora, load_student

    student, lora = config.student, config.lora
    model, tokenizer = load_student(
        student.model_name,
        student.torch_dtype,
        student.load_in_8bit,
        config.paths.model_cache_dir,
        device=accelerator.device,
    )
    model = attach_lora(model, lora.r, lora.lora_alpha, lora.lora_dropout, lora.target_modules)
    autocast = student_autocast(config, accelerator)
    if config.training.autocast == "auto" and accelerator.is_main_process:
        print(f"training.autocast=auto: {autocast} on this {accelerator.device.type.upper()}", flush=True)
    if autocast != "off":
        autocast_forward(model, autocast)
    return model, tokenizer


def student_autocast(config: Config, accelerator: Any) -> str:
    """training.autocast made concrete for the accelerator's device (`auto`: bfloat16 on a CPU with hardware
    bfloat16, else off)."""
    return resolve_autocast(config.training.autocast, accelerator.device.type, cpu_features())


def build_teacher_sft(
    config: Config, teacher_examples: list[TeacherTrace], tokenizer: Any, accelerator: Any
) -> tuple[list[dict], dict[str, float]]:
    """The tokenized teacher-SFT set and its statistics; says on the main process how many traces are too long."""
    examples, stats = sft_sources.build_teacher_sft(
        teacher_examples,
        tokenizer,
        config.dual_source,
        chat_template_kwargs=config.student.chat_template_kwargs,
        rollout_budget=config.grpo.max_new_tokens,
    )
    if accelerator.is_main_process and stats["teacher_sft/dropped_too_long"] > 0:
        print(
            f"teacher-SFT: {len(teacher_examples) - len(examples)} of {len(teacher_examples)} traces do "
            f"not fit dual_source.sft_max_length={config.dual_source.sft_max_length} and are left out (never cut)",
            flush=True,
        )
    return examples, stats


def build_teacher_scorer(config: Config, tokenizer: Any, accelerator: Any) -> TeacherScorer | None:
    """On-policy distillation's teacher (`training.teacher_logprobs`), or None when dual_source.opd_weight is 0."""
    if config.dual_source.opd_weight <= 0:
        return None
    training = config.training
    return teacher_logprobs.build_teacher_scorer(
        config.teacher,
        tokenizer,
        student_name=config.student.model_name,
        cache_dir=config.paths.model_cache_dir,
        torch_dtype=config.student.torch_dtype,
        device=accelerator.device,
        chunk_size=training.forward_chunk_size,
        shared_prompt=training.shared_prompt_forward,
        temperature=config.grpo.temperature,
        autocast=student_autocast(config, accelerator),
    )


def check_teacher_context(config: Config, scorer: TeacherScorer | None, tokenizer: Any, tasks: list[Task]) -> None:
    """A served teacher must hold the longest prompt plus the sample budget: checked before any step."""
    if not isinstance(scorer, ServedTeacherScorer) or not tasks:
        return
    lengths = prompt_lengths(
        tokenizer, tasks, config.prompt.num_visible_tests, config.student.chat_template_kwargs, config.multi_turn.mode
    )
    scorer.check_context(max(lengths), sample_budget(config), budget_name(config))


def build_pool(config: Config, accelerator: Any) -> SandboxPool:
    """The sandbox pool, hiding the run's task files; each process on this machine takes its share of the cores
    (`training.launch.sandbox_workers`). With asynchronous rollouts under several processes the main process's
    producer scores every process's rollouts: it takes the machine's cores (or sandbox.max_workers), and the
    other processes, which score nothing, one worker each."""
    grpo = config.grpo
    one_scorer = grpo.async_rollouts and grpo.max_staleness > 0 and accelerator.num_processes > 1
    if one_scorer and not accelerator.is_main_process:
        workers = 1
    else:
        workers = sandbox_workers(config.sandbox.max_workers, 1 if one_scorer else local_world_size(accelerator))
    return SandboxPool.from_config(config.sandbox, workers=workers, secret_paths=task_secret_paths(config))


def build_episodes(config: Config, pool: SandboxPool) -> Episodes | None:
    """How a multi-turn sample goes on, on `pool`; None in single-turn mode."""
    return episodes_for(config, pool)


def build_sinks(
    config: Config, output_dir: Path, accelerator: Any, progress: RewardProgress | None = None
) -> MetricSinks:
    """metrics.jsonl and the configured trackers (opened when the run starts); each row also moves `progress`
    (the reward functions' trainer_state) to its step."""
    return MetricSinks(config, output_dir, accelerator, progress)


def build_completion_log(config: Config, output_dir: Path, accelerator: Any, tokenizer: Any) -> CompletionLog | None:
    """This process's completions.jsonl (opened when the run starts); None when training.log_completions is off."""
    if not config.training.log_completions:
        return None
    return CompletionLog(
        output_dir, accelerator.process_index, lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True)
    )


def build_user_rewards(config: Config, progress: RewardProgress | None = None) -> list[UserReward]:
    """grpo.reward_funcs loaded and weighted by grpo.reward_weights; `progress` is what they get as trainer_state
    (the sinks keep it current)."""
    return load_reward_functions(config.grpo.reward_funcs, config.grpo.reward_weights, progress)


def build_curriculum(config: Config, tasks: list[Task]) -> Curriculum | None:
    """The difficulty filter over `tasks`; None when curriculum.enabled is off."""
    return curriculum.build_curriculum(
        config.curriculum, config.grpo.num_samples_per_prompt, [t.task_id for t in tasks], config.training.seed
    )


def build_guidance(
    config: Config,
    teacher_examples: list[TeacherTrace],
    tokenizer: Any,
    tasks: list[Task],
    accelerator: Any,
    source: str,
) -> Guide | None:
    """Teacher-guided rollouts over the passed traces of `tasks` (None when guidance.enabled is off); the main
    process says in one line which tasks cannot be guided."""
    return guidance.build_guide(
        config.guidance,
        teacher_examples,
        tokenizer,
        task_ids=[t.task_id for t in tasks],
        include_thinking=config.dual_source.include_thinking,
        budget=config.grpo.max_new_tokens,
        source=source,
        say=lambda line: print(line, flush=True) if accelerator.is_main_process else None,
    )


def build_batch_maker(
    config: Config,
    accelerator: Any,
    rollout: Sampler | None,
    tasks: list[Task],
    pool: SandboxPool,
    episodes: Episodes | None,
    user_rewards: list[UserReward],
    difficulty: Curriculum | None,
    guide: Guide | None = None,
) -> BatchMaker:
    """How the run's rollout batches are made (`training.rollout_batches`), from the parts built before it;
    teacher guidance is its revision step."""
    training = config.training
    return BatchMaker(
        sampler=rollout,
        tasks=tasks,
        pool=pool,
        episodes=episodes,
        curriculum=difficulty,
        user_rewards=user_rewards,
        reviser=guide,
        peers=Peers(accelerator),
        prompts_per_rank=training.per_device_train_batch_size * training.gradient_accumulation_steps,
        seed=training.seed,
        **scoring_sections(config),
    )


def scoring_sections(config: Config) -> dict[str, Any]:
    """The sections `training.scoring.score_rollouts` reads, by keyword."""
    return {"grpo": config.grpo, "sandbox": config.sandbox, "prompt": config.prompt, "multi_turn": config.multi_turn}


def build_rollouts(config: Config, maker: BatchMaker) -> RolloutSource | None:
    """The run's rollout source: None when no term trains on rollouts and the curriculum is off (a term that is off
    costs nothing), asynchronous with `grpo.async_rollouts` and max_staleness > 0 (its sampler must load published
    adapters), synchronous otherwise."""
    grpo, dual = config.grpo, config.dual_source
    reads_rollouts = dual.grpo_weight > 0 or grpo.kl_coef > 0 or dual.opd_weight > 0
    if not (reads_rollouts or max_scheduled_weight(dual, "self_sft") > 0 or maker.curriculum is not None):
        return None
    if not (grpo.async_rollouts and grpo.max_staleness > 0):
        return SyncRollouts(maker)
    if not isinstance(maker.sampler, AdapterPublisher):
        raise ValueError(
            f"grpo.async_rollouts needs a sampler that loads published adapters (vllm_server); "
            f"{type(maker.sampler).__name__} does not"
        )
    return AsyncRollouts(
        maker=maker, publisher=maker.sampler, max_staleness=grpo.max_staleness, steps_per_batch=grpo.num_iterations
    )


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
