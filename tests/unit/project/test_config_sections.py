"""ARCHITECTURE.md's rule 2, enforced: a library module that names the whole `Config` is a composition root or
writes the whole config into a file; every other module receives the sections it reads."""

from __future__ import annotations

import ast

from tests.conftest import ROOT

LIBRARY_FOLDERS = ("synthesis", "training", "evaluation", "rollouts", "environments", "clients", "sandbox", "utils")
# each named in ARCHITECTURE.md rule 2 with its reason
TAKES_THE_WHOLE_CONFIG = {
    "rollouts/from_config.py",  # composition root: samplers and episodes from several sections
    "training/setup.py",  # composition root: phase 3's parts, the trainer's sections included
    "evaluation/solve.py",  # a command
    "training/export.py",  # a command
    "training/checkpointing.py",  # writes the whole config into each checkpoint and the final model
    "training/metric_sinks.py",  # hands the whole config to the trackers
    "evaluation/run_record.py",  # phase 4's cache key and results record
    "rollouts/models.py",  # the model a config's phase 3 wrote (paths.output_dir)
}


def names_config(path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(
        isinstance(node, ast.ImportFrom)
        and node.module == "config"
        and any(alias.name == "Config" for alias in node.names)
        for node in ast.walk(tree)
    )


def test_only_the_listed_modules_take_the_whole_config():
    found = {
        str(path.relative_to(ROOT))
        for folder in LIBRARY_FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        if names_config(path)
    }
    extra = found - TAKES_THE_WHOLE_CONFIG
    assert not extra, f"{sorted(extra)} take the whole Config: pass the sections they read (ARCHITECTURE.md rule 2)"
    assert not TAKES_THE_WHOLE_CONFIG - found, "a listed module no longer takes the whole Config: drop it from the list"


def test_the_trainer_and_the_scoring_receive_sections():
    for module in ("training/grpo_trainer.py", "training/scoring.py", "training/rollout_batches.py"):
        assert not names_config(ROOT / module), module
