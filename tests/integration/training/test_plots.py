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


def _recorded(monkeypatch, cls, name: str) -> list:
    calls: list = []
    original = getattr(cls, name)

    def record(self, *args, **kwargs):
        calls.append((args, kwargs))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, record)
    return calls


def test_the_evaluation_plot_draws_the_paired_delta_and_names_set_model_and_run(tmp_path: Path, monkeypatch) -> None:
    import matplotlib.axes
    import matplotlib.figure

    results = {
        "model": {"base_model": "embedded:SmolLM2-135M-Instruct", "adapter": "outputs/final_model"},
        "eval_set": {"name": "val", "num_tasks": 14},
        "samples": {"per_task": 8, "total": 112},
        "pass_at_k": {"1": 0.304, "8": 0.5},
        "pass_at_k_ci95": {"1": [0.125, 0.5], "8": [0.3, 0.7]},
        "baseline": {"pass_at_k": {"1": 0.179, "8": 0.43}, "pass_at_k_ci95": {"1": [0.071, 0.295], "8": None}},
        "delta": {"1": 0.125, "8": 0.07},
        "delta_ci95": {"1": [0.009, 0.25], "8": [-0.1, 0.2]},
    }
    (tmp_path / "evaluation_results.json").write_text(json.dumps(results))
    titles = _recorded(monkeypatch, matplotlib.figure.Figure, "suptitle")
    bars = _recorded(monkeypatch, matplotlib.axes.Axes, "errorbar")
    plot_evaluation(tmp_path / "evaluation_results.json", title="my-run")
    # the delta panel: one point with its interval per k (the bars' own interval whiskers are errorbars too)
    [(args, kwargs)] = [(a, kw) for a, kw in bars if kw.get("fmt") == "o"]
    assert list(args[1]) == [0.125, 0.07]
    low, high = kwargs["yerr"]
    assert abs(0.125 - low[0] - 0.009) < 1e-9 and abs(0.125 + high[0] - 0.25) < 1e-9
    [(title, *_), _kw] = titles[0]
    assert "val (14 tasks x 8 samples each)" in title
    assert "embedded:SmolLM2-135M-Instruct + adapter" in title and "run my-run" in title


def test_training_curves_name_model_and_steps_and_warn_of_nothing(tmp_path: Path, monkeypatch) -> None:
    import warnings

    import matplotlib.figure

    (tmp_path / "config.json").write_text(json.dumps({"student": {"model_name": "embedded:tiny-random"}}))
    rows = [{"step": s, "update/skipped": 1.0} for s in (1, 2)]  # nothing any panel draws
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    titles = _recorded(monkeypatch, matplotlib.figure.Figure, "suptitle")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "No artists with labels found to put in legend"
        plot_metrics(tmp_path / "metrics.jsonl", title="my-run")
    [(title, *_), _kw] = titles[0]
    assert "my-run" in title and "embedded:tiny-random" in title and "2 steps (0 updates)" in title


def test_training_curves_tick_whole_steps_and_keep_coinciding_series_visible(tmp_path: Path, monkeypatch) -> None:
    import matplotlib.figure

    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: figures.append(fig))
    zero = {"frac_reward_zero_std": 0.0, "frac_format_only_spread": 0.0, "frac_unscorable": 0.0}
    rows = [{"step": s, "reward/mean": 0.2 + 0.1 * s, **zero, "format/closed_think": 0.0} for s in (1, 2)]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plot_metrics(metrics)
    [fig] = figures
    fig.canvas.draw()
    for ax in fig.axes:
        assert all(float(t).is_integer() for t in ax.get_xticks()), ax.get_xticks()
    signal = next(ax for ax in fig.axes if ax.get_title() == "signal")
    styles = [(line.get_marker(), line.get_linestyle(), line.get_markersize()) for line in signal.get_lines()]
    assert len(styles) == 4 and len(set(styles)) == 4  # four series at 0, each drawn its own way
