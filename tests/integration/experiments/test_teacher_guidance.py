"""The teacher-guidance rerun (experiments/teacher_guidance) without training: what each arm's phase 3 trains on,
the re-selected pools, the deranged references, stops and flags, whole training times across resumes, the evidence
of each stage, and a report with strict and sanitized contrasts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from experiments.teacher_guidance import design
from experiments.teacher_guidance import report as report_mod
from experiments.teacher_guidance import run as harness
from tests.task_factory import assert_task, stdin_task
from utils.dataset_loader import write_tasks

TRAIN = ["mbpp/1", "mbpp/2", "mbpp/3", "apps/4", "apps/5"]
HELDOUT = ["mbpp/9005", "mbpp/7", "apps/8"]  # mbpp/9005 is a reviewed duplicate of a training task


def flags_of(command: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for i, word in enumerate(command[:-1]):
        if word.startswith("--"):
            out.setdefault(word, []).append(command[i + 1])
    return out


def make_runner(tmp_path: Path, argv: list[str] | None = None) -> harness.Runner:
    argv = argv or []
    sampler = [] if "--sampler" in argv else ["--sampler", "kv"]  # the vLLM sampler has its own test
    args = harness.parse_args(
        ["--output_dir", str(tmp_path / "work"), "--evidence_dir", str(tmp_path / "ev"), *sampler, *argv]
    )
    runner = harness.Runner(args, tmp_path / "work", tmp_path / "ev", "cmd")
    data = runner.data
    data.mkdir(parents=True)
    tasks = [
        assert_task(t, "f", "assert f(1) == 1", reference_solutions=("def f(x):\n    return x",))
        if t.startswith("mbpp")
        else stdin_task(t, ("1\n", "1\n"), reference_solutions=("print(input())",))
        for t in TRAIN + HELDOUT
    ]
    write_tasks(data / "train.jsonl", tasks[: len(TRAIN)])
    write_tasks(data / "val.jsonl", tasks[len(TRAIN) :])
    return runner


# two guided steps as phase 3 logs them (training/guidance.py): the second measures the transfer
GUIDED_METRICS = [
    {"step": 1, "pass_rate": 0.0, "frac_reward_zero_std": 1.0, "guidance/groups": 2.0,
     "guidance/pass_rate_guided": 0.25, "guidance/pass_rate_unguided": 0.0, "guidance/total_guided_groups": 2.0,
     "guidance/total_group_share": 1.0,
     "guidance/total_tasks_guided": 2.0, "guidance/total_prefix_fraction_mean": 0.5,
     "guidance/total_prefix_tokens_mean": 20.0, "guidance/total_pass_rate_guided": 0.25},
    {"step": 2, "pass_rate": 0.125, "frac_reward_zero_std": 0.5, "guidance/groups": 1.0,
     "guidance/pass_rate_unguided": 0.125, "guidance/transfer_pass_rate": 0.25, "guidance/transfer_groups": 1.0,
     "guidance/total_guided_groups": 3.0, "guidance/total_group_share": 0.75, "guidance/total_tasks_guided": 2.0,
     "guidance/total_prefix_fraction_mean": 0.5, "guidance/total_prefix_tokens_mean": 18.0,
     "guidance/total_pass_rate_guided": 0.5},
]  # fmt: skip
# their samples as phase 3 logs them (training/completion_log.py): on apps/4 two guided samples at step 1 (one goes
# on from the prefix and passes, one writes the prefix's line again) and the unguided ones before and after
PREFIX = "```python\nvalue = input().strip()  # the first line\n"
GUIDED_COMPLETIONS = [
    {"step": 1, "task_id": "apps/4", "text": "```python\ndef f(x):\n    return x\n```", "finish_reason": "stop",
     "correctness": 0.0, "teacher_prefix_tokens": 0, "teacher_prefix": ""},
    {"step": 1, "task_id": "apps/4", "text": PREFIX + "print(value)\n```", "finish_reason": "stop",
     "correctness": 1.0, "teacher_prefix_tokens": 12, "teacher_prefix": PREFIX},
    {"step": 1, "task_id": "apps/4", "text": PREFIX + "value = input().strip()  # the first line\n",
     "finish_reason": "length", "correctness": 0.0, "teacher_prefix_tokens": 12, "teacher_prefix": PREFIX},
    {"step": 2, "task_id": "apps/4", "text": "```python\nprint(input())\n```", "finish_reason": "stop",
     "correctness": 1.0, "teacher_prefix_tokens": 0, "teacher_prefix": ""},
    {"step": 2, "task_id": "mbpp/1", "text": "```python\ndef f(x):\n    return x\n```", "finish_reason": "stop",
     "correctness": 1.0, "teacher_prefix_tokens": 0, "teacher_prefix": ""},
]  # fmt: skip


def fake_phases(runner: harness.Runner, calls: list, passes: dict | None = None, fail_train: set | None = None):
    """Stand-in for the phase processes: records each command and writes the files the real one would. `passes`:
    task id -> passes of the samples a phase 4 run gives; `fail_train`: names whose first training process dies
    after a checkpoint (a resumed run)."""
    passes = passes or {}
    died: set = set()

    def run(name, command, watch=None, total_steps=0, env=None):
        calls.append((name, command))
        runner.envs_seen[name] = env or {}
        flag = {k: v[-1] for k, v in flags_of(command).items()}
        if name.endswith(".train"):
            out = Path(flag["--output_dir"])
            out.mkdir(parents=True, exist_ok=True)
            rows = [{"step": 1, "pass_rate": 0.3, "frac_reward_zero_std": 0.8, "loss/teacher_sft": 1.5}]
            if "guidance.enabled=true" in flags_of(command).get("--set", []):
                rows = GUIDED_METRICS
                completions = "".join(json.dumps(row) + "\n" for row in GUIDED_COMPLETIONS)
                (out / "completions.jsonl").write_text(completions)
            (out / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
            traces = [json.loads(x) for x in Path(flag["--teacher_traces"]).read_text().splitlines() if x.strip()]
            (out / "teacher_data.json").write_text(json.dumps({"usable_traces": len(traces)}))
            if name in (fail_train or set()) and name not in died:
                died.add(name)
                (out / "checkpoint-1").mkdir()
                return 100.0
            (out / "final_model").mkdir(exist_ok=True)
            (out / "final_model" / "adapter_config.json").write_text("{}")
            return 50.0
        if name.endswith(".merge"):
            Path(flag["--output_dir"]).mkdir(parents=True)
            (Path(flag["--output_dir"]) / "config.json").write_text("{}")
            return 1.0
        if name == "references":
            from utils.dataset_loader import read_tasks

            rows = [
                {
                    "task_id": t.task_id,
                    "sample_idx": 0,
                    "prompt": f"p {t.task_id}",
                    "code": f"# {t.task_id}",
                    "response": f"```python\n# {t.task_id}\n```",
                    "passed": True,
                }
                for t in read_tasks(flag["--input"])
            ]
            Path(flag["--output"]).write_text("".join(json.dumps(r) + "\n" for r in rows))
            Path(flag["--output"]).with_suffix(".stats.json").write_text("{}")
            return 1.0
        from utils.dataset_loader import read_tasks

        rows = [
            {
                "task_id": t.task_id,
                "sample_idx": i,
                "passed": i < passes.get(t.task_id, 1),
                "status": "wrong_answer",
                "finish_reason": "stop",
                "num_tokens": 9,
                "sanitized_passed": True,
                "code": "print(input())" if t.task_id.startswith("apps") else "def f(x):\n    return x",
            }
            for t in read_tasks(flag["--eval_file"])
            for i in range(runner.args.samples)
        ]
        Path(flag["--samples_output"]).parent.mkdir(parents=True, exist_ok=True)
        Path(flag["--samples_output"]).write_text("".join(json.dumps(r) + "\n" for r in rows))
        n = max(len(rows), 1)
        Path(flag["--output"]).write_text(
            json.dumps(
                {
                    "pass_at_k": {"1": sum(r["passed"] for r in rows) / n},
                    "pass_at_k_sanitized": {"1": 1.0},
                    "decoding": "d",
                }
            )
        )
        return 2.0

    runner.envs_seen = {}  # type: ignore[attr-defined]
    runner.run = run  # type: ignore[method-assign]
    runner.duplicates = lambda: design.duplicated_heldout([])  # type: ignore[method-assign]


def prepared(tmp_path, calls, argv: list[str] | None = None, **kw) -> harness.Runner:
    runner = make_runner(tmp_path, argv)
    fake_phases(runner, calls, **kw)
    runner.split()
    runner.prepass()
    runner.references()
    return runner


def test_teacher_arms_train_on_the_references_of_every_training_task(tmp_path):
    calls: list = []
    runner = prepared(tmp_path, calls)
    runner.one_run("tsft", 1, "[1/1]")
    [(_, command)] = [c for c in calls if c[0].endswith(".train")]
    flags = flags_of(command)
    assert flags["--train_file"] == [str(runner.all_train_file)]  # not the GRPO pool's task file
    assert flags["--teacher_traces"] == [str(runner.refs)]
    assert f"paths.data_dir={runner.data}" in flags["--set"]  # phase 3 filters traces against this split's val
    run = json.loads(design.evidence_path(runner.evidence, "tsft", 1).read_text())
    assert run["stages"]["sft"]["teacher_data_used"]["usable_traces"] == len(TRAIN)


def test_the_held_out_set_leaves_out_duplicates_and_the_budget_is_recorded(tmp_path):
    calls: list = []
    runner = prepared(tmp_path, calls, passes={"mbpp/1": 1, "apps/8": 0})
    prepass = json.loads((runner.evidence / "prepass.json").read_text())
    assert "mbpp/9005" not in prepass["heldout_set"] and prepass["duplicates_dropped"] == ["mbpp/9005"]
    assert prepass["max_new_tokens"] == design.BUDGETS[0] and prepass["budgets_tried"][0]["at_budget"] == 0.0
    assert flags_of(calls[-2][1]).get("--max_new_tokens") == [str(design.BUDGETS[0])]


def cut_at_first_budget(runner: harness.Runner, calls: list, stop_at: int | None = None) -> None:
    """The fake phases, with every pre-pass answer at the first budget ended by it (so the next budget is tried);
    `stop_at`: the budget whose pre-pass never finishes (the machine goes away)."""
    fake = runner.run

    def run(name, command, watch=None, total_steps=0, env=None):
        budget = int(flags_of(command).get("--max_new_tokens", ["0"])[-1])
        if name == "prepass" and budget == stop_at:
            raise SystemExit("the machine went away")
        wall = fake(name, command, watch, total_steps)
        if name == "prepass" and budget == design.BUDGETS[0]:
            out = Path(flags_of(command)["--samples_output"][-1])
            rows = [{**json.loads(x), "finish_reason": "length"} for x in out.read_text().splitlines()]
            out.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return wall

    runner.run = run  # type: ignore[method-assign]


def test_each_budget_tried_is_evidence_and_a_new_work_folder_goes_on_from_the_next(tmp_path):
    first_calls: list = []
    first = make_runner(tmp_path / "first")
    fake_phases(first, first_calls)
    cut_at_first_budget(first, first_calls, stop_at=design.BUDGETS[1])
    first.split()
    try:
        first.prepass()
    except SystemExit:
        pass
    stored = json.loads(first.budget_try_path(design.BUDGETS[0]).read_text())
    assert stored["at_budget"] == 1.0 and not (first.evidence / "prepass.json").exists()

    calls: list = []
    second = make_runner(tmp_path / "second")
    second.evidence = first.evidence  # the committed evidence, on a new machine
    fake_phases(second, calls)
    cut_at_first_budget(second, calls)
    second.split()
    second.prepass()
    budgets = [flags_of(c)["--max_new_tokens"][-1] for n, c in calls if n == "prepass"]
    assert budgets == [str(design.BUDGETS[1])]  # the first budget's try is not redone
    prepass = json.loads((second.evidence / "prepass.json").read_text())
    assert [t["budget"] for t in prepass["budgets_tried"]] == list(design.BUDGETS[:2])
    assert prepass["max_new_tokens"] == design.BUDGETS[1] and second.budget == design.BUDGETS[1]


def test_a_stash_keeps_the_base_models_unfinished_caches_for_a_new_work_folder(tmp_path):
    runner = make_runner(tmp_path / "old")
    work = runner.work
    caches = {
        f"prepass-{design.BUDGETS[0]}/eval_cache/a.jsonl": "done\n",  # its try is evidence: not stashed
        f"prepass-{design.BUDGETS[1]}/eval_cache/b.jsonl": "1\n2\n",
        "runs/base-s1/eval_cache/c.jsonl": "1\n",
        "runs/base-s2/eval_cache/d.jsonl": "1\n",  # its run is evidence: not stashed
        "runs/grpo-s1/eval_cache/e.jsonl": "1\n",  # a trained model's: a new folder trains it again
    }
    for rel, text in caches.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    runner.budget_try_path(design.BUDGETS[0]).parent.mkdir(parents=True, exist_ok=True)
    runner.budget_try_path(design.BUDGETS[0]).write_text("{}")
    design.evidence_path(runner.evidence, "base", 2).parent.mkdir(parents=True, exist_ok=True)
    design.evidence_path(runner.evidence, "base", 2).write_text("{}")
    stashed = runner.stash_partial()
    partial = runner.evidence / harness.PARTIAL
    assert sorted(str(p.relative_to(partial)) for p in stashed) == [
        f"prepass-{design.BUDGETS[1]}/eval_cache/b.jsonl",
        "runs/base-s1/eval_cache/c.jsonl",
    ]
    assert json.loads((partial / "stash.json").read_text())["caches"]["runs/base-s1/eval_cache/c.jsonl"] == 1

    fresh = make_runner(tmp_path / "new")
    fresh.evidence = runner.evidence
    (fresh.work / "runs/base-s1/eval_cache").mkdir(parents=True)
    (fresh.work / "runs/base-s1/eval_cache/c.jsonl").write_text("1\n2\n")  # already further: kept
    restored = fresh.restore_partial()
    assert [str(p.relative_to(fresh.work)) for p in restored] == [f"prepass-{design.BUDGETS[1]}/eval_cache/b.jsonl"]
    assert (fresh.work / f"prepass-{design.BUDGETS[1]}/eval_cache/b.jsonl").read_text() == "1\n2\n"
    assert (fresh.work / "runs/base-s1/eval_cache/c.jsonl").read_text() == "1\n2\n"


def test_a_stop_with_nothing_to_stash_after_an_empty_stash_writes_nothing(tmp_path):
    """Every stop stashes; one with no unfinished base cache, after a stash that held none either, leaves the listing
    as it was (no new time in it, so no commit that changes nothing but a timestamp)."""
    runner = make_runner(tmp_path)
    assert runner.stash_partial() == []
    listing = runner.evidence / harness.PARTIAL / "stash.json"
    before = listing.read_text()
    time.sleep(1.1)  # the listing's time has whole seconds
    assert runner.stash_partial() == []
    assert listing.read_text() == before
    cache = runner.work / "runs/base-s1/eval_cache/c.jsonl"
    cache.parent.mkdir(parents=True)
    cache.write_text("")  # a pass that was stopped before its first batch came back: nothing to keep
    assert runner.stash_partial() == []
    assert listing.read_text() == before
    cache.write_text("1\n")
    assert len(runner.stash_partial()) == 1  # a cache again: stashed
    cache.unlink()
    assert runner.stash_partial() == []  # and its removal is written
    assert json.loads(listing.read_text())["caches"] == {}


def test_b_trains_grpo_on_a_pool_reselected_on_its_sft_model_and_keeps_its_sft_stage(tmp_path):
    calls: list = []
    runner = prepared(tmp_path, calls, passes={t: 1 for t in TRAIN})
    runner.one_run("sft_grpo", 1, "[1/1]")
    names = [n for n, _ in calls]
    assert names[-5:] == [
        "sft_references-s1.train",
        "sft_references-s1.merge",
        "sft_grpo-s1.prepass",
        "sft_grpo-s1.train",
        "sft_grpo-s1.eval",
    ]
    grpo = flags_of(dict(calls)["sft_grpo-s1.train"])
    assert grpo["--train_file"] == [str(runner.work / "runs" / "sft_grpo-s1" / "pool.jsonl")]
    assert any(s.startswith("student.model_name=") and s.endswith(".merged") for s in grpo["--set"])
    assert f"grpo.max_new_tokens={design.BUDGETS[0]}" in grpo["--set"]
    run = json.loads(design.evidence_path(runner.evidence, "sft_grpo", 1).read_text())
    assert run["stages"]["sft"]["metrics"][0]["loss/teacher_sft"] == 1.5  # B's SFT-stage metrics are kept
    assert run["stages"]["pool"]["pool"] == TRAIN
    assert run["signal"]["ok"] is False  # flat groups 0.8 > the design's 0.5: flagged
    assert run["train_s"] == 100.0  # both stages
    # E is B's first stage: no second SFT training
    runner.one_run("tsft", 1, "[2/2]")
    assert sum(n == "sft_references-s1.train" for n, _ in calls) == 1


def test_a_grpo_stage_whose_pool_is_too_small_is_stopped_not_run(tmp_path):
    calls: list = []
    runner = prepared(tmp_path, calls, passes={t: 0 for t in TRAIN})  # the SFT'd model passes nothing
    runner.one_run("sft_grpo", 1, "[1/1]")
    assert "sft_grpo-s1.train" not in [n for n, _ in calls]
    run = json.loads(design.evidence_path(runner.evidence, "sft_grpo", 1).read_text())
    assert run["stopped"].startswith("the GRPO pool holds 0 tasks")


def test_the_format_control_trains_on_deranged_references_of_the_same_style(tmp_path):
    calls: list = []
    runner = prepared(tmp_path, calls, passes={t: 1 for t in TRAIN})
    rows = [json.loads(x) for x in runner.deranged_refs.read_text().splitlines()]
    assert {r["task_id"]: r["deranged_from"] for r in rows} == {
        "apps/4": "apps/5",
        "apps/5": "apps/4",
        "mbpp/1": "mbpp/2",
        "mbpp/2": "mbpp/3",
        "mbpp/3": "mbpp/1",
    }
    assert all(r["code"] == f"# {r['deranged_from']}" and r["prompt"] == f"p {r['task_id']}" for r in rows)
    runner.one_run("format", 1, "[1/1]")
    sft = flags_of(dict(calls)["sft_deranged-s1.train"])
    assert sft["--teacher_traces"] == [str(runner.deranged_refs)]


def test_resumed_run_records_its_whole_training_time(tmp_path):
    calls: list = []
    runner = prepared(tmp_path, calls, fail_train={"grpo-s1.train"})
    folder = runner.work / "runs" / "grpo-s1"
    first = runner.train("grpo-s1", folder, {}, 4)
    assert first == (100.0, False) and not (folder / "final_model").exists()
    second = runner.train("grpo-s1", folder, {}, 4)  # resumed from checkpoint-1
    assert second == (150.0, True)
    assert "--resume_from_checkpoint" in calls[-1][1]
    assert runner.train("grpo-s1", folder, {}, 4) == (150.0, True)  # finished: the stored total, not 0


def test_the_guided_arm_is_declared_and_runs_once_its_config_section_exists(tmp_path, monkeypatch):
    calls: list = []
    runner = prepared(tmp_path, calls)
    monkeypatch.setattr(harness.frame, "has_config_section", lambda name: False)
    runner.one_run("guided", 1, "[1/1]")
    assert not design.evidence_path(runner.evidence, "guided", 1).exists()
    monkeypatch.setattr(harness.frame, "has_config_section", lambda name: True)
    runner.one_run("guided", 1, "[1/1]")
    grpo = flags_of(dict(calls)["guided-s1.train"])
    assert grpo["--train_file"] == [str(runner.all_train_file)] and "guidance.enabled=true" in grpo["--set"]
    assert (
        "--max_steps" in dict(calls)["guided-s1.train"]
        and str(design.SFT_STEPS + design.GRPO_STEPS) in grpo["--max_steps"]
    )


def test_the_vllm_sampler_samples_every_pass_and_rollout_in_vllms_interpreter(tmp_path, monkeypatch):
    """--sampler vllm: every phase 4 (pre-pass, re-selected pool, evaluation) and every GRPO stage run in the
    interpreter that has vLLM, with its engine's CPU settings; phase 4 on vLLM, GRPO's rollouts on the colocated
    engine with merged weights and a float32 trainer; what samples nothing (references, SFT, merge) stays here."""
    import importlib.util
    import sys

    fake_python = tmp_path / "venv-vllm" / "bin" / "python"
    fake_python.parent.mkdir(parents=True)
    fake_python.write_text("")
    monkeypatch.setattr(harness.frame, "VLLM_CPU_PYTHON", fake_python)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    calls: list = []
    runner = prepared(tmp_path, calls, ["--sampler", "vllm"], passes={t: 1 for t in TRAIN})
    runner.one_run(design.BASE, 1, "[1/3]")
    runner.one_run("sft_grpo", 1, "[2/3]")
    commands = dict(calls)
    sampling = [n for n in commands if n.startswith("prepass") or n.endswith((".eval", ".prepass", "grpo-s1.train"))]
    assert {"prepass", "base-s1.eval", "sft_grpo-s1.prepass", "sft_grpo-s1.train", "sft_grpo-s1.eval"} <= set(sampling)
    for name in sampling:
        assert commands[name][0] == str(fake_python), name
        assert runner.envs_seen[name]["VLLM_CPU_KVCACHE_SPACE"] == "1", name
    for name in ("prepass", "base-s1.eval", "sft_grpo-s1.eval"):
        assert "evaluation.backend=vllm" in flags_of(commands[name])["--set"], name
    grpo_sets = flags_of(commands["sft_grpo-s1.train"])["--set"]
    assert {f"{k}={str(v).lower()}" for k, v in harness.frame.VLLM_ROLLOUTS.items()} <= set(grpo_sets)
    for name in ("references", "sft_references-s1.train", "sft_references-s1.merge"):
        assert commands[name][0] == sys.executable and not runner.envs_seen[name], name
    assert "grpo.rollout_backend=vllm" not in flags_of(commands["sft_references-s1.train"])["--set"]
    run = json.loads(design.evidence_path(runner.evidence, "sft_grpo", 1).read_text())
    assert run["overrides"]["grpo.rollout_backend"] == "vllm"
    assert json.loads(runner.budget_try_path(design.BUDGETS[0]).read_text())["sampler"] == "vllm"


def test_the_sampler_is_part_of_the_recipe_and_vllm_without_vllm_says_how_to_install_it(tmp_path, monkeypatch):
    import importlib.util

    kv = harness.parse_args(["--sampler", "kv", "--output_dir", str(tmp_path / "w")])
    vllm = harness.parse_args(["--sampler", "vllm", "--output_dir", str(tmp_path / "w")])
    assert harness.parse_args([]).sampler == design.SAMPLER
    harness.frame.claim_work_folder(kv, design.RECIPE_FLAGS)
    with pytest.raises(SystemExit, match="another recipe"):
        harness.frame.claim_work_folder(vllm, design.RECIPE_FLAGS)
    assert harness.recipe_of(kv) != harness.recipe_of(vllm)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    monkeypatch.setattr(harness.frame, "VLLM_CPU_PYTHON", tmp_path / "missing" / "python")
    runner = make_runner(tmp_path, ["--sampler", "vllm"])
    with pytest.raises(SystemExit, match="make vllm-venv"):
        runner.sampling("phase4_evaluate.py")


def test_the_report_gives_strict_and_sanitized_contrasts_per_stratum(tmp_path):
    calls: list = []
    runner = prepared(tmp_path, calls, passes={t: 1 for t in TRAIN})
    for seed in (1, 2):
        for arm in ("base", "tsft", "grpo", "sft_grpo", "format"):
            runner.one_run(arm, seed, "[x]")
    report = report_mod.build_report(runner.evidence, "cmd")
    contrasts = report["analysis"]["all"]["sanitized_pass@1"]["contrasts"]
    assert set(contrasts) == {"sft_grpo - grpo", "sft_grpo - format", "tsft - base", "grpo - base"}
    assert contrasts["sft_grpo - format"]["seeds"] == [1, 2]
    assert "strict_pass@1" in report["analysis"]["mbpp_format"]
    assert report["runs"]["sft_grpo-s1"]["teacher_traces_used"] == {"sft": len(TRAIN), "grpo": len(TRAIN)}
    assert "sft_grpo-s1" in report["flagged_runs"]
    text = report_mod.markdown(report)
    assert "B sft_grpo − F format" in text and "sanitized" in text


def test_the_report_says_who_sampled_each_pass_and_the_samplers_parity(tmp_path):
    calls: list = []
    runner = prepared(tmp_path, calls, passes={t: 1 for t in TRAIN})
    harness.frame.check_evidence_recipe(runner.evidence, harness.recipe_of(runner.args))  # kv, as the runner starts
    runner.one_run("base", 1, "[x]")
    parity = {"first_name": "kv", "second_name": "vllm", "tasks": 3, "difference": {"mean": -0.05, "ci95": [-0.2, 0.1]}}
    parity |= {"first": {"pass_rate": 0.25}, "second": {"pass_rate": 0.2}}
    (runner.evidence / "prepass" / "sampler-parity-384.json").write_text(json.dumps(parity))
    report = report_mod.build_report(runner.evidence, "cmd")
    assert report["sampler"] == "kv" and report["sampler_parity"]["384"]["difference"]["mean"] == -0.05
    text = report_mod.markdown(report)
    assert f"{design.BUDGETS[0]}: " in text and "(kv)" in text and "Arms sampled by kv" in text
    assert "parity at 384 tokens, 3 tasks: pass rate kv 0.250, vllm 0.200, difference -0.050 [-0.200, +0.100]" in text


def test_a_guided_runs_evidence_keeps_its_guidance_and_the_report_reads_what_the_answers_are(tmp_path, monkeypatch):
    """The guided arm's evidence keeps phase 3's guidance metrics (the run's totals and the transfer), and the
    report gives how much guidance each guided run used and, per arm and stratum, the share of answers whose
    program reads stdin, with no gradable code and ended by the budget."""
    calls: list = []
    runner = prepared(tmp_path, calls, passes={t: 1 for t in TRAIN})
    monkeypatch.setattr(harness.frame, "has_config_section", lambda name: True)
    runner.task_types()
    types = json.loads((runner.evidence / "task_types.json").read_text())
    assert types["apps/4"] == "stdin" and types["mbpp/1"] == "assert" and set(types) == set(TRAIN + HELDOUT)
    runner.one_run("base", 1, "[1/2]")
    runner.one_run("guided", 1, "[2/2]")
    run = json.loads(design.evidence_path(runner.evidence, "guided", 1).read_text())
    metrics = run["stages"]["grpo"]["metrics"]
    assert metrics[-1]["guidance/total_guided_groups"] == 3.0 and metrics[-1]["guidance/transfer_pass_rate"] == 0.25
    report = report_mod.build_report(runner.evidence, "cmd")
    used = report["guidance"]["guided-s1"]
    assert (used["guided_groups"], used["group_share"], used["tasks_guided"]) == (3.0, 0.75, 2.0)
    assert used["pass_rate_guided"] == 0.5 and used["pass_rate_unguided_mean"] == pytest.approx(0.0625)
    assert (used["transfer_pass_rate_mean"], used["transfer_steps"]) == (0.25, 1)
    assert "base-s1" not in report["guidance"]
    shapes = report["answer_shapes"]
    assert shapes["guided"]["apps_format"]["reads_stdin"] == 1.0 and shapes["guided"]["mbpp_format"]["reads_stdin"] == 0
    assert shapes["base"]["all"]["samples"] == 2 * runner.args.samples and shapes["base"]["all"]["no_code"] == 0
    text = report_mod.markdown(report)
    assert (
        "## Guidance used" in text
        and "| guided-s1 | 2 | 3 (75.0%) | 2 | 50.0%, 18 | 50.0% | 6.2% | 25.0% (1) |" in text
    )
    assert "| G guided | apps_format | " in text and "100.0% (of " in text
    # what the rollouts were: guided samples that read stdin (one repeating its prefix), and on the guided task the
    # unguided sample after guidance reads stdin where the one before did not
    rollouts = report["rollout_shapes"]["guided"]
    assert rollouts["guided"]["apps_format"] == {
        "samples": 2, "passed": 1, "at_budget": 1, "reads_stdin": 2, "echoes_prefix": 1
    }  # fmt: skip
    assert rollouts["unguided"]["apps_format"] == {
        "samples": 2, "passed": 1, "at_budget": 0, "reads_stdin": 1, "echoes_prefix": 0
    }  # fmt: skip
    assert rollouts["unguided, on a task guided earlier"]["apps_format"] == {
        "samples": 1, "passed": 1, "at_budget": 0, "reads_stdin": 1, "echoes_prefix": 0
    }  # fmt: skip
    assert set(rollouts["unguided, on a task guided earlier"]) == {"apps_format", "apps_stdin"}
    assert rollouts["unguided"]["mbpp_format"]["samples"] == 1 and "base" not in report["rollout_shapes"]
    assert "| G guided | guided | apps_format | 2 | 50.0% | 50.0% | 100.0% | 50.0% |" in text
    # the APPS tasks judged on stdin, a descriptive split beside the strata: here every APPS task is stdin...
    assert rollouts["guided"]["apps_stdin"] == rollouts["guided"]["apps_format"]
    assert shapes["guided"]["apps_stdin"]["samples"] == runner.args.samples and shapes["guided"]["apps_stdin"]["passed"]
    assert "apps_stdin: the APPS-format tasks judged on stdin" in text
    # ...and a call-based one is not in it
    (runner.evidence / "task_types.json").write_text(json.dumps(types | {"apps/4": "call", "apps/8": "call"}))
    called = report_mod.build_report(runner.evidence, "cmd")
    assert "apps_stdin" not in called["rollout_shapes"]["guided"]["guided"]
    assert "apps_stdin" not in called["answer_shapes"]["guided"]
    examples = run["stages"]["grpo"]["rollout_examples"]
    assert [e["kind"] for e in examples] == ["guided, passed", "guided, failed", "unguided, on a task guided earlier"]


def test_the_report_is_complete_only_with_the_guided_arm_once_it_can_run(tmp_path, monkeypatch):
    calls: list = []
    runner = prepared(tmp_path, calls, passes={t: 1 for t in TRAIN})
    monkeypatch.setattr(report_mod, "DEFAULT_SEEDS", (1,))
    monkeypatch.setattr(harness.frame, "has_config_section", lambda name: True)
    for arm in ("base", "tsft", "grpo", "sft_grpo", "format"):
        runner.one_run(arm, 1, "[x]")
    assert not report_mod.build_report(runner.evidence, "cmd")["complete"]  # G can run: it is planned
    monkeypatch.setattr(report_mod, "has_config_section", lambda name: name is None)
    assert report_mod.build_report(runner.evidence, "cmd")["complete"]  # a config without the section: G is not
    monkeypatch.setattr(report_mod, "has_config_section", lambda name: True)
    runner.one_run("guided", 1, "[x]")
    assert report_mod.build_report(runner.evidence, "cmd")["complete"]
