"""The preflight itself must be able to fail: run it for real, then break a check and see it fail."""

import dataclasses
import re

import pytest

import test_all
from config import build_config
from tests.cli_helpers import cpu_argv, run_script


def test_fast_preflight_passes_and_prints_the_summary(capsys):
    code = test_all.cli(["--preset", "cpu", "--skip_model", "--teacher_url", "http://127.0.0.1:9/v1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "✓ PASS" in out and "✗ FAIL" not in out
    assert "⚠ WARN no teacher answering at http://127.0.0.1:9/v1" in out
    assert "Preflight summary:" in out and "failed:   0" in out


def test_a_broken_extractor_makes_the_preflight_fail(monkeypatch, capsys):
    real = test_all.extract_thinking_and_code_unified

    def wrong(response, reasoning=None):  # grades code drafted inside the thinking
        return dataclasses.replace(real(response, reasoning), code="wrong", has_thinking=True, thinking="")

    monkeypatch.setattr(test_all, "extract_thinking_and_code_unified", wrong)
    code = test_all.cli(["--preset", "cpu", "--skip_model", "--teacher_url", "http://127.0.0.1:9/v1"])
    out = capsys.readouterr().out
    assert code == 1
    assert "✗ FAIL" in out and "hint:" in out and "Some checks failed" in out


@pytest.mark.parametrize("module", ["synthesis.generate_traces", "evaluation.evaluate"])
def test_a_phase_with_a_parser_of_its_own_makes_the_preflight_fail(module, monkeypatch, capsys):
    import importlib

    from utils.thinking_extraction import extract_thinking_and_code_unified as one_parser

    # a phase's own rule: the first python block, thinking or not
    def own_parser(response, reasoning=None, **selection):
        first_block = response.split("```python\n", 1)[1].split("```", 1)[0]
        # the record shape, but the one parser never saw `response`
        return one_parser(f"```python\n{first_block}```", **selection)

    monkeypatch.setattr(importlib.import_module(module), "extract_thinking_and_code_unified", own_parser)
    report = test_all.Report()
    test_all.check_one_parser(report, build_config("cpu"))
    phase = "phase 2" if module.startswith("synthesis") else "phase 4"
    assert report.count("FAIL") == 1 and report.count("PASS") == 1
    assert f"✗ FAIL {phase}" in capsys.readouterr().out


def test_a_leaking_label_mask_makes_the_preflight_fail(monkeypatch, smollm2_tokenizer, capsys):
    import training.sft_sources as sft
    from config import build_config

    real = sft.build_sft_example

    def leaky(prompt_ids, response_ids, max_length, response_mask=None):
        example = real(prompt_ids, response_ids, max_length, response_mask)
        example["labels"] = list(example["input_ids"])  # the classic bug: labels = input_ids
        return example

    config = build_config("cpu")
    report = test_all.Report()
    test_all.check_sft_labels(report, config, smollm2_tokenizer)  # through training's own path: it passes
    assert report.count("FAIL") == 0 and report.count("PASS") == 2, capsys.readouterr().out
    monkeypatch.setattr(sft, "build_sft_example", leaky)
    report = test_all.Report()
    test_all.check_sft_labels(report, config, smollm2_tokenizer)
    assert report.count("FAIL") == 1
    assert "data leak" in capsys.readouterr().out


def test_bad_config_exits_2_with_the_key_named():
    proc = run_script("test_all.py", "--set", "grpo.kl_cof=1")
    assert proc.returncode == 2 and "grpo.kl_coef" in proc.stderr


@pytest.mark.slow
def test_full_preflight_on_the_embedded_student():
    proc = run_script("test_all.py", *cpu_argv("--teacher_url", "http://127.0.0.1:9/v1"), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "✓ PASS model loaded" in proc.stdout
    assert "with the kv sampler" in proc.stdout  # the cpu preset's rollout and evaluation sampler
    assert "✓ PASS labels: prompt and padding masked" in proc.stdout


def test_preflight_checks_a_running_teacher_through_the_client(capsys):
    from tests.fake_openai_server import FakeTeacher, RunningServer

    with RunningServer(FakeTeacher(shape="reasoning", default_code="def add(a, b):\n    return a + b")) as server:
        code = test_all.cli(
            ["--preset", "cpu", "--skip_model", "--teacher_url", server.url, "--set", "teacher.model_name=fake-teacher"]
        )
        assert server.state.requests and server.state.requests[0]["chat_template_kwargs"] == {"enable_thinking": True}
    out = capsys.readouterr().out
    assert code == 0
    assert "✓ PASS teacher answered in" in out and "✓ PASS teacher returned thinking" in out
    with RunningServer(FakeTeacher()) as server:  # serves another model: a FAIL with the served list
        assert test_all.cli(["--preset", "cpu", "--skip_model", "--teacher_url", server.url]) == 1
    assert "It serves: fake-teacher" in capsys.readouterr().out


def test_multi_turn_checks_pass_and_a_leaking_action_mask_fails(monkeypatch, smollm2_tokenizer, capsys):
    import rollouts.episodes as loop
    from config import build_config

    config = build_config("cpu")
    report = test_all.Report()
    test_all.check_multi_turn(report, config, smollm2_tokenizer)
    assert report.count("FAIL") == 0 and report.count("PASS") >= 4, capsys.readouterr().out
    real = loop.Episode.append
    # the classic bug: environment tokens marked as the policy's, so training would learn the results
    monkeypatch.setattr(
        loop.Episode, "append", lambda self, ids, policy, logprobs=None: real(self, ids, True, logprobs)
    )
    report = test_all.Report()
    test_all.check_multi_turn(report, config, smollm2_tokenizer)
    assert report.count("FAIL") >= 1
    assert "action mask covers exactly the policy's tokens" in capsys.readouterr().out


def test_the_opd_teacher_check_passes_on_prompt_logprobs_and_fails_without_them(smollm2_tokenizer, capsys):
    from config import build_config
    from tests.fake_openai_server import FakeTeacher, FakeVLLMServer, RunningServer

    config = build_config(
        "cpu",
        overrides=[
            "dual_source.opd_weight=1",
            "teacher.model_name=teacher",
            "teacher.tokenizer=embedded:SmolLM2-135M-Instruct",
        ],
    )
    report = test_all.Report()
    with RunningServer(FakeVLLMServer(base_model="teacher")) as server:
        test_all.check_teacher_logprobs(report, config, smollm2_tokenizer, server.url)
    assert report.count("FAIL") == 0 and "✓ PASS teacher scored" in capsys.readouterr().out
    report = test_all.Report()
    with RunningServer(FakeTeacher(model="teacher")) as server:  # `transformers serve`: no prompt log-probs
        test_all.check_teacher_logprobs(report, config, smollm2_tokenizer, server.url)
    out = capsys.readouterr().out
    assert report.count("FAIL") == 1 and "does not answer prompt log-probs" in out and "logprob_source=local" in out


def test_quiet_preflight_prints_the_config_summary_problems_and_totals_only(tmp_path, capsys):
    log = tmp_path / "preflight.log"
    args = ["--preset", "cpu", "--skip_model", "--teacher_url", "http://127.0.0.1:9/v1", "--quiet", str(log)]
    assert test_all.cli(args) == 0
    out = capsys.readouterr().out
    assert "✓ PASS" not in out and "== " not in out
    assert "⚠ WARN" in out  # the teacher at port 9 does not answer
    assert "Preflight summary:" in out
    assert len(out.splitlines()) < 25, out
    full = log.read_text()
    assert "✓ PASS" in full and "Preflight summary:" in full


def test_the_teacher_check_can_be_left_out_or_run_alone(capsys):
    # make run checks its own teacher once it has started it: before that, a WARN would only mislead
    url = ["--teacher_url", "http://127.0.0.1:9/v1"]
    assert test_all.cli(["--preset", "cpu", "--skip_model", *url, "--teacher", "skip"]) == 0
    out = capsys.readouterr().out
    assert "Teacher endpoint" not in out and "⚠ WARN" not in out and "✓ PASS" in out
    assert test_all.cli(["--preset", "cpu", "--skip_model", *url, "--teacher", "only"]) == 0
    out = capsys.readouterr().out
    assert "⚠ WARN no teacher answering at http://127.0.0.1:9/v1" in out
    assert "✓ PASS" not in out and "total:    1" in out  # nothing else ran


def test_the_sft_target_follows_the_students_closed_think_rate():
    from utils.sft_data import sft_target_choice, thinking_targets_configured

    # a student that never closes <think> must not get thinking targets; one that always does keeps them
    assert sft_target_choice(0, 8, thinking_configured=True)[0] is False
    assert "dual_source.include_thinking=false" in sft_target_choice(0, 8, thinking_configured=True)[1]
    assert sft_target_choice(0, 8, thinking_configured=False) == (True, sft_target_choice(0, 8, False)[1])
    assert "code-only targets" in sft_target_choice(0, 8, thinking_configured=False)[1]
    assert sft_target_choice(8, 8, thinking_configured=True)[0] is True
    assert sft_target_choice(7, 8, thinking_configured=True)[0] is False  # 88% < the 90% threshold
    assert sft_target_choice(8, 8, thinking_configured=False)[0] is False
    # the reference teacher's traces carry thinking unless reference_thinking is none; include_thinking=false wins
    assert thinking_targets_configured(True, "references", "short") is True
    assert thinking_targets_configured(True, "references", "none") is False
    assert thinking_targets_configured(True, "server", "none") is True
    assert thinking_targets_configured(False, "server", "short") is False


def test_the_preflight_measures_the_students_closed_think_rate_and_names_the_target(tiny_model_name, capsys):
    from config import build_config
    from utils.student_model import load_student

    model, tokenizer = load_student(tiny_model_name, "float32", False, "", device="cpu")
    overrides = [f"student.model_name={tiny_model_name}", "grpo.max_new_tokens=8"]
    for extra, status in (
        (["dual_source.include_thinking=true", "teacher.reference_thinking=short"], "WARN"),
        ([], "PASS"),
    ):
        report = test_all.Report()
        test_all.check_target_format(report, build_config("cpu", overrides=overrides + extra), model, tokenizer, 2, 1)
        # the random tiny model never closes <think>: thinking targets warn, the cpu preset's code-only targets pass
        assert [r[0] for r in report.results] == [status]
    out = capsys.readouterr().out
    assert "closes <think> in 0 of 2 samples" in out and "code-only targets" in out


@pytest.mark.parametrize("backend", ["kv", "hf"])
def test_the_preflight_samples_the_student_with_the_runs_own_sampler(backend, tiny_model_name, monkeypatch, capsys):
    import rollouts.hf
    import rollouts.kv_sampler

    calls = {"hf": 0, "kv": 0}
    for module, name, which in (
        (rollouts.hf, "generate_completions", "hf"),
        (rollouts.kv_sampler, "sample_token_ids", "kv"),
    ):
        real = getattr(module, name)

        def counted(*args, _real=real, _which=which, **kwargs):
            calls[_which] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    overrides = [
        f"student.model_name={tiny_model_name}",
        "grpo.max_new_tokens=8",
        f"grpo.rollout_backend={backend}",
        "evaluation.backend=rollout",
    ]
    config = build_config("cpu", overrides=overrides)
    report = test_all.Report()
    loaded = test_all.check_student(report, config, max_new_tokens=8)
    assert loaded is not None and report.count("FAIL") == 0, capsys.readouterr().out
    test_all.check_target_format(report, config, *loaded, 2, 1)
    # the smoke test (phase 4's sampler, greedy) and the closed-think rate (phase 3's rollouts) sample as the run does
    assert calls == {"hf": 0, "kv": 2} if backend == "kv" else calls == {"hf": 2, "kv": 0}
    name = "the kv sampler" if backend == "kv" else "transformers generate"
    assert re.search(rf"student generated \d+ tokens with {name} ", capsys.readouterr().out)


def test_a_student_the_kv_sampler_refuses_fails_the_preflight_and_still_generates(gelu_model_dir, capsys):
    config = build_config("cpu", overrides=[f"student.model_name={gelu_model_dir}", "grpo.max_new_tokens=4"])
    report = test_all.Report()
    loaded = test_all.check_student(report, config, max_new_tokens=4)
    out = capsys.readouterr().out
    # phases 3 and 4 would refuse it: the preflight says so first, and its smoke test falls back to generate
    assert loaded is not None and report.count("FAIL") == 1, out
    assert "✗ FAIL the configured kv sampler cannot run this student" in out
    assert "evaluation.backend=hf" in out and "tokens with transformers generate" in out


@pytest.mark.parametrize("quiet", [True, False])
def test_ctrl_c_during_the_teacher_check_is_one_line_and_exit_130(tmp_path, monkeypatch, capsys, quiet):
    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt  # what the terminal's SIGINT raises inside the probe

    monkeypatch.setattr(test_all, "check_teacher_endpoint", ctrl_c)
    argv = cpu_argv("--teacher", "only", "--teacher_url", "http://127.0.0.1:9/v1")
    assert test_all.cli([*argv, *(["--quiet", str(tmp_path / "log")] if quiet else [])]) == 130
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == ["interrupted: the teacher check stopped; nothing was changed, rerun to check again."], err


def test_quiet_preflight_prints_one_timed_line_per_check_section_as_it_finishes(tmp_path, capsys):
    log = tmp_path / "preflight.log"
    args = ["--preset", "cpu", "--skip_model", "--teacher", "skip", "--quiet", str(log)]
    assert test_all.cli(args) == 0
    out = capsys.readouterr().out
    sections = [line for line in log.read_text().splitlines() if line.startswith("== ")]
    finished = [line for line in out.splitlines() if line.startswith("✓ ") and line.rstrip().endswith(" s)")]
    assert len(finished) == len(sections) >= 4, out
    assert any(line.startswith("✓ Unified prompt: ") and " passed (" in line for line in finished), out
    assert out.index(finished[-1]) < out.index("Preflight summary:")


def test_preflight_log_starts_with_the_checks_not_every_config_key(tmp_path):
    log = tmp_path / "preflight.log"
    assert test_all.cli(["--preset", "cpu", "--skip_model", "--teacher", "skip", "--quiet", str(log)]) == 0
    lines = log.read_text().splitlines()
    first_check = next(i for i, line in enumerate(lines) if line.startswith(("✓ PASS", "⚠ WARN", "✗ FAIL")))
    assert first_check < 10, lines[:12]
    assert sum(" = " in line for line in lines[:first_check]) == 0  # no `key = value` dump before the checks


@pytest.mark.parametrize("thinking", [True, False])
def test_the_no_thinking_hint_fits_the_config_it_checks(capsys, thinking):
    from tests.fake_openai_server import FakeTeacher, RunningServer

    config = build_config("cpu", overrides=[f"teacher.enable_thinking={str(thinking).lower()}", "teacher.model_name=t"])
    report = test_all.Report()
    with RunningServer(FakeTeacher(model="t", shape="no_thinking")) as server:
        test_all.check_teacher_endpoint(report, config, server.url)
    out = capsys.readouterr().out
    [hint] = [line for line in out.splitlines() if "hint:" in line and "think" in line]
    if thinking:
        assert "already true" in hint and "set teacher.enable_thinking=true" not in hint
    else:
        assert "set teacher.enable_thinking=true" in hint
