"""Run by tests/e2e/test_trainer_ddp.py under `accelerate launch --multi_gpu --num_processes 2` (gloo on CPU):
the trainer with the `vllm_server` sampler against the test's fake server (argv: OUT_DIR SERVER_URL), in one
process group, run after run:

`sync`: 4 synchronous steps. `async`: 2 steps with `grpo.async_rollouts` (max_staleness 1), then `resumed`:
the same output folder resumed to step 4. `curriculum`: 2 async steps with the difficulty filter (every rank's
checkpoint must hold the main process's curriculum). `crash`: the main process's sampler fails on its second
request (every rank must raise the same error). `interrupt`: Ctrl-C on the main process while it takes its second
batch (every rank must end, none may wait for it). Each rank writes rank{N}.pt: per run the task ids it trained on
per batch, its adapter, the errors raised, and the threads left."""

import sys
import threading
from pathlib import Path

import torch

from rollouts.from_config import build_sampler
from tests.trainer_helpers import lora_state, small_tasks, tiny_config, tiny_lora_student
from training.grpo_trainer import GRPOTrainer
from training.metric_sinks import make_accelerator
from training.setup import build_pool, build_run

RUN = {
    "grpo.rollout_backend": "vllm_server",
    "training.save_steps": 0,
    "sandbox.max_workers": 1,
    "dual_source.teacher_sft_weight": 0.0,
    "grpo.max_new_tokens": 256,
    "training.ddp_timeout": 120,  # a rank left waiting for a peer fails the test within minutes, not half an hour
    "grpo.max_logp_abs_diff": 0,  # the fake server's log-probs are made up (-0.5 a token): ~6 nats from the model's
}
ASYNC = {"grpo.async_rollouts": "true", "grpo.max_staleness": 1}


def run(out: Path, url: str, accelerator, pool, overrides: dict, *, resume: bool = False, break_main=None) -> dict:
    """One training run on this rank; what it trained on, its adapter, its error and the threads left after it."""
    config = tiny_config(out, **{"grpo.vllm_server_url": url, **RUN, **overrides})
    model, tokenizer = tiny_lora_student(config, adapter_seed=0)  # identical adapter on every rank
    tasks = small_tasks(16)  # more tasks than two rollout batches of both ranks: no epoch wrap in 4 steps
    rollout = build_sampler(config, purpose="train", tokenizer=tokenizer, output_dir=out, accelerator=accelerator)
    parts = build_run(
        config,
        tasks=tasks,
        teacher_examples=[],
        output_dir=out,
        model=model,
        tokenizer=tokenizer,
        accelerator=accelerator,
        rollout=rollout,
        pool=pool,
    )
    trainer = GRPOTrainer(parts)
    trained: list[list[str]] = []
    real_train = trainer.train_on_rollouts

    def train_on_rollouts(groups, metrics):
        trained.append([group[0].task.task_id for group in groups])
        return real_train(groups, metrics)

    trainer.train_on_rollouts = train_on_rollouts  # type: ignore[method-assign]
    if break_main is not None and accelerator.is_main_process:
        break_main(trainer, rollout)
    error = None
    try:
        trainer.train(resume_from="latest" if resume else None)
    except BaseException as raised:  # noqa: BLE001 - the test compares what each rank raised
        error = f"{type(raised).__name__}: {raised}"
    finally:  # as phase 3 does: the server backend unloads its last adapter and closes its connections
        rollout.close()
    return {
        "trained": trained,
        "lora": lora_state(accelerator.unwrap_model(trainer.model)),
        "error": error,
        "threads": sorted(t.name for t in threading.enumerate() if t is not threading.main_thread()),
        "rollout_batches": trainer.state.rollout_batches,
    }


def fail_second_request(trainer, rollout) -> None:
    real_post, calls = rollout.post_completions, []

    def post_completions(bodies, parse):
        calls.append(1)
        if len(calls) == 2:
            raise ConnectionError("the rollout server went away")
        return real_post(bodies, parse)

    rollout.post_completions = post_completions


def interrupt_second_take(trainer, rollout) -> None:
    """Ctrl-C reaches the main process while its training thread waits for the producer's second batch."""
    source = trainer.rollouts
    real_start = source.start

    def start(policy, state):
        real_start(policy, state)
        producer = source.producer
        real_take, takes = producer.take, []

        def take(step):
            takes.append(1)
            if len(takes) == 2:
                raise KeyboardInterrupt
            return real_take(step)

        producer.take = take

    source.start = start


def main(out_dir: str, url: str) -> None:
    out = Path(out_dir)
    config = tiny_config(out, **RUN)
    accelerator = make_accelerator(config, out, cpu=True)
    pool = build_pool(config, accelerator)
    found = {}
    try:
        found["sync"] = run(out / "sync", url, accelerator, pool, {"training.max_steps": 4})
        found["async"] = run(out / "async", url, accelerator, pool, {**ASYNC, "training.max_steps": 2})
        found["resumed"] = run(out / "async", url, accelerator, pool, {**ASYNC, "training.max_steps": 4}, resume=True)
        curriculum = {"curriculum.enabled": "true", "curriculum.window": 64, "curriculum.min_samples": 64}
        found["curriculum"] = run(
            out / "curriculum", url, accelerator, pool, {**ASYNC, **curriculum, "training.max_steps": 2}
        )
        found["crash"] = run(
            out / "crash", url, accelerator, pool, {**ASYNC, "training.max_steps": 3}, break_main=fail_second_request
        )
        found["interrupt"] = run(
            out / "interrupt",
            url,
            accelerator,
            pool,
            {**ASYNC, "training.max_steps": 3},
            break_main=interrupt_second_take,
        )
    finally:
        pool.close()
    found["world"] = accelerator.num_processes
    torch.save(found, out / f"rank{accelerator.process_index}.pt")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
