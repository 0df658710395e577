"""On-policy distillation through the trainer: the teacher scores each rollout, the OPD term
trains on policy tokens only, beside GRPO, and weight 0 leaves training as it was."""

from __future__ import annotations

import json

import pytest
import torch

from clients.openai_compat import TeacherClient
from tests.fake_openai_server import FakeVLLMServer, RunningServer
from tests.integration.training.test_action_mask import ScriptedToolRollout
from tests.trainer_helpers import ScriptedRollout, scripted_trainer
from training.batching import completion_logprobs, pad_rollout_batch
from training.teacher_logprobs import ServedTeacherScorer, TeacherScores

OPD_ONLY = {
    "dual_source.opd_weight": 1.0,
    "dual_source.grpo_weight": 0.0,
    "dual_source.teacher_sft_weight": 0.0,
    "dual_source.self_sft_weight": 0.0,
    "grpo.kl_coef": 0.0,
}


class ShiftedStudent:
    """A teacher whose log-prob of each policy token is the current policy's plus `shift`, and `environment` at
    inserted (action mask 0) positions: the OPD advantage is exactly `shift` on every token it trains on."""

    def __init__(self, shift: float, environment: float) -> None:
        self.shift, self.environment = shift, environment
        self.trainer = None

    def score(self, samples):
        out = []
        for s in samples:
            with torch.no_grad():
                logp = completion_logprobs(self.trainer.model, pad_rollout_batch([s], 0))[0]
            mask = s.action_mask or (1,) * len(s.token_ids)
            out.append(tuple(float(v) + self.shift if m else self.environment for v, m in zip(logp, mask, strict=True)))
        return TeacherScores(out, 0.25, sum(len(s.token_ids) for s in samples))

    def close(self):
        pass


def make_trainer(tmp_path, pool, scorer, rollout_class=ScriptedToolRollout, **overrides):
    trainer = scripted_trainer(tmp_path / "out", pool, rollout_class, teacher_scorer=scorer, **overrides)
    scorer.trainer = trainer
    return trainer


def gradient_of_one_step(trainer, groups, rollout_metrics):
    captured = {}

    def record(*args, **kwargs):
        captured.update({n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})

    trainer.optimizer.step = record
    return captured, trainer.train_on_rollouts(groups, dict(rollout_metrics))[0]


@pytest.mark.slow
def test_the_opd_term_by_hand_on_multi_turn_rollouts_trains_on_policy_tokens_only(tmp_path, pool):
    """Tool-mode completions (environment tokens inside): with a teacher 0.5 nats above the policy on every
    policy token, the first step's OPD loss is -0.5 (token-mean of -a_t at ratio 1) and opd/kl is -0.5; what the
    teacher says at environment positions changes nothing, not one bit of the gradient."""
    trainer = make_trainer(tmp_path / "a", pool, ShiftedStudent(0.5, environment=-9999.0), **OPD_ONLY)
    groups, rollout_metrics = trainer.collect_rollouts()
    grads, metrics = gradient_of_one_step(trainer, groups, rollout_metrics)
    assert metrics["loss/opd"] == pytest.approx(-0.5, abs=1e-4)
    assert metrics["opd/kl"] == pytest.approx(-0.5, abs=1e-4)
    assert metrics["weight/opd"] == 1.0 and metrics["opd/teacher_s"] == 0.25
    assert metrics["opd/teacher_tokens"] == sum(s.completion.num_tokens for g in groups for s in g)
    assert metrics["loss/total"] == pytest.approx(-0.5, abs=1e-4)  # GRPO's weight is 0 here
    assert grads and any(float(g.abs().sum()) > 0 for g in grads.values())

    other = make_trainer(tmp_path / "b", pool, ShiftedStudent(0.5, environment=3.0), **OPD_ONLY)
    other_grads, _ = gradient_of_one_step(other, groups, rollout_metrics)
    assert other_grads.keys() == grads.keys()
    for name, grad in grads.items():
        assert torch.equal(grad, other_grads[name]), name


