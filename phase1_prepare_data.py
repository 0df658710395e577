"""Phase 1: load MBPP and APPS into one task format, split each dataset, merge, write.

    python phase1_prepare_data.py                          # hub MBPP (full) + APPS, 80/20 per dataset
    python phase1_prepare_data.py --apps_difficulty introductory
    python phase1_prepare_data.py --skip_apps
    python phase1_prepare_data.py --offline                # the embedded fixtures, no network
    python phase1_prepare_data.py --mbpp_path mbpp.jsonl --apps_path apps.jsonl

Writes data/train.jsonl, data/val.jsonl (task records, see ARCHITECTURE.md), data/split_manifest.json
(seed, sources, counts, skipped rows, file hashes) and data/phase1_config.json (the resolved config).
All files are written to temporary names first and renamed at the end, manifest last: either the
whole set appears or nothing changes.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

from config import Config, ConfigError, ConfigFlag, config_to_dict, phase_command_line, run_phase
from utils.dataset_loader import (
    EMBEDDED_APPS,
    EMBEDDED_MBPP,
    MBPP_STANDARD_TEST_IDS,
    DataFormatError,
    LoadReport,
    Task,
    load_apps,
    load_mapped_dataset,
    load_mbpp,
    seeded_sample,
    split_tasks,
)
from utils.jsonl import jsonl_bytes, write_files_atomic
from utils.shown_tests import no_hidden_test_ids, shown_counts, substring_only_counts

OUTPUT_NAMES = ("train.jsonl", "val.jsonl", "split_manifest.json", "phase1_config.json")


def load_sources(config: Config) -> tuple[dict[str, tuple[list[Task], list[Task]]], list[LoadReport]]:
    """Load every enabled dataset and split it: {source: (train, val)} plus the load reports."""
    data = config.data
    if data.offline and data.split_mode == "standard":
        raise ConfigError(
            f"split_mode=standard needs MBPP/APPS from the hub or local files, but data.offline is true (the "
            f"{config.preset} preset's value, or --offline): the embedded fixtures have no standard split. Add "
            "--set data.offline=false (with --mbpp_path/--apps_path and data.apps_test_path for local files), or use "
            "--split_mode random."
        )
    if data.dataset_name:  # the user's own dataset replaces MBPP/APPS
        if data.split_mode == "standard":
            raise ConfigError("split_mode=standard is for MBPP/APPS; a --dataset_name is split with --val_ratio.")
        tasks, report = load_mapped_dataset(
            data.dataset_name, data.dataset_config, data.dataset_split, data.dataset_field_map, data.dataset_test_type
        )
        return {report.source: split_tasks(tasks, data.val_ratio, data.seed)}, [report]
    mbpp_path = data.mbpp_path or (EMBEDDED_MBPP if data.offline else None)
    apps_path = data.apps_path or (EMBEDDED_APPS if data.offline else None)
    splits: dict[str, tuple[list[Task], list[Task]]] = {}
    reports: list[LoadReport] = []

    mbpp, report = load_mbpp(mbpp_path, data.mbpp_config)
    reports.append(report)
    if data.split_mode == "standard":
        in_test = [t for t in mbpp if t.metadata["original_id"] in MBPP_STANDARD_TEST_IDS]
        splits["mbpp"] = ([t for t in mbpp if t not in in_test], in_test)
    else:
        splits["mbpp"] = split_tasks(mbpp, data.val_ratio, data.seed)

    if not data.skip_apps:
        if data.split_mode == "standard":
            if apps_path and not data.apps_test_path:
                raise ConfigError("split_mode=standard with --apps_path also needs --set data.apps_test_path=FILE.")
            train, train_report = load_apps(apps_path, "train", data.apps_difficulty)
            test, test_report = load_apps(data.apps_test_path or None, "test", data.apps_difficulty)
            reports += [train_report, test_report]
            splits["apps"] = (
                seeded_sample(train, data.max_apps, data.seed),
                seeded_sample(test, data.max_apps, data.seed),
            )
        else:
            apps, report = load_apps(apps_path, "train", data.apps_difficulty)
            reports.append(report)
            splits["apps"] = split_tasks(seeded_sample(apps, data.max_apps, data.seed), data.val_ratio, data.seed)
    return splits, reports


def check_expected_sides(tasks: list[Task], config: Config) -> dict[str, str]:
    """Every task's expected sides computed once in a program-free sandbox process (only tasks whose asserts
    have one start a pool): task_id -> why, for those that err or time out."""
    from sandbox.executor import SandboxPool, expected_side_failures, plan_tests

    with_references = [t for t in tasks if plan_tests(t, True).reference_job is not None]
    if not with_references:
        return {}
    with SandboxPool.from_config(config.sandbox) as pool:
        return expected_side_failures(with_references, pool)


def verify_references(splits: dict[str, tuple[list[Task], list[Task]]], config: Config, drop: bool) -> dict:
    """Run each task's first reference solution in the sandbox; optionally drop the failures."""
    from sandbox.executor import SandboxPool, execute_many

    report: dict = {}
    with SandboxPool.from_config(config.sandbox) as pool:
        for source, (train, val) in splits.items():
            tasks = [t for t in train + val if t.reference_solutions]
            results = execute_many(
                [(t.reference_solutions[0], t) for t in tasks],
                pool,
                progress=True,
                include_challenge=config.sandbox.include_challenge_tests,
            )
            failing = {t.task_id: r.status for t, r in zip(tasks, results, strict=True) if not r.passed}
            report[source] = {
                "checked": len(tasks),
                "passed": len(tasks) - len(failing),
                "without_reference": len(train) + len(val) - len(tasks),
                "failing": failing,
                "dropped": drop,
            }
            print(
                f"{source}: {len(tasks) - len(failing)}/{len(tasks)} reference solutions pass"
                + (
                    f"; failing: {', '.join(f'{k} ({v})' for k, v in list(failing.items())[:12])}"
                    + (" ..." if len(failing) > 12 else "")
                    if failing
                    else ""
                )
            )
            if drop and failing:
                splits[source] = (
                    [t for t in train if t.task_id not in failing],
                    [t for t in val if t.task_id not in failing],
                )
    return report


