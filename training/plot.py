"""Training curves from outputs/metrics.jsonl.  `python -m training.plot outputs/metrics.jsonl [--out PNG]`

Also the evaluation plot (`plot_evaluation`): pass@k of the adapter and the base model with their 95% intervals,
and the paired adapter − base delta with its interval, from phase 4's evaluation_results.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from utils.jsonl import read_jsonl

PANELS = (
    ("reward", ("reward/mean", "pass_rate", "pass_fraction/mean")),
    ("losses", ("loss/total", "loss/grpo", "loss/kl", "loss/teacher_sft", "loss/self_sft")),
    ("policy drift", ("kl", "clip_ratio/low_mean", "clip_ratio/high_mean")),
    (
        "signal",
        (
            "frac_reward_zero_std",
            "frac_format_only_spread",
            "frac_unscorable",
            "completion/clipped_ratio",
            "format/closed_think",
        ),
    ),
)


def training_title(rows: list[dict], metrics_path: Path, run_name: str | None) -> str:
    """'training: <run> — <model>, <N> steps (<U> updates)': the model from the run's config.json beside the metrics
    (when there is one), the steps and updates from the rows."""
    parts = [f"training: {run_name or metrics_path.resolve().parent.name}"]
    try:
        model = json.loads(metrics_path.with_name("config.json").read_text())["student"]["model_name"]
        parts.append(str(model))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    steps = [r["step"] for r in rows if isinstance(r.get("step"), int)]
    if steps:
        skipped = sum(1 for r in rows if r.get("update/skipped") == 1.0)
        parts.append(f"{max(steps)} steps" + (f" ({len(rows) - skipped} updates)" if skipped else ""))
    return " — ".join(parts[:1]) + (" — " + ", ".join(parts[1:]) if parts[1:] else "")


def plot_metrics(metrics_path: str | Path, out_path: str | Path | None = None, title: str | None = None) -> Path:
    """The four panels, titled with the run name (`title`; default: the metrics file's folder name), the model and
    the step count."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    rows = read_jsonl(metrics_path, tolerate_torn_tail=True)  # a run may still be appending to it
    out = Path(out_path) if out_path else Path(metrics_path).with_name("training_curves.png")
    fig = metrics_figure(rows, training_title(rows, Path(metrics_path), title))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


# Within a panel each series gets its own marker and line style, larger first, so series that coincide (several
# shares at 0) stay visible as nested markers instead of hiding under the last one drawn.
SERIES_STYLES = (("o", "-", 7), ("s", "--", 5.5), ("^", ":", 4.5), ("D", "-.", 3.5), ("x", "-", 5), ("v", "--", 3))


def metrics_figure(rows: list[dict], suptitle: str) -> Any:
    """The four panels of `rows` (metrics.jsonl's step rows), x axis in whole optimizer steps."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), constrained_layout=True)
    fig.suptitle(suptitle)
    for ax, (panel, keys) in zip(axes.flat, PANELS, strict=True):
        drawn = 0
        for key in keys:
            points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            if points:
                marker, line, size = SERIES_STYLES[drawn % len(SERIES_STYLES)]
                ax.plot(*zip(*points, strict=True), marker=marker, linestyle=line, markersize=size, label=key,
                        markerfacecolor="none" if drawn else None)  # fmt: skip
                drawn += 1
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        ax.set_title(panel)
        ax.set_xlabel("optimizer step")
        if ax.get_legend_handles_labels()[0]:  # a panel with nothing logged has no legend (and no warning)
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not logged in this run", ha="center", va="center", transform=ax.transAxes)
        ax.grid(alpha=0.3)
    return fig


def evaluation_title(results: dict, results_path: Path, run_name: str | None) -> str:
    """'<eval set> (<T> tasks x <n> samples) — <model> — run <run>': what was evaluated, on what, from which run."""
    eval_set = results.get("eval_set") or {}
    samples = results.get("samples") or {}
    model = results.get("model") or {}
    shown = f"{model.get('base_model', '?')}" + (" + adapter" if model.get("adapter") else "")
    what = str(eval_set.get("name") or results.get("eval_file") or "evaluation")
    size = []
    if eval_set.get("num_tasks") is not None:
        size.append(f"{eval_set['num_tasks']} tasks")
    if samples.get("per_task") is not None:
        size.append(f"{samples['per_task']} samples each")
    return (
        f"{what}"
        + (f" ({' x '.join(size)})" if size else "")
        + f" — {shown} — run {run_name or results_path.resolve().parent.name}"
    )


def plot_evaluation(results_path: str | Path, out_path: str | Path | None = None, title: str | None = None) -> Path:
    """pass@k of the adapter and (when evaluated) the base model, with 95% interval bars, and beside them what the
    run found: the paired adapter − base delta per k with its 95% interval (the per-model intervals overlap even
    when the paired one excludes 0); titled with the eval set, the model and the run. As evaluation_pass_at_k.png
    beside the results file (default)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = json.loads(Path(results_path).read_text())
    out = Path(out_path) if out_path else Path(results_path).with_name("evaluation_pass_at_k.png")
    deltas = {k: v for k, v in (results.get("delta") or {}).items() if v is not None}
    fig, axes = plt.subplots(1, 2 if deltas else 1, figsize=(11 if deltas else 6, 4), constrained_layout=True)
    ax = axes[0] if deltas else axes
    roles = [("adapter", results)] + ([("base", results["baseline"])] if results.get("baseline") else [])
    width = 0.8 / len(roles)
    for i, (name, summary) in enumerate(roles):
        ks = [k for k, v in summary.get("pass_at_k", {}).items() if v is not None]
        values = [summary["pass_at_k"][k] for k in ks]
        errors = [[0.0] * len(ks), [0.0] * len(ks)]
        for j, k in enumerate(ks):
            ci = (summary.get("pass_at_k_ci95") or {}).get(k)
            if isinstance(ci, list) and len(ci) == 2:
                errors[0][j], errors[1][j] = values[j] - ci[0], ci[1] - values[j]
        positions = [j + i * width for j in range(len(ks))]
        ax.bar(positions, values, width, yerr=errors, capsize=4, label=name)
        ax.set_xticks([j + width * (len(roles) - 1) / 2 for j in range(len(ks))], [f"pass@{k}" for k in ks])
    ax.set_ylim(0, 1)
    ax.set_ylabel("pass@k (95% interval over tasks)")
    ax.set_title("each model")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    ax.grid(axis="y", alpha=0.3)
    if deltas:
        right = axes[1]
        ks = list(deltas)
        values = [float(deltas[k]) for k in ks]
        errors = [[0.0] * len(ks), [0.0] * len(ks)]
        for j, k in enumerate(ks):
            ci = (results.get("delta_ci95") or {}).get(k)
            if isinstance(ci, list) and len(ci) == 2:
                errors[0][j], errors[1][j] = values[j] - ci[0], ci[1] - values[j]
        right.errorbar(range(len(ks)), values, yerr=errors, fmt="o", capsize=5, color="black")
        right.axhline(0.0, color="grey", linewidth=1)
        right.set_xticks(range(len(ks)), [f"pass@{k}" for k in ks])
        right.set_ylabel("adapter − base (paired, 95% interval)")
        right.set_title("what training changed")
        right.grid(axis="y", alpha=0.3)
    fig.suptitle(evaluation_title(results, Path(results_path), title))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Plot training curves from a metrics.jsonl file.")
    parser.add_argument("metrics", help="outputs/metrics.jsonl")
    parser.add_argument("--out", help="PNG path (default: training_curves.png beside the metrics file)")
    args = parser.parse_args()
    print(f"wrote {plot_metrics(args.metrics, args.out)}")
