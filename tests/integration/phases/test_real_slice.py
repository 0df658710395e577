"""The real data sets' formats, checked on a committed slice (tests/data/real) so the check never skips."""

from __future__ import annotations

from pathlib import Path

import phase1_prepare_data as phase1
from config import build_config
from sandbox.executor import SandboxLimits, execute_many, plan_tests, untrusted_task_ids
from utils.dataset_loader import load_apps, load_mbpp, read_tasks

SLICE = Path(__file__).resolve().parents[2] / "data" / "real"


def test_the_real_slices_load_whole_and_their_references_pass_in_the_sandbox(pool):
    mbpp, mbpp_report = load_mbpp(SLICE / "mbpp_slice.jsonl")
    apps, apps_report = load_apps(SLICE / "apps_slice.jsonl")
    assert (mbpp_report.kept, sum(mbpp_report.skipped.values())) == (16, 0)
    assert (apps_report.kept, sum(apps_report.skipped.values())) == (7, 0)
    assert {t.test_type for t in mbpp} == {"assert"} and {t.test_type for t in apps} == {"stdin", "call"}
    # every assert is judged outside the program; only MBPP 596 (sys.getsizeof) needs a program-free reference run
    plans = {t.task_id: plan_tests(t, include_challenge=True) for t in mbpp}
    assert untrusted_task_ids(mbpp, include_challenge=True) == []
    assert [task_id for task_id, plan in plans.items() if plan.reference_job] == ["mbpp/596"]
    limits = SandboxLimits(test_timeout=10.0)
    results = execute_many([(t.reference_solutions[0], t) for t in mbpp], pool, limits, include_challenge=True)
    assert [t.task_id for t, r in zip(mbpp, results, strict=True) if not r.passed] == []
    results = execute_many([(t.reference_solutions[0], t) for t in apps], pool, limits)
    # APPS 33 accepts several answers; its reference prints another one than the stored output
    assert [t.task_id for t, r in zip(apps, results, strict=True) if not r.passed] == ["apps/33"]


def test_phase1_splits_the_real_slices_and_counts_what_the_prompt_shows(tmp_path):
    overrides = [
        f"data.mbpp_path={SLICE / 'mbpp_slice.jsonl'}",
        f"data.apps_path={SLICE / 'apps_slice.jsonl'}",
        "data.offline=false",
        f"paths.data_dir={tmp_path}",
    ]
    manifest = phase1.main(build_config("cpu", overrides=overrides))
    train, val = read_tasks(tmp_path / "train.jsonl"), read_tasks(tmp_path / "val.jsonl")
    assert manifest["totals"] == {"train": len(train), "val": len(val)} and len(train) + len(val) == 16 + 7
    assert {t.task_id for t in train} | {t.task_id for t in val} == {
        *(f"mbpp/{i}" for i in [*range(11, 21), 596, 601, 602, 603, 604, 605]),
        *(f"apps/{i}" for i in (24, 33, 2030, 2036, 2407, 2409, 4184)),
    }
    shown = manifest["shown_tests"]["per_source"]
    assert sum(shown["mbpp"][k] for k in ("none_shown", "some_shown", "all_shown")) == 16
    assert sum(shown["apps"][k] for k in ("none_shown", "some_shown", "all_shown")) == 7
