"""The experiments' priority: nice orders processes only inside a session when the kernel's autogroup scheduling
is on, so a niced runner says so instead of taking an equal share of the cores unannounced."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from experiments import frame


@pytest.mark.parametrize(("text", "on"), [("1\n", True), ("0\n", False)])
def test_the_autogroup_switch_is_read_from_the_kernel_file(tmp_path: Path, text: str, on: bool) -> None:
    switch = tmp_path / "sched_autogroup_enabled"
    switch.write_text(text)
    assert frame.autogroup_scheduling(switch) is on


def test_a_machine_without_the_switch_has_no_autogroup(tmp_path: Path) -> None:
    assert frame.autogroup_scheduling(tmp_path / "absent") is False


def test_lowering_the_priority_names_autogroup_when_it_is_on(monkeypatch, capsys) -> None:
    monkeypatch.setattr(frame, "autogroup_scheduling", lambda: True)
    monkeypatch.setattr(os, "nice", lambda increment: 19)
    frame.lower_priority(19)
    out = capsys.readouterr().out
    assert "autogroup" in out and "/proc/self/autogroup" in out


def test_lowering_the_priority_is_quiet_without_autogroup(monkeypatch, capsys) -> None:
    monkeypatch.setattr(frame, "autogroup_scheduling", lambda: False)
    monkeypatch.setattr(os, "nice", lambda increment: 19)
    frame.lower_priority(19)
    assert capsys.readouterr().out == ""
