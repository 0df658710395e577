"""Asynchronous vs synchronous GRPO on the server path, with the real vLLM engine (its CPU build).

    python -m benchmarks.bench_async_grpo [--steps 6] [--seeds 0] [--staleness 0,1] [--server_core 0] [--trainer_core 1]

A `vllm serve` (`.venv-vllm`, float32, LoRA with runtime updates, as `make test-vllm` starts it) serves the embedded
student pinned to one core (`taskset -c`); this process, pinned to another core (and one torch thread), runs
phase 3 (`phase3_train_grpo.main`) with `grpo.rollout_backend=vllm_server` for `--steps` steps, once per seed and
`grpo.max_staleness` (0: the synchronous loop; >0: `grpo.async_rollouts`). The sandbox's program processes inherit
the trainer's core.

Per run: the wall time per step (between the first and the last step's metrics row, so model loading and the
first step, which cannot overlap anything, are left out), rollouts per hour (completions per step / that time),
the training pass rate of every step and its mean (learning parity: the same steps and prompts, several seeds),
the mean and largest staleness, and the machine's load (`uptime`) before and after. The speed-up is each async
run's rollouts per hour over the synchronous run's of the same seed. Learning parity is the paired difference over
seeds of the mean training pass rate (async - synchronous, per `max_staleness`) with its t interval
(`evaluation.seed_contrasts.paired_t`). Within a seed the order of the modes alternates (the synchronous run first
on even seeds), so a load that drifts during the benchmark does not always favour one mode.

Each run is written to `--output` as it ends and a run already there (same seed, `max_staleness` and steps) is not
redone, so an interrupted benchmark resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RUN = (  # the cpu preset's student with the test-vllm tier's tiny rollout budget
    "grpo.max_new_tokens=96",
    "grpo.num_samples_per_prompt=4",
    "training.per_device_train_batch_size=2",
    "training.gradient_accumulation_steps=1",
    "training.save_steps=0",
    "dual_source.teacher_sft_weight=0",
)


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip().split("load average:")[-1].strip()


def start_server(core: int, port: int, log_path: Path) -> subprocess.Popen:
    from utils.student_model import resolve_model_path

    python = ROOT / ".venv-vllm" / "bin" / "python"
    command = ["taskset", "-c", str(core), str(python), "-m", "vllm.entrypoints.openai.api_server"]
    command += ["--model", resolve_model_path("embedded:SmolLM2-135M-Instruct"), "--served-model-name", "smollm2"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "2048"]
    command += ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2", "--logprobs-mode", "processed_logprobs"]
    env = {
        **os.environ,
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_CPU_OMP_THREADS_BIND": str(core),
        "HF_HUB_OFFLINE": "1",
    }
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    started = time.monotonic()
    while True:
        if server.poll() is not None or time.monotonic() - started > 600:
            server.kill()
            raise SystemExit(f"the vLLM server did not start; see {log_path}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                return server
        except OSError:
            time.sleep(1)


def train(url: str, data_dir: Path, output: Path, seed: int, staleness: int, steps: int) -> dict:
    """One phase 3 run in this process; the metrics rows' write times give the per-step wall time."""
    import phase3_train_grpo
    from config import build_config
    from training.metric_sinks import MetricSinks

    sets = [*RUN, f"paths.data_dir={data_dir}", f"paths.output_dir={output}", f"training.seed={seed}"]
    sets += [f"training.max_steps={steps}", "grpo.rollout_backend=vllm_server", f"grpo.vllm_server_url={url}"]
    if staleness > 0:
        sets += ["grpo.async_rollouts=true", f"grpo.max_staleness={staleness}"]
    config = build_config("cpu", overrides=sets)
    stamps: list[float] = []
    original = MetricSinks.write

    def stamped(self, metrics):
        stamps.append(time.monotonic())
        return original(self, metrics)

    MetricSinks.write = stamped  # type: ignore[method-assign]
    before = load()
    try:
        phase3_train_grpo.main(config, overwrite_output_dir=True)
    finally:
        MetricSinks.write = original  # type: ignore[method-assign]
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    per_step = (stamps[-1] - stamps[0]) / max(len(stamps) - 1, 1)
    completions = 2 * 4  # prompts x samples per step (RUN)
    return {
        "seed": seed,
        "max_staleness": staleness,
        "steps": len(rows),
        "wall_s_per_step": per_step,
        "rollouts_per_hour": completions * 3600 / per_step,
        "pass_rates": [r["pass_rate"] for r in rows],
        "pass_rate_mean": sum(r["pass_rate"] for r in rows) / len(rows),
        "staleness_mean": sum(r.get("async/staleness_mean", 0.0) for r in rows) / len(rows),
        "staleness_max": max((r.get("async/staleness_max", 0.0) for r in rows), default=0.0),
        "trainer_wait_s_mean": sum(r.get("async/trainer_wait_s", 0.0) for r in rows) / len(rows),
        "load_before": before,
        "load_after": load(),
    }


