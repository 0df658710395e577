"""Training curves from outputs/metrics.jsonl.  `python -m training.plot outputs/metrics.jsonl [--out PNG]`

Also the evaluation plot (`plot_evaluation`): pass@k of the adapter and the base model with their 95% intervals,
from phase 4's evaluation_results.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

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


def plot_metrics(metrics_path: str | Path, out_path: str | Path | None = None, title: str | None = None) -> Path:
    """The four panels, titled with the run name (`title`; default: the metrics file's folder name)."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    rows = read_jsonl(metrics_path, tolerate_torn_tail=True)  # a run may still be appending to it
    out = Path(out_path) if out_path else Path(metrics_path).with_name("training_curves.png")
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), constrained_layout=True)
    fig.suptitle(f"training: {title or Path(metrics_path).resolve().parent.name}")
    for ax, (title, keys) in zip(axes.flat, PANELS, strict=True):
        for key in keys:
            points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", markersize=2, label=key)
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_evaluation(results_path: str | Path, out_path: str | Path | None = None, title: str | None = None) -> Path:
    """pass@k of the adapter and (when evaluated) the base model, with 95% interval bars, as
    evaluation_pass_at_k.png beside the results file (default)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = json.loads(Path(results_path).read_text())
    out = Path(out_path) if out_path else Path(results_path).with_name("evaluation_pass_at_k.png")
    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
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
    ax.set_ylabel("pass@k (95% interval)")
    ax.set_title(f"evaluation: {title or Path(results_path).resolve().parent.name}")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Plot training curves from a metrics.jsonl file.")
    parser.add_argument("metrics", help="outputs/metrics.jsonl")
    parser.add_argument("--out", help="PNG path (default: training_curves.png beside the metrics file)")
    args = parser.parse_args()
    print(f"wrote {plot_metrics(args.metrics, args.out)}")
