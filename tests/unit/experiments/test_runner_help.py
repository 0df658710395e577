"""The experiment runners' --help says what each flag does in that experiment's design."""

from __future__ import annotations

import pytest

from experiments.real_data import design as real
from experiments.real_data import run as real_run
from experiments.teacher_guidance import run as tg_run


def help_text(parse_args, capsys) -> str:
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    return " ".join(capsys.readouterr().out.split())


def test_the_real_data_help_names_its_report_and_its_pool_samples(capsys):
    text = help_text(real_run.parse_args, capsys)
    assert f"Where {real.NAME}.json/.md/.png go" in text
    assert f"sample {real.POOL_SAMPLES} (the design's POOL_SAMPLES)" in text
    assert "Samples per task in the pre-pass and every evaluation" not in text


def test_the_budget_flag_says_the_budget_rule_chooses(capsys):
    for parse_args, budgets in ((real_run.parse_args, real.BUDGETS), (tg_run.parse_args, tg_run.design.BUDGETS)):
        text = help_text(parse_args, capsys)
        assert "Unused here: the pre-pass's budget rule chooses the budget" in text
        assert " / ".join(map(str, budgets)) in text
        assert "once the config has a guidance section" not in text
