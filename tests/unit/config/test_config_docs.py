"""docs/configuration.md is generated from config.py (`python -m scripts.gen_config_docs`) and must not go stale."""

from __future__ import annotations

import dataclasses

import config
from scripts import gen_config_docs as gen
from tests.cli_helpers import run_script
from tests.conftest import ROOT


def test_the_committed_configuration_reference_is_current():
    result = run_script("-m", "scripts.gen_config_docs", "--check")
    assert result.returncode == 0, result.stderr + "\nrun: python -m scripts.gen_config_docs"


def test_every_key_its_help_its_cpu_value_and_its_flags_are_in_the_reference():
    text = gen.render()
    cpu = config.build_config("cpu")
    for section in config.SECTION_NAMES:
        assert f"\n## {section}\n" in text
        for fld in dataclasses.fields(getattr(cpu, section)):
            assert gen._cell(fld.metadata["help"]) in text, f"{section}.{fld.name}"  # a changed help changes the file
    assert "`'embedded:SmolLM2-135M-Instruct'`" in text  # the cpu preset's student, shown where it differs
    assert "`phase4_evaluate.py --num_samples`" in text  # ConfigFlag tables, read from the scripts
    assert "| `beta` | `grpo.kl_coef` |" in text  # FLAT_KEYS


def test_the_check_fails_on_a_stale_file(tmp_path):
    stale = tmp_path / "configuration.md"
    current = (ROOT / "docs" / "configuration.md").read_text()
    stale.write_text(current.replace("Use MBPP only.", "Use MBPP only (edited by hand)."))
    assert stale.read_text() != current
    result = run_script("-m", "scripts.gen_config_docs", "--check", "--output", str(stale))
    assert result.returncode == 1 and "is stale" in result.stderr
