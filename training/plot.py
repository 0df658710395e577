"""Training curves from outputs/metrics.jsonl.  `python -m training.plot outputs/metrics.jsonl [--out PNG]`"""

from __future__ import annotations

import argparse
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


def plot_metrics(metrics_path: str | Path, out_path: str | Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    rows = read_jsonl(metrics_path, tolerate_torn_tail=True)  # a run may still be appending to it
    out = Path(out_path) if out_path else Path(metrics_path).with_name("training_curves.png")
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), constrained_layout=True)
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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Plot training curves from a metrics.jsonl file.")
    parser.add_argument("metrics", help="outputs/metrics.jsonl")
    parser.add_argument("--out", help="PNG path (default: training_curves.png beside the metrics file)")
    args = parser.parse_args()
    print(f"wrote {plot_metrics(args.metrics, args.out)}")