def run_order(seed: int, staleness: list[int]) -> list[int]:
    """The modes of one seed in the order they run: as given on even seeds, reversed on odd ones."""
    return list(staleness) if seed % 2 == 0 else list(reversed(staleness))


def synchronous_run(runs: list[dict], seed: int) -> dict | None:
    """The synchronous run (`max_staleness` 0) of a seed, if it is among the runs."""
    return next((r for r in runs if r["seed"] == seed and r["max_staleness"] == 0), None)


def parity(runs: list[dict]) -> dict[str, dict]:
    """Per `max_staleness` > 0: the per-seed difference of mean training pass rate (async - synchronous, the
    same seed and steps) and its paired t interval over the seeds that have both runs."""
    from evaluation.seed_contrasts import paired_t

    summary: dict[str, dict] = {}
    for staleness in sorted({r["max_staleness"] for r in runs if r["max_staleness"] > 0}):
        differences = {}
        for run in runs:
            if run["max_staleness"] != staleness:
                continue
            sync = synchronous_run(runs, run["seed"])
            if sync is not None and sync["steps"] == run["steps"]:
                differences[run["seed"]] = run["pass_rate_mean"] - sync["pass_rate_mean"]
        if differences:
            seeds = sorted(differences)
            summary[str(staleness)] = {"seeds": seeds, **paired_t([differences[s] for s in seeds])}
    return summary


def write_results(path: Path, runs: list[dict], steps: int) -> None:
    for run in runs:
        sync = synchronous_run(runs, run["seed"])
        run["speedup_vs_sync"] = run["rollouts_per_hour"] / sync["rollouts_per_hour"] if sync else None
    document = {"runs": runs, "recipe": list(RUN), "steps": steps, "parity": parity(runs)}
    path.write_text(json.dumps(document, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_async_grpo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seeds", default="0", help="comma-separated training seeds")
    parser.add_argument("--staleness", default="0,1", help="comma-separated max_staleness values (0: synchronous)")
    parser.add_argument("--server_core", type=int, default=0)
    parser.add_argument("--trainer_core", type=int, default=1)
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "async_grpo.json"))
    args = parser.parse_args(argv)
    output = Path(args.output)
    previous = json.loads(output.read_text()) if output.exists() else {}
    results = [r for r in previous.get("runs", []) if "pass_rates" in r]  # runs from before per-step rates: redone
    planned = [
        (seed, staleness)
        for seed in [int(s) for s in args.seeds.split(",")]
        for staleness in run_order(seed, [int(s) for s in args.staleness.split(",")])
        if not any(r["seed"] == seed and r["max_staleness"] == staleness and r["steps"] == args.steps for r in results)
    ]
    if not planned:
        write_results(output, results, args.steps)
        print(json.dumps(parity(results), indent=2))
        return 0
    os.sched_setaffinity(0, {args.trainer_core})
    import torch

    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="bench_async_"))
    data_dir = work / "data"
    subprocess.run(
        [sys.executable, "phase1_prepare_data.py", "--preset", "cpu", "--set", f"paths.data_dir={data_dir}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    with socket.socket() as probe:  # a port nothing else holds
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    server = start_server(args.server_core, port, work / "server.log")
    try:
        for seed, staleness in planned:
            run = train(
                f"http://127.0.0.1:{port}/v1", data_dir, work / f"s{seed}-k{staleness}", seed, staleness, args.steps
            )
            results = [r for r in results if not (r["seed"] == seed and r["max_staleness"] == staleness)] + [run]
            write_results(output, results, args.steps)
            print(json.dumps(run), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)
    for run in results:
        speedup = run["speedup_vs_sync"]
        print(
            f"seed {run['seed']} max_staleness {run['max_staleness']}: {run['wall_s_per_step']:.1f} s/step, "
            f"{run['rollouts_per_hour']:.0f} rollouts/h ({'-' if speedup is None else f'{speedup:.2f}x'}), "
            f"pass rate {run['pass_rate_mean']:.3f}, load {run['load_before']} -> {run['load_after']}"
        )
    print(json.dumps(parity(results), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