@pytest.mark.slow
def test_opd_beside_grpo_adds_its_gradient(tmp_path, pool):
    """GRPO + OPD: the step's gradient is GRPO's plus OPD's (one forward, one normalizer)."""
    # the bound against GRPO off: the unbounded terms add up (the bound is tested in tests/test_losses.py)
    weights = {
        "dual_source.teacher_sft_weight": 0.0,
        "dual_source.self_sft_weight": 0.0,
        "grpo.kl_coef": 0.0,
        "dual_source.opd_max_ratio": 0.0,
    }
    runs = {}
    for name, opd, grpo in (("both", 0.5, 1.0), ("grpo", 0.0, 1.0), ("opd", 0.5, 0.0)):
        trainer = make_trainer(
            tmp_path / name,
            pool,
            ShiftedStudent(-0.3, environment=0.0),
            rollout_class=ScriptedRollout,
            **weights,
            **{"dual_source.opd_weight": opd, "dual_source.grpo_weight": grpo},
        )
        torch.manual_seed(1)  # the same scripted samples for every run
        groups, rollout_metrics = trainer.collect_rollouts()
        runs[name] = gradient_of_one_step(trainer, groups, rollout_metrics)
    both, grpo_only, opd_only = (runs[n][0] for n in ("both", "grpo", "opd"))
    for name in both:
        torch.testing.assert_close(both[name], grpo_only[name] + opd_only[name], atol=1e-6, rtol=1e-5)
    assert "loss/opd" not in runs["grpo"][1] and "weight/opd" not in runs["grpo"][1]
    assert runs["both"][1]["loss/total"] == pytest.approx(
        runs["grpo"][1]["loss/grpo"] + 0.5 * runs["both"][1]["loss/opd"], abs=1e-5
    )


@pytest.mark.slow
def test_weight_zero_never_asks_the_teacher(tmp_path, pool):
    class Refuses:
        def score(self, samples):
            raise AssertionError("the teacher was asked although dual_source.opd_weight is 0")

        def close(self):
            pass

    trainer = make_trainer(tmp_path, pool, Refuses(), rollout_class=ScriptedRollout)
    metrics = trainer.train_on_rollouts(*trainer.collect_rollouts())[0]
    assert not any(k.startswith("opd/") or k.endswith("/opd") for k in metrics)


def test_groups_without_reward_spread_still_learn_from_the_teacher(tmp_path, pool):
    """Every sample fails (zero-spread groups): dynamic filtering would drop them all, but with OPD on they
    carry the teacher's per-token signal and are kept."""
    trainer = make_trainer(
        tmp_path,
        pool,
        ShiftedStudent(0.2, environment=0.0),
        ScriptedRollout,
        **OPD_ONLY,
        **{"grpo.dynamic_filtering": True},
    )
    trainer.parts.rollout.always_wrong = True
    grads, metrics = gradient_of_one_step(trainer, *trainer.collect_rollouts())
    assert metrics["frac_reward_zero_std"] == 1.0
    assert metrics["loss/opd"] == pytest.approx(-0.2, abs=1e-4)
    assert any(float(g.abs().sum()) > 0 for g in grads.values())


def test_a_served_teacher_scores_the_trainers_rollouts(tmp_path, pool):
    """The whole path through HTTP: the fake vLLM server answers prompt log-probs for prompt + completion."""
    state = FakeVLLMServer(base_model="teacher", prompt_logprob=lambda prefix, token: -1.0)
    with RunningServer(state) as server:
        scorer = ServedTeacherScorer(TeacherClient(server.url, model="teacher"), "teacher")
        trainer = make_trainer(tmp_path, pool, scorer, **OPD_ONLY)
        groups, rollout_metrics = trainer.collect_rollouts()
        metrics = trainer.train_on_rollouts(groups, rollout_metrics)[0]
        trainer.teacher_scorer.close()
    samples = [s.completion for g in groups for s in g]
    assert sorted(call[2]["prompt"] for call in state.calls) == sorted([*s.prompt_ids, *s.token_ids] for s in samples)
    assert metrics["opd/teacher_tokens"] == sum(len(s.token_ids) for s in samples) and "loss/opd" in metrics


def test_a_served_teacher_too_short_for_the_samples_is_refused_before_training(tmp_path, pool):
    """A teacher started with a small --max-model-len would answer the first long sample with a 400, steps into the
    run; the trainer reads the limit from /v1/models and refuses at start, naming the value to restart it with."""
    from training.teacher_logprobs import TeacherScoringError

    state = FakeVLLMServer(base_model="teacher", prompt_logprob=lambda prefix, token: -1.0, max_model_len=64)
    with RunningServer(state) as server:
        scorer = ServedTeacherScorer(TeacherClient(server.url, model="teacher"), "teacher")
        with pytest.raises(TeacherScoringError, match=r"holds 64 tokens per sequence .*--max-model-len \d+ or more"):
            make_trainer(tmp_path, pool, scorer, **OPD_ONLY)
    assert state.calls == []  # refused before any scoring request


def test_phase3_trains_with_a_local_teacher_from_the_config(tmp_path):
    """phase 3 end to end (hf rollouts on the tiny model), the teacher built from teacher.logprob_source=local."""
    import phase1_prepare_data as phase1
    import phase3_train_grpo as phase3
    from config import build_config

    phase1.main(build_config("cpu", overrides=[f"paths.data_dir={tmp_path / 'data'}"]))
    config = build_config(
        "cpu",
        overrides=[
            f"paths.data_dir={tmp_path / 'data'}",
            f"paths.output_dir={tmp_path / 'out'}",
            "student.model_name=embedded:tiny-random",
            "teacher.model_name=embedded:tiny-random",
            "teacher.logprob_source=local",
            "grpo.rollout_backend=hf",
            "grpo.max_new_tokens=8",
            "training.max_steps=1",
            "dual_source.teacher_sft_weight=0",
            "dual_source.opd_weight=0.5",
            "dual_source.opd_advantage_clip=5",
        ],
    )
    phase3.main(config, teacher_traces=tmp_path / "none.jsonl")
    row = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["weight/opd"] == 0.5 and row["opd/teacher_s"] > 0 and row["opd/teacher_tokens"] > 0
    # the teacher is the untrained student at step 1: the reverse KL is 0 up to float noise
    assert row["opd/kl"] == pytest.approx(0.0, abs=1e-4)


