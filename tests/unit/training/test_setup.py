"""Phase 3 has one composition root: the trainer receives its parts from `training.setup` and builds none of them."""

from __future__ import annotations

import ast

from tests.conftest import ROOT

# what makes a run's parts; only training.setup (and what it calls) may name them
PART_BUILDERS = {
    "make_accelerator",
    "build_accelerator",
    "SandboxPool",
    "build_pool",
    "build_teacher_scorer",
    "build_teacher_sft",
    "episodes_for",
    "build_episodes",
    "MetricSinks",
    "load_reward_functions",
    "build_curriculum",
    "load_student",
    "attach_lora",
    "build_sampler",
}


def names_used(path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    found |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom | ast.Import):
            found |= {alias.asname or alias.name.split(".")[-1] for alias in node.names}
    return found


def test_the_trainer_names_no_builder_of_a_run_part():
    builders = names_used(ROOT / "training" / "grpo_trainer.py") & PART_BUILDERS
    assert not builders, f"training/grpo_trainer.py builds run parts itself ({sorted(builders)}): use training.setup"


def test_the_run_parts_are_keyword_only_and_frozen():
    import dataclasses

    import pytest

    from training.setup import RunParts

    fields = dataclasses.fields(RunParts)
    assert all(f.kw_only for f in fields) and RunParts.__dataclass_params__.frozen
    with pytest.raises(TypeError):
        RunParts(*[None] * len(fields))


def test_the_data_digests_name_the_processes_that_read_other_training_files(tmp_path):
    """Several machines read paths.data_dir each: a process whose tasks or traces differ from process 0's is
    named in one line with the fix; equal digests pass."""
    from training.launch import data_digests, differing_data
    from utils.dataset_loader import Task

    tasks = [
        Task.from_dict(
            {"task_id": "mbpp/1", "source": "mbpp", "problem": "p", "test_type": "assert", "tests": ["assert f() == 1"]}
        )
    ]
    traces = tmp_path / "traces.jsonl"
    traces.write_text('{"a": 1}\n')
    mine = data_digests(tasks, traces)
    assert mine == data_digests(list(tasks), traces) and mine["teacher traces"] != "missing"
    assert data_digests(tasks, tmp_path / "none.jsonl")["teacher traces"] == "missing"
    other_tasks = data_digests([Task.from_dict({**tasks[0].to_dict(), "problem": "q"})], traces)
    assert other_tasks["training tasks"] != mine["training tasks"]
    assert differing_data([(0, "node1", mine), (1, "node1", dict(mine))]) == ""
    line = differing_data([(0, "node1", mine), (8, "node2", other_tasks), (9, "node2", mine)])
    assert line.startswith("process 8 on node2 read other training tasks than process 0 on node1")
    assert "process 9" not in line and "paths.data_dir" in line and "\n" not in line
