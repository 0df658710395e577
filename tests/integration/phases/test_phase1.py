"""phase1_prepare_data.py through its command line and its main(config)."""

import json

import pytest

import phase1_prepare_data as phase1
from config import build_config
from tests.cli_helpers import run_script
from tests.conftest import SHARED_DATA
from utils.dataset_loader import DataFormatError, read_tasks


def run_cli(*args, timeout=120):
    return run_script("phase1_prepare_data.py", *args, timeout=timeout)


def test_offline_cli_writes_all_outputs_and_prints_the_table(tmp_path):
    proc = run_cli("--offline", "--preset", "cpu", "--output_dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "source  difficulty" in proc.stdout and "TOTAL" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(phase1.OUTPUT_NAMES)
    manifest = json.loads((tmp_path / "split_manifest.json").read_text())
    assert manifest["seed"] == 42 and manifest["totals"] == {"train": 57, "val": 14}
    assert set(manifest["counts"]) == {"mbpp", "apps"}
    assert json.loads((tmp_path / "phase1_config.json").read_text())["data"]["offline"] is True
    train, val = read_tasks(tmp_path / "train.jsonl"), read_tasks(tmp_path / "val.jsonl")
    assert not {t.task_id for t in train} & {t.task_id for t in val}
    for source in ("mbpp", "apps"):
        n_train = sum(t.source == source for t in train)
        n_val = sum(t.source == source for t in val)
        assert abs(n_val - 0.2 * (n_train + n_val)) <= 1


def test_same_inputs_and_seed_give_byte_identical_files(tmp_path):
    config = build_config("cpu", overrides=[f"paths.data_dir={tmp_path / 'a'}"])
    phase1.main(config)
    first = {name: (tmp_path / "a" / name).read_bytes() for name in phase1.OUTPUT_NAMES}
    phase1.main(config)
    for name in phase1.OUTPUT_NAMES:
        assert (tmp_path / "a" / name).read_bytes() == first[name], name
    phase1.main(build_config("cpu", overrides=[f"paths.data_dir={tmp_path / 'c'}", "data.seed=1"]))
    assert (tmp_path / "c" / "val.jsonl").read_bytes() != (tmp_path / "a" / "val.jsonl").read_bytes()


def test_manifest_hashes_match_the_files(tmp_path):
    import hashlib

    manifest = phase1.main(build_config("cpu", overrides=[f"paths.data_dir={tmp_path}"]))
    for name, meta in manifest["files"].items():
        assert hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() == meta["sha256"]


def test_flags_filter_and_cap(tmp_path):
    manifest = phase1.main(
        build_config(
            "cpu",
            overrides=[
                f"paths.data_dir={tmp_path}",
                "data.apps_difficulty=introductory",
                "data.max_apps=10",
                "data.val_ratio=0.3",
            ],
        )
    )
    apps = manifest["counts"]["apps"]
    assert set(apps["train"]) | set(apps["val"]) == {"introductory"}
    assert sum(apps["train"].values()) + sum(apps["val"].values()) == 10 and sum(apps["val"].values()) == 3
    skipped = manifest["sources"][1]["skipped"]
    assert skipped == {"difficulty is not introductory": 10}
    only_mbpp = phase1.main(build_config("cpu", overrides=[f"paths.data_dir={tmp_path}", "data.skip_apps=true"]))
    assert set(only_mbpp["counts"]) == {"mbpp"}


@pytest.mark.parametrize(
    "make_input, message",
    [
        (lambda d: ["--mbpp_path", str(d / "nope.jsonl")], "nope.jsonl: file not found"),
        (
            lambda d: ["--mbpp_path", str(d.joinpath("x.csv").write_text("a") and d / "x.csv")],
            "unsupported file type '.csv'",
        ),
        (
            lambda d: ["--mbpp_path", str(d.joinpath("m.jsonl").write_text('{"a": 1}\n') and d / "m.jsonl")],
            "m.jsonl:1: missing required",
        ),
        (
            lambda d: ["--mbpp_path", str(d.joinpath("e.jsonl").write_text("") or d / "e.jsonl"), "--skip_apps"],
            "no tasks left after filtering",
        ),
    ],
)
def test_bad_input_is_one_line_error_and_leaves_old_outputs_untouched(tmp_path, make_input, message):
    out = tmp_path / "out"
    assert run_cli("--offline", "--preset", "cpu", "--output_dir", str(out)).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    proc = run_cli("--preset", "cpu", "--output_dir", str(out), *make_input(tmp_path))
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("error: ") and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1  # one line, no traceback
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing partial, nothing lost


def test_malformed_line_number_is_reported(tmp_path):
    good = json.dumps({"text": "t", "code": "def f():\n  return 1", "task_id": 1, "test_list": ["assert f() == 1"]})
    path = tmp_path / "m.jsonl"
    path.write_text(good + "\n" + good.replace("1", "2", 1) + "\n{broken\n")
    with pytest.raises(DataFormatError, match=r"m\.jsonl:3: malformed JSON"):
        phase1.main(build_config("cpu", overrides=[f"paths.data_dir={tmp_path / 'o'}", f"data.mbpp_path={path}"]))
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_help_explains_every_flag():
    proc = run_cli("--help")
    for flag in (
        "--apps_difficulty",
        "--skip_apps",
        "--mbpp_path",
        "--apps_path",
        "--max_apps",
        "--val_ratio",
        "--seed",
        "--output_dir",
        "--offline",
        "--split_mode",
        "--preset",
        "--config",
        "--set",
    ):
        assert flag in proc.stdout


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/data not present")
def test_real_data_random_and_standard_splits(tmp_path):
    base = [
        f"data.mbpp_path={SHARED_DATA / 'mbpp.jsonl'}",
        f"data.apps_path={SHARED_DATA / 'apps_sample.jsonl'}",
        "data.offline=false",
    ]
    manifest = phase1.main(build_config("cpu", overrides=[*base, f"paths.data_dir={tmp_path / 'r'}"]))
    assert manifest["totals"] == {"train": 779 + 122, "val": 195 + 31}
    # what the prompt prints of the tests, by content (utils.shown_tests): most APPS statements print
    # every test of theirs as an example; those tasks give no correctness signal in training
    apps = manifest["shown_tests"]["per_source"]["apps"]
    assert (apps["none_shown"], apps["some_shown"], apps["all_shown"]) == (15, 50, 88)
    # hidden tests a looser substring rule would take for shown (examples written in prose): reported, not shown
    assert manifest["shown_tests"]["substring_only"] == {"mbpp": 0, "apps": 29}
    assert len(manifest["no_hidden_test_tasks"]) == 88 + manifest["shown_tests"]["per_source"]["mbpp"]["all_shown"]
    assert manifest["unjudgeable_tasks"] == {}  # every expected side of real MBPP computes
    standard = phase1.main(
        build_config(
            "cpu",
            overrides=[
                *base[:1],
                "data.offline=false",
                "data.skip_apps=true",
                "data.split_mode=standard",
                f"paths.data_dir={tmp_path / 's'}",
            ],
        )
    )
    assert standard["totals"] == {"train": 474, "val": 500}
    val_ids = {t.metadata["original_id"] for t in read_tasks(tmp_path / "s" / "val.jsonl")}
    assert val_ids == set(range(11, 511))


def test_verify_references_reports_and_drops_failures(tmp_path):
    from utils.dataset_loader import EMBEDDED_MBPP

    rows = [json.loads(line) for line in EMBEDDED_MBPP.read_text().splitlines()[:10]]
    rows[3]["code"] = rows[3]["code"].replace("return", "return None and ")  # this reference now fails its tests
    broken = tmp_path / "mbpp.jsonl"
    broken.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = [f"data.mbpp_path={broken}", "data.skip_apps=true", "data.verify_references=true"]
    kept = phase1.main(build_config("cpu", overrides=[*base, f"paths.data_dir={tmp_path / 'a'}"]))
    check = kept["reference_check"]["mbpp"]
    assert check["checked"] == 10 and check["passed"] == 9 and list(check["failing"]) == [f"mbpp/{rows[3]['task_id']}"]
    assert kept["totals"]["train"] + kept["totals"]["val"] == 10
    dropped = phase1.main(
        build_config("cpu", overrides=[*base, "data.drop_failing_references=true", f"paths.data_dir={tmp_path / 'b'}"])
    )
    assert dropped["totals"]["train"] + dropped["totals"]["val"] == 9
    ids = {t.task_id for t in read_tasks(tmp_path / "b" / "train.jsonl") + read_tasks(tmp_path / "b" / "val.jsonl")}
    assert f"mbpp/{rows[3]['task_id']}" not in ids


def test_own_dataset_through_load_dataset_and_a_field_map(tmp_path, capsys):
    """--dataset_name (a hub name or, here offline, a local folder) + --field_map -> validated task records."""
    folder = tmp_path / "my-tasks"
    folder.mkdir()
    rows = [
        {
            "id": i,
            "question": f"Return {i} times two.",
            "checks": json.dumps([f"assert f({i}) == {2 * i}"]),
            "entry": "f",
            "solution": "def f(x):\n    return 2 * x",
        }
        for i in range(1, 11)
    ]
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    args = [
        "--preset",
        "cpu",
        "--dataset_name",
        str(folder),
        "--field_map",
        "task_id=id",
        "problem=question",
        "tests=checks",
        "fn_name=entry",
        "reference_solutions=solution",
        "--output_dir",
        str(out),
    ]
    assert phase1.cli(args) == 0
    tasks = read_tasks(out / "train.jsonl") + read_tasks(out / "val.jsonl")
    assert sorted(t.task_id for t in tasks) == sorted(f"my-tasks/{i}" for i in range(1, 11))
    first = next(t for t in tasks if t.task_id == "my-tasks/3")
    assert first.tests == ("assert f(3) == 6",) and first.fn_name == "f" and first.problem == "Return 3 times two."
    assert first.reference_solutions == ("def f(x):\n    return 2 * x",) and first.source == "my-tasks"
    # a row whose "test" could never fail is an error naming the row, like any other task file
    rows[4]["checks"] = json.dumps(["f(5) == 10"])
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert phase1.cli([*args[:-1], str(tmp_path / "out2")]) == 1
    assert "row 5: tests[0] 'f(5) == 10' is not an assert statement" in capsys.readouterr().err
    assert phase1.cli([*args[:5], "problem=question", "tests=check", "--output_dir", str(tmp_path / "o3")]) == 1
    assert "no column 'check' (mapped to tests)" in capsys.readouterr().err