def count_table(splits: dict[str, tuple[list[Task], list[Task]]]) -> dict[str, dict[str, dict[str, int]]]:
    """{source: {split: {difficulty: count}}}."""
    table = {}
    for source, (train, val) in splits.items():
        table[source] = {
            name: dict(sorted(Counter(t.difficulty for t in tasks).items()))
            for name, tasks in (("train", train), ("val", val))
        }
    return table


def format_counts(table: dict[str, dict[str, dict[str, int]]]) -> str:
    rows = [("source", "difficulty", "train", "val", "total")]
    totals = [0, 0]
    for source, by_split in table.items():
        difficulties = sorted(set(by_split["train"]) | set(by_split["val"]))
        for difficulty in difficulties:
            tr, va = by_split["train"].get(difficulty, 0), by_split["val"].get(difficulty, 0)
            rows.append((source, difficulty, str(tr), str(va), str(tr + va)))
        tr, va = sum(by_split["train"].values()), sum(by_split["val"].values())
        totals = [totals[0] + tr, totals[1] + va]
        rows.append((source, "all", str(tr), str(va), str(tr + va)))
    rows.append(("TOTAL", "", str(totals[0]), str(totals[1]), str(sum(totals))))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [
        "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def _jsonl_bytes(tasks: list[Task]) -> bytes:
    return jsonl_bytes(t.to_dict() for t in tasks)


def write_outputs(out_dir: Path, files: dict[str, bytes]) -> None:
    """Write every file to a temp name, then rename them in order (the manifest last)."""
    write_files_atomic({out_dir / name: payload for name, payload in files.items()})


def main(config: Config) -> dict:
    """Prepare the splits for `config`; returns the manifest. Raises DataFormatError/ConfigError."""
    splits, reports = load_sources(config)
    reference_check = (
        verify_references(splits, config, config.data.drop_failing_references)
        if config.data.verify_references
        else None
    )
    for report in reports:
        skipped = ", ".join(f"{n} {why}" for why, n in report.skipped.items()) or "none"
        print(
            f"{report.source}: {report.kept} tasks kept of {report.rows} rows from {report.origin} (skipped: {skipped})"
        )
    train = [t for tr, _ in splits.values() for t in tr]
    val = [t for _, va in splits.values() for t in va]
    if not train or not val:
        raise DataFormatError(
            f"no tasks left after filtering ({len(train)} train, {len(val)} val). Loosen --apps_difficulty or "
            "--max_apps, drop --skip_apps, or check the input files."
        )
    overlap = {t.task_id for t in train} & {t.task_id for t in val}
    assert not overlap, f"a task is in both splits: {sorted(overlap)[:5]}"
    from sandbox.judge import untrusted_task_ids  # planning only (pure): no process starts here

    # tests that only the program's own process can judge: such results earn no training reward
    untrusted = untrusted_task_ids(train + val, include_challenge=True)
    print(f"tasks with a test judged inside the program's process (no reward signal): {len(untrusted)}")
    # what the prompt prints of each task's tests (utils.shown_tests): correctness is scored on the others
    shown = shown_counts(train + val, config.prompt.num_visible_tests)
    no_hidden = no_hidden_test_ids(train + val, config.prompt.num_visible_tests)
    for source, row in shown.items():
        print(
            f"{source}: tests shown in the prompt: none in {row['none_shown']} tasks, some in {row['some_shown']}, "
            f"all in {row['all_shown']} ({row['tests_shown']} tests shown, {row['tests_hidden']} hidden)"
        )
    print(f"tasks whose prompt shows every test (no correctness signal in training): {len(no_hidden)}")
    # hidden tests whose texts the statement still holds outside an example block (prose, tables): the gap to look at
    gap = substring_only_counts(train + val, config.prompt.num_visible_tests)
    for source, row in gap.items():
        if row["substring_only"]:
            held = row["substring_only"]
            print(f"{source}: hidden tests whose values the statement holds outside its examples: {held}")
    unjudgeable = check_expected_sides(train + val, config)
    print(f"tasks whose expected side cannot be computed (their tests judge nothing): {len(unjudgeable)}")
    for task_id, why in list(unjudgeable.items())[:10]:
        print(f"  {task_id}: {why}")

    out_dir = Path(config.paths.data_dir)
    payloads = {"train.jsonl": _jsonl_bytes(train), "val.jsonl": _jsonl_bytes(val)}
    table = count_table(splits)
    manifest = {
        "seed": config.data.seed,
        "split_mode": config.data.split_mode,
        "val_ratio": config.data.val_ratio,
        "sources": [r.to_dict() for r in reports],
        "counts": table,
        "totals": {"train": len(train), "val": len(val)},
        "untrusted_tasks": untrusted,
        "shown_tests": {
            "num_visible_tests": config.prompt.num_visible_tests,
            "per_source": shown,
            "substring_only": {source: row["substring_only"] for source, row in gap.items()},
        },
        "no_hidden_test_tasks": no_hidden,
        "unjudgeable_tasks": unjudgeable,
        "files": {
            name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)} for name, data in payloads.items()
        },
    }
    if reference_check is not None:
        manifest["reference_check"] = reference_check
    payloads["phase1_config.json"] = (json.dumps(config_to_dict(config), indent=2) + "\n").encode()
    payloads["split_manifest.json"] = (json.dumps(manifest, indent=2) + "\n").encode()
    write_outputs(out_dir, payloads)

    print("\n" + format_counts(table))
    print(
        f"\nWrote {out_dir / 'train.jsonl'} ({len(train)} tasks), {out_dir / 'val.jsonl'} ({len(val)} tasks), "
        f"{out_dir / 'split_manifest.json'}"
    )
    return manifest


