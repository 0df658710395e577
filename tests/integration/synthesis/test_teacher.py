"""Phase 2: the teacher client against a real local HTTP server, and the trace pipeline end to end."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest

import phase1_prepare_data as phase1
import phase2_generate_teacher_traces as phase2
from clients.openai_compat import TeacherClient, TeacherFatalError
from config import build_config
from synthesis.generate_traces import TraceFileBusy, open_trace_file
from tests.canned_responses import SHAPES, TEACHER_THINKING
from tests.cli_helpers import cpu_argv, fake_teacher_argv, run_script, start_script
from tests.fake_openai_server import FakeTeacher, RunningServer, free_port
from utils.dataset_loader import read_tasks
from utils.prompts import build_chat_messages, get_unified_prompt
from utils.thinking_extraction import extract_thinking_and_code_unified

RECORD_KEYS = {
    "task_id",
    "sample_idx",
    "prompt",
    "thinking",
    "code",
    "response",
    "reasoning",
    "finish_reason",
    "usage",
    "syntax_ok",
    "passed",
    "pass_fraction",
    "tests_passed",
    "tests_total",
    "status",
    "error",
    "teacher_model",
    "timestamp",
    "latency",
    "previous_errors",
}


def ask(url: str, model: str = "fake-teacher", **kwargs):
    async def go():
        async with TeacherClient(url, model, backoff_base=0.01, **kwargs) as client:
            return await client.complete(build_chat_messages("Write add."))

    return asyncio.run(go())


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("data")
    phase1.main(build_config("cpu", overrides=[f"paths.data_dir={out}"]))
    return out / "train.jsonl"


def solving_teacher(tasks, **kwargs) -> FakeTeacher:
    """A fake teacher that answers each task with its reference solution."""
    return FakeTeacher(answers={t.problem.strip(): t.reference_solutions[0] for t in tasks}, **kwargs)


# ---------------------------------------------------------------- the client


@pytest.mark.parametrize("shape", SHAPES)
def test_every_response_shape_parses(shape):
    with RunningServer(FakeTeacher(shape=shape, default_code="def add(a, b):\n    return a + b")) as server:
        response = ask(server.url)
    assert response.ok and response.attempts == 1 and response.usage["completion_tokens"] == 20
    parsed = extract_thinking_and_code_unified(response.text, response.reasoning)
    if shape == "truncated":
        assert response.finish_reason == "length" and parsed.code is None and not parsed.think_closed
    else:
        assert parsed.code == "def add(a, b):\n    return a + b"
        assert parsed.has_thinking == (shape != "no_thinking")


def test_request_carries_the_sampling_parameters():
    with RunningServer(FakeTeacher()) as server:
        ask(
            server.url + "/chat/completions",
            temperature=0.7,
            top_p=0.8,
            presence_penalty=1.5,
            max_tokens=99,
            enable_thinking=False,
        )
        payload = server.state.requests[0]
    assert payload["model"] == "fake-teacher" and payload["max_tokens"] == 99
    assert (payload["temperature"], payload["top_p"], payload["presence_penalty"]) == (0.7, 0.8, 1.5)
    assert payload["chat_template_kwargs"] == {"enable_thinking": False}
    assert payload["messages"][0]["role"] == "system"


def test_tool_mode_requests_carry_only_fields_transformers_serve_accepts():
    from transformers.cli.serving.completion import TransformersTextCompletionCreateParams

    client = TeacherClient("http://127.0.0.1:1/v1", "m", presence_penalty=0.5)
    body = client.text_request("prompt", ["</program>"], 10)
    assert set(body) <= TransformersTextCompletionCreateParams.__mutable_keys__
    assert body["stop"] == ["</program>"] and body["max_tokens"] == 10 and "chat_template_kwargs" not in body


@pytest.mark.parametrize("stop_style", ["vllm", "transformers"])
def test_a_text_completion_ends_with_the_stop_string_it_stopped_on(stop_style):
    teacher = FakeTeacher(text_script=lambda prompt: "a <program>\nprint(1)\n</program> tail", stop_style=stop_style)
    with RunningServer(teacher) as server:
        client = TeacherClient(server.url, "fake-teacher", max_retries=0)
        response = asyncio.run(client.complete_text("p", ["</program>"], 50))
        cut = asyncio.run(TeacherClient(server.url, "fake-teacher").complete_text("p", ["</program>"], 1))
    assert response.ok and response.text == "a <program>\nprint(1)\n</program>"
    assert response.stop_string == ("</program>" if stop_style == "vllm" else None)
    assert cut.text == "a" and cut.finish_reason == "length" and cut.stop_string is None


@pytest.mark.parametrize("status", [500, 503, 429])
def test_transient_errors_are_retried(status):
    with RunningServer(FakeTeacher(fail_first=2, fail_status=status)) as server:
        response = ask(server.url, max_retries=3)
    assert response.ok and response.attempts == 3


def test_retries_run_out_and_other_4xx_are_not_retried():
    with RunningServer(FakeTeacher(fail_first=10, fail_status=500)) as server:
        exhausted = ask(server.url, max_retries=2)
        assert not exhausted.ok and exhausted.attempts == 3 and "HTTP 500" in exhausted.error
    with RunningServer(FakeTeacher(shape="error400")) as server:
        bad = ask(server.url, max_retries=5)
        assert not bad.ok and bad.attempts == 1 and "HTTP 400" in bad.error
        assert len(server.state.requests) == 1


def test_wrong_model_fails_at_once_listing_served_models():
    with RunningServer(FakeTeacher()) as server:
        start = time.monotonic()
        with pytest.raises(TeacherFatalError, match="It serves: fake-teacher"):
            ask(server.url, model="Qwen/Qwen3-32B-FP8", max_retries=5)
        assert time.monotonic() - start < 5 and len(server.state.requests) == 1


@pytest.mark.parametrize("shape", ["empty_choices", "no_message", "garbage"])
def test_malformed_answers_are_failed_samples_not_crashes(shape):
    with RunningServer(FakeTeacher(shape=shape)) as server:
        response = ask(server.url)
    assert not response.ok and "malformed" in response.error


def test_no_server_is_a_clear_error_within_10_seconds(train_file, tmp_path, capsys):
    start = time.monotonic()
    code = phase2.cli(
        [
            "--preset",
            "cpu",
            "--api_url",
            f"http://127.0.0.1:{free_port()}/v1",
            "--model",
            "x",
            "--input",
            str(train_file),
            "--output",
            str(tmp_path / "t.jsonl"),
        ]
    )
    assert code == 1 and time.monotonic() - start < 10
    err = capsys.readouterr().err
    assert "No teacher server answers at" in err and "make teacher" in err and "Traceback" not in err


# ---------------------------------------------------------------- trace generation


def run_phase2(train_file, out, url, *extra):
    return phase2.cli(fake_teacher_argv(url, train_file, out, *extra))


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_end_to_end_records_are_verified_and_a_rerun_adds_nothing(train_file, tmp_path, capsys):
    tasks = read_tasks(train_file)[:6]
    out = tmp_path / "traces.jsonl"
    with RunningServer(solving_teacher(tasks, shape="reasoning")) as server:
        assert run_phase2(train_file, out, server.url, "--max_tasks", "6", "--num_samples", "2") == 0
        records = read_records(out)
        assert len(records) == 12 and all(set(r) == RECORD_KEYS for r in records)
        assert {(r["task_id"], r["sample_idx"]) for r in records} == {(t.task_id, i) for t in tasks for i in range(2)}
        assert all(
            r["passed"] and r["syntax_ok"] and r["status"] == "passed" and r["pass_fraction"] == 1.0 for r in records
        )
        assert all(r["reasoning"] and r["thinking"] == TEACHER_THINKING for r in records)
        assert records[0]["prompt"] == get_unified_prompt(next(t for t in tasks if t.task_id == records[0]["task_id"]))
        stats = json.loads(out.with_suffix(".stats.json").read_text())
        assert stats["total"] == 12 and stats["passed_tests"] == 12 and stats["api_errors"] == 0
        assert json.loads(out.with_suffix(".config.json").read_text())["teacher"]["num_samples_per_problem"] == 2
        printed = capsys.readouterr().out
        assert "passed tests:" in printed and "with thinking:" in printed and "truncated (length):" in printed
        # rerun: nothing left to do, no request sent, nothing appended
        sent = len(server.state.requests)
        assert run_phase2(train_file, out, server.url, "--max_tasks", "6", "--num_samples", "2") == 0
        assert len(read_records(out)) == 12 and len(server.state.requests) == sent
        assert json.loads(out.with_suffix(".stats.json").read_text())["skipped_existing"] == 12
        # more samples later: only the new ones are generated
        assert run_phase2(train_file, out, server.url, "--max_tasks", "6", "--num_samples", "3") == 0
        assert len(read_records(out)) == 18 and len(server.state.requests) == sent + 6
        assert run_phase2(train_file, out, server.url, "--max_tasks", "2", "--num_samples", "1", "--overwrite") == 0
        assert len(read_records(out)) == 2


def test_stats_count_verified_traces_too_long_for_teacher_sft(train_file, tmp_path, capsys):
    # phase 3 leaves out (verified) traces whose prompt + target exceed dual_source.sft_max_length:
    # say so before training
    tasks = read_tasks(train_file)[:3]
    out = tmp_path / "traces.jsonl"
    with RunningServer(solving_teacher(tasks, shape="reasoning")) as server:
        assert run_phase2(train_file, out, server.url, "--max_tasks", "3", "--num_samples", "1") == 0
        fit = json.loads(out.with_suffix(".stats.json").read_text())["teacher_sft_fit"]
        assert fit == {"usable": 3, "too_long": 0, "sft_max_length": build_config("cpu").dual_source.sft_max_length}
        capsys.readouterr()
        more = "--max_tasks 3 --num_samples 1 --set dual_source.sft_max_length=64".split()
        assert run_phase2(train_file, out, server.url, *more) == 0
    fit = json.loads(out.with_suffix(".stats.json").read_text())["teacher_sft_fit"]
    assert fit == {"usable": 3, "too_long": 3, "sft_max_length": 64}  # the whole file counts, not only this run
    assert "3 of 3 usable traces in the file do not fit dual_source.sft_max_length=64" in capsys.readouterr().out


def test_wrong_code_truncation_and_api_errors_are_recorded(train_file, tmp_path):
    out = tmp_path / "traces.jsonl"
    with RunningServer(FakeTeacher(shape="truncated")) as server:
        assert run_phase2(train_file, out, server.url, "--max_tasks", "2", "--num_samples", "1") == 0
    truncated = read_records(out)
    assert all(r["finish_reason"] == "length" and r["code"] is None and r["status"] == "no_code" for r in truncated)
    out2 = tmp_path / "wrong.jsonl"
    with RunningServer(FakeTeacher(shape="no_thinking")) as server:  # answers `def solution(): ...` to everything
        assert run_phase2(train_file, out2, server.url, "--max_tasks", "2", "--num_samples", "1") == 0
    assert all(r["syntax_ok"] and not r["passed"] for r in read_records(out2))


def test_all_requests_failing_exits_nonzero_with_stats(train_file, tmp_path, capsys):
    out = tmp_path / "traces.jsonl"
    with RunningServer(FakeTeacher(shape="empty_choices")) as server:
        assert run_phase2(train_file, out, server.url, "--max_tasks", "3", "--num_samples", "1") == 1
    captured = capsys.readouterr()
    assert "API errors:" in captured.out and "every request failed" in captured.err
    assert all(r["status"] == "api_error" and "no choices" in r["error"] for r in read_records(out))


def test_test_connection(tmp_path, capsys):
    with RunningServer(FakeTeacher(shape="reasoning")) as server:
        assert (
            phase2.cli(["--preset", "cpu", "--api_url", server.url, "--model", "fake-teacher", "--test_connection"])
            == 0
        )
    out = capsys.readouterr().out
    assert "Served models: fake-teacher" in out and "thinking came back: True (separate reasoning field)" in out
    assert phase2.cli(["--preset", "cpu", "--api_url", f"http://127.0.0.1:{free_port()}/v1", "--test_connection"]) == 1


def test_test_connection_in_tool_mode_checks_the_text_endpoint_and_the_tokenizer(tmp_path, capsys):
    tool = ["--mode", "tool", "--set", "teacher.tokenizer=embedded:tiny-random", "--test_connection"]
    with RunningServer(FakeTeacher(shape="inline", text_script=lambda prompt: "<think>\nok")) as server:
        assert phase2.cli(cpu_argv("--api_url", server.url, "--model", "fake-teacher", *tool)) == 0
        assert "✓ tool mode: chat template rendered here, /completions answered" in capsys.readouterr().out
        missing = ["--set", f"teacher.tokenizer={tmp_path / 'none'}"]
        assert phase2.cli(cpu_argv("--api_url", server.url, "--model", "fake-teacher", *tool, *missing)) == 1
        assert "teacher.tokenizer" in capsys.readouterr().out
    with RunningServer(FakeTeacher(shape="inline")) as server:  # a server without /v1/completions for text
        assert phase2.cli(cpu_argv("--api_url", server.url, "--model", "fake-teacher", *tool)) == 1
        assert "✗ /completions" in capsys.readouterr().out


def test_two_runs_cannot_write_one_file(tmp_path):
    path = tmp_path / "t.jsonl"
    first, _ = open_trace_file(path, overwrite=False)
    try:
        with pytest.raises(TraceFileBusy, match="another phase 2 run"):
            open_trace_file(path, overwrite=False)
    finally:
        first.close()


def test_torn_last_line_is_repaired(tmp_path):
    path = tmp_path / "t.jsonl"
    good = json.dumps({"task_id": "a/1", "sample_idx": 0}) + "\n"
    path.write_text(good + '{"task_id": "a/1", "sample_')
    handle, done = open_trace_file(path, overwrite=False)
    handle.close()
    assert set(done) == {("a/1", 0)} and path.read_text() == good


@pytest.mark.slow
def test_resume_after_kill_loses_only_in_flight_and_never_duplicates(train_file, tmp_path):
    out = tmp_path / "traces.jsonl"
    tasks = read_tasks(train_file)[:8]
    with RunningServer(solving_teacher(tasks, delay=0.3)) as server:
        argv = fake_teacher_argv(server.url, train_file, out, "--max_tasks", "8", "--num_samples", "2")
        args = ["phase2_generate_teacher_traces.py", *argv, "--concurrency", "2"]
        proc = start_script(*args, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 4):
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        before = read_records(out)
        assert 4 <= len(before) < 16
        with out.open("a") as handle:  # as if the kill had landed in the middle of a write
            handle.write('{"task_id": "mbpp/9001", "sample_idx": 1, "prom')
        requests_before = len(server.state.requests)
        resumed = run_script(*args)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        after = read_records(out)
        keys = [(r["task_id"], r["sample_idx"]) for r in after]
        assert len(keys) == len(set(keys)) == 16  # everything, once
        assert after[: len(before)] == before  # finished records were kept as they were
        # only the missing samples were requested again (at most the 2 in flight were lost)
        assert len(server.state.requests) - requests_before == 16 - len(before)
        assert requests_before - len(before) <= 2


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["kv", "transformers"])
def test_phase2_against_the_real_local_teacher(train_file, tmp_path, engine):
    """The local teacher with the embedded model, started the way `make teacher` starts it: its kv engine (what
    `--engine auto` picks without vLLM) and its fallback, `transformers serve`."""
    port = free_port()
    server = start_script(
        "-m", "scripts.serve_local_teacher", "--port", str(port), "--engine", engine, start_new_session=True
    )
    try:
        import urllib.request

        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        out = tmp_path / "traces.jsonl"
        code = phase2.cli(
            [
                "--preset",
                "cpu",
                "--api_url",
                f"http://127.0.0.1:{port}/v1",
                "--input",
                str(train_file),
                "--output",
                str(out),
                "--max_tasks",
                "2",
                "--num_samples",
                "1",
                "--max_tokens",
                "48",
            ]
        )
        assert code == 0
        records = read_records(out)
        assert len(records) == 2 and all(set(r) == RECORD_KEYS for r in records)
        assert all(r["status"] != "api_error" and r["response"] for r in records)
        assert all(r["usage"]["completion_tokens"] <= 48 for r in records)
        # tool mode: the same server continues a text prompt through /v1/completions (its request validation
        # refuses any field it does not know, so this fails if the client sends one)
        tool_out = tmp_path / "tool_traces.jsonl"
        argv = ["--preset", "cpu", "--api_url", f"http://127.0.0.1:{port}/v1", "--input", str(train_file)]
        code = phase2.cli(
            [*argv, "--output", str(tool_out), "--max_tasks", "1", "--num_samples", "1", "--max_tokens", "48"]
            + ["--mode", "tool"]
        )
        assert code == 0
        [record] = read_records(tool_out)
        assert record["status"] != "api_error" and record["mode"] == "tool" and record["response"]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


# ---------------------------------------------------------------- failed requests, damaged files, fresh starts


def test_failed_requests_are_retried_by_a_rerun_and_keep_their_history(train_file, tmp_path, capsys):
    tasks = read_tasks(train_file)[:4]
    out = tmp_path / "traces.jsonl"
    with RunningServer(solving_teacher(tasks, fail_first=3)) as server:  # the teacher "dies" for 3 requests
        code = run_phase2(
            train_file,
            out,
            server.url,
            "--max_tasks",
            "4",
            "--num_samples",
            "1",
            "--concurrency",
            "1",
            "--set",
            "teacher.max_retries=0",
        )
        assert code == 3  # not "done": some samples are missing
        assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: 3 of 4 requests failed")
        assert sum(r["status"] == "api_error" for r in read_records(out)) == 3
        sent = len(server.state.requests)
        assert run_phase2(train_file, out, server.url, "--max_tasks", "4", "--num_samples", "1") == 0
        assert len(server.state.requests) - sent == 3  # exactly the failed samples were asked again
    records = read_records(out)
    assert len(records) == 7  # the error rows stay: the file is the full history
    latest = {(r["task_id"], r["sample_idx"]): r for r in records}
    assert len(latest) == 4 and all(r["passed"] for r in latest.values())
    assert sorted(len(r["previous_errors"]) for r in latest.values()) == [0, 1, 1, 1]
    assert all("HTTP 500" in e for r in latest.values() for e in r["previous_errors"])
    assert json.loads(out.with_suffix(".stats.json").read_text())["retried"] == 3


def test_a_bad_middle_line_is_an_error_and_the_file_is_untouched(train_file, tmp_path, capsys):
    tasks = read_tasks(train_file)[:3]
    out = tmp_path / "traces.jsonl"
    with RunningServer(solving_teacher(tasks)) as server:
        assert run_phase2(train_file, out, server.url, "--max_tasks", "3", "--num_samples", "1") == 0
        text = out.read_text().splitlines(keepends=True)
        damaged = text[0] + text[1][:40] + "\n" + text[2]
        out.write_text(damaged)
        sent = len(server.state.requests)
        assert run_phase2(train_file, out, server.url, "--max_tasks", "3", "--num_samples", "1") == 1
        assert len(server.state.requests) == sent
    assert f"{out}:2: malformed JSON" in capsys.readouterr().err
    assert out.read_text() == damaged


def test_overwrite_keeps_the_old_traces_until_a_good_answer_arrives(train_file, tmp_path, capsys):
    tasks = read_tasks(train_file)[:3]
    out = tmp_path / "traces.jsonl"
    with RunningServer(solving_teacher(tasks)) as server:
        assert run_phase2(train_file, out, server.url, "--max_tasks", "3", "--num_samples", "1") == 0
        good = out.read_text()
        config_text = out.with_suffix(".config.json").read_text()
        # a typo'd model name: fatal at the first request
        assert (
            phase2.cli(
                [
                    "--preset",
                    "cpu",
                    "--api_url",
                    server.url,
                    "--model",
                    "fake-teacherr",
                    "--input",
                    str(train_file),
                    "--output",
                    str(out),
                    "--max_tasks",
                    "3",
                    "--num_samples",
                    "1",
                    "--overwrite",
                ]
            )
            == 1
        )
        assert out.read_text() == good and out.with_suffix(".config.json").read_text() == config_text
    with RunningServer(FakeTeacher(shape="empty_choices")) as server:  # every answer malformed
        assert run_phase2(train_file, out, server.url, "--max_tasks", "3", "--num_samples", "1", "--overwrite") == 1
    assert out.read_text() == good
    assert "was left as it was" in capsys.readouterr().err
    with RunningServer(solving_teacher(tasks)) as server:  # a working fresh start does replace the file
        assert run_phase2(train_file, out, server.url, "--max_tasks", "1", "--num_samples", "1", "--overwrite") == 0
    assert len(read_records(out)) == 1


def test_resuming_with_other_sampling_settings_is_refused(train_file, tmp_path, capsys):
    tasks = read_tasks(train_file)[:2]
    out = tmp_path / "traces.jsonl"
    with RunningServer(solving_teacher(tasks)) as server:
        assert run_phase2(train_file, out, server.url, "--max_tasks", "2", "--num_samples", "1") == 0
        saved = out.with_suffix(".config.json").read_text()
        sent = len(server.state.requests)
        more = "--max_tasks 2 --num_samples 2 --set teacher.temperature=0.2".split()
        assert run_phase2(train_file, out, server.url, *more) == 1
        assert len(server.state.requests) == sent and out.with_suffix(".config.json").read_text() == saved
        assert "teacher.temperature 0.7 -> 0.2" in capsys.readouterr().err
        # more samples with the same settings is a normal resume
        assert run_phase2(train_file, out, server.url, "--max_tasks", "2", "--num_samples", "2") == 0
    assert len(read_records(out)) == 4


def test_retry_after_is_honoured():
    with RunningServer(FakeTeacher(fail_first=1, fail_status=429, retry_after="1.5")) as server:
        response = ask(server.url, max_retries=2)  # backoff_base=0.01: without the header it would retry at once
    assert response.ok and response.attempts == 2 and response.latency >= 1.5


def test_a_thinking_teacher_gets_the_thinking_budget_and_a_server_without_a_parser_gets_none(capsys):
    """Phase 2's requests carry teacher.thinking_token_budget (vLLM ends the thinking there, so the code still fits
    max_tokens); a server without --reasoning-parser refuses it with a 400, and the request goes again without it,
    with one warning for the whole run."""
    config = build_config("gpu")
    assert 0 < config.teacher.thinking_token_budget < config.teacher.max_tokens
    with RunningServer(FakeTeacher()) as server:
        response = ask(server.url, thinking_token_budget=config.teacher.thinking_token_budget)
        assert response.ok and server.state.requests[0]["thinking_token_budget"] == 1280
    with RunningServer(FakeTeacher()) as server:
        ask(server.url, thinking_token_budget=1280, enable_thinking=False)  # no thinking: no budget
        assert "thinking_token_budget" not in server.state.requests[0]
    with RunningServer(FakeTeacher(reasoning_parser=False)) as server:

        async def two_requests():
            async with TeacherClient(server.url, "fake-teacher", thinking_token_budget=1280) as client:
                first = await client.complete(build_chat_messages("Write add."))
                second = await client.complete(build_chat_messages("Write add."))
                return first, second, client.thinking_budget_note

        first, second, note = asyncio.run(two_requests())
        sent = [("thinking_token_budget" in r) for r in server.state.requests]
    assert first.ok and second.ok and sent == [True, False, False]
    assert "--reasoning-parser" in note
    assert capsys.readouterr().err.count("refused thinking_token_budget") == 1