def test_phase3_refuses_a_missing_adapter_and_a_mismatched_teacher_in_one_line(tmp_path, monkeypatch, capsys):
    import phase1_prepare_data as phase1
    import phase3_train_grpo as phase3
    import training.setup as setup_module
    from config import build_config
    from training.teacher_logprobs import TokenizerMismatchError

    phase1.main(build_config("cpu", overrides=[f"paths.data_dir={tmp_path / 'data'}"]))
    argv = [
        "--preset",
        "cpu",
        "--train_file",
        str(tmp_path / "data" / "train.jsonl"),
        "--output_dir",
        str(tmp_path / "out"),
        "--max_steps",
        "1",
        *("--set", "student.model_name=embedded:tiny-random", "--set", "dual_source.teacher_sft_weight=0"),
        *("--set", "dual_source.opd_weight=1", "--set", "teacher.logprob_source=local"),
    ]
    assert phase3.cli([*argv, "--set", f"teacher.local_adapter={tmp_path / 'nothing'}"]) == 1
    assert "is not a LoRA adapter folder" in capsys.readouterr().err

    def mismatched(*args, **kwargs):
        raise TokenizerMismatchError("on-policy distillation needs the teacher to read the student's token ids")

    monkeypatch.setattr(setup_module, "build_teacher_scorer", mismatched)
    assert phase3.cli(argv) == 1
    assert "error: on-policy distillation needs the teacher" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("url", "free_gb", "refused"),
    [
        ("http://localhost:8129/v1", 6.4, True),  # vllm serve's default 0.92 of an 80 GB GPU already taken
        ("http://localhost:8129/v1", 79.0, False),  # the teacher on another GPU: this one is free
        ("http://teacher-box:8129/v1", 6.4, False),  # another machine: this GPU's use is someone else's
    ],
)
def test_phase3_refuses_a_local_teacher_on_the_trainers_gpu(monkeypatch, url, free_gb, refused):
    import phase3_train_grpo as phase3
    from config import build_config

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (int(free_gb * 1e9), int(80e9)))
    config = build_config("gpu", overrides=["dual_source.opd_weight=1", f"teacher.api_url={url}"])
    if refused:
        with pytest.raises(phase3.RunSetupError, match=r"6\.4 GB free of 80\.0 GB .*CUDA_VISIBLE_DEVICES=1 vllm serve"):
            phase3.check_teacher_gpu(config, torch.device("cuda", 0))
    else:
        phase3.check_teacher_gpu(config, torch.device("cuda", 0))
    phase3.check_teacher_gpu(config, torch.device("cpu"))  # no GPU, nothing to share


@pytest.mark.parametrize("autocast", ["off", "bfloat16"])
def test_opd_advantage_is_zero_when_the_teacher_is_the_student_at_the_rollout_temperature(tmp_path, autocast):
    """The student's log-probs are taken at grpo.temperature (and under training.autocast); a teacher identical to
    the student must be scored at the same temperature and precision, or OPD pays for the temperature or the
    rounding alone."""
    import phase1_prepare_data as phase1
    import phase3_train_grpo as phase3
    from config import build_config

    phase1.main(build_config("cpu", overrides=[f"paths.data_dir={tmp_path / 'data'}"]))
    config = build_config(
        "cpu",
        overrides=[
            f"paths.data_dir={tmp_path / 'data'}",
            f"paths.output_dir={tmp_path / 'out'}",
            "student.model_name=embedded:tiny-random",
            "teacher.model_name=embedded:tiny-random",
            "teacher.logprob_source=local",
            "grpo.rollout_backend=hf",
            "grpo.temperature=0.7",
            "grpo.max_new_tokens=8",
            "training.max_steps=1",
            "dual_source.teacher_sft_weight=0",
            "dual_source.opd_weight=0.5",
            f"training.autocast={autocast}",
        ],
    )
    phase3.main(config, teacher_traces=tmp_path / "none.jsonl")
    row = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["opd/kl"] == pytest.approx(0.0, abs=1e-4)
    assert row["opd/advantage_p01"] == pytest.approx(0.0, abs=1e-4)
    assert row["opd/advantage_p99"] == pytest.approx(0.0, abs=1e-4)