FLAGS = (
    ConfigFlag("--apps_difficulty", "data.apps_difficulty"),
    ConfigFlag("--skip_apps", "data.skip_apps"),
    ConfigFlag("--mbpp_path", "data.mbpp_path"),
    ConfigFlag("--mbpp_config", "data.mbpp_config"),
    ConfigFlag("--apps_path", "data.apps_path"),
    ConfigFlag("--max_apps", "data.max_apps"),
    ConfigFlag("--val_ratio", "data.val_ratio"),
    ConfigFlag("--seed", "data.seed"),
    ConfigFlag("--split_mode", "data.split_mode"),
    ConfigFlag("--output_dir", "paths.data_dir", "Where to write the files."),
    ConfigFlag("--verify_references", "data.verify_references"),
    ConfigFlag("--drop_failing_references", "data.drop_failing_references"),
    ConfigFlag("--offline", "data.offline"),
    ConfigFlag("--dataset_name", "data.dataset_name"),
    ConfigFlag("--dataset_config", "data.dataset_config"),
    ConfigFlag("--dataset_split", "data.dataset_split"),
    ConfigFlag("--field_map", "data.dataset_field_map"),
    ConfigFlag("--dataset_test_type", "data.dataset_test_type"),
)


DESCRIPTION = (
    "Phase 1: load MBPP and APPS, split each dataset train/val with a fixed seed, merge, and "
    "write data/train.jsonl, data/val.jsonl and data/split_manifest.json."
)


def cli(argv: list[str] | None = None) -> int:
    _, config = phase_command_line(DESCRIPTION, FLAGS, argv)
    return run_phase(
        lambda: main(config),
        (DataFormatError, ConfigError),
        "nothing was written (outputs appear only when complete).",
        writes=str(config.paths.data_dir),
    )


if __name__ == "__main__":
    sys.exit(cli())
