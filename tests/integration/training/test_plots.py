"""training/plot.py: the titled training curves and the evaluation plot (adapter vs base pass@k)."""

from __future__ import annotations

import json
from pathlib import Path

from training.plot import plot_evaluation, plot_metrics
from training.run_summary import main as run_summary

PNG = b"\x89PNG"


def test_training_curves_carry_the_run_name(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss/total": 1.0}) + "\n")
    import matplotlib.figure

    titles: list[str] = []
    original = matplotlib.figure.Figure.suptitle

    def suptitle(self, t, **kw):
        titles.append(t)
        return original(self, t, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle", suptitle)
    out = plot_metrics(tmp_path / "metrics.jsonl", title="my-run")
    assert out.read_bytes().startswith(PNG)
    assert titles and "my-run" in titles[0]


def test_evaluation_plot_beside_the_curves(tmp_path: Path) -> None:
    results = {
        "model": {"base_model": "base"},
        "pass_at_k": {"1": 0.32, "8": 0.5},
        "pass_at_k_ci95": {"1": [0.125, 0.545], "8": None},
        "baseline": {"pass_at_k": {"1": 0.18, "8": 0.5}, "pass_at_k_ci95": {"1": [0.07, 0.3], "8": [0.3, 0.7]}},
    }
    (tmp_path / "evaluation_results.json").write_text(json.dumps(results))
    out = plot_evaluation(tmp_path / "evaluation_results.json", title="my-run")
    assert out == tmp_path / "evaluation_pass_at_k.png"
    assert out.read_bytes().startswith(PNG)


def test_the_run_summary_writes_the_evaluation_plot(tmp_path: Path) -> None:
    (tmp_path / "evaluation_results.json").write_text(json.dumps({"pass_at_k": {"1": 0.2}}))
    run_summary(["--data_dir", str(tmp_path), "--output_dir", str(tmp_path)])
    assert (tmp_path / "evaluation_pass_at_k.png").exists()
