"""The teacher-guidance experiment's report, built from its evidence alone (benchmarks/results/teacher_guidance/):
teacher_guidance.json, .md and .png. Any subset of runs gives a report; `complete` says whether every planned run
is in. The statistics are evaluation/seed_contrasts.py's: per contrast the paired t over seeds (primary), in each
held-out stratum, for strict and lenient pass@1."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ablation_seeds_report import counts_per_task, load_evidence, signal_check, taxonomy  # noqa: E402
from experiment_cli import ks_for, write_report_files  # noqa: E402
from teacher_guidance_design import (  # noqa: E402  (benchmarks/ is on sys.path)
    ARMS,
    BASE,
    CONTRASTS,
    DEFAULT_ARMS,
    DEFAULT_SEEDS,
    STRATA,
    no_code_share,
)

RESAMPLES, BOOTSTRAP_SEED = 10_000, 0
LENIENT_COLUMN = 6


def lenient_counts_per_task(run: dict, task_ids: list[str]) -> np.ndarray:
    """Lenient passes (code inside an unclosed think counted) per task, in `task_ids` order; shape (T,)."""
    index = {t: i for i, t in enumerate(task_ids)}
    out = np.zeros(len(task_ids), dtype=np.int64)
    for row in run["samples"]:
        if row[0] in index:
            out[index[row[0]]] += row[LENIENT_COLUMN] if len(row) > LENIENT_COLUMN else row[2]
    return out


def strata_of(task_ids: list[str]) -> dict[str, list[int]]:
    """Task positions per stratum ('all' and each prefix stratum)."""
    out = {"all": list(range(len(task_ids)))}
    out.update({name: [i for i, t in enumerate(task_ids) if t.startswith(prefix)] for name, prefix in STRATA.items()})
    return out


def build_report(evidence: Path, command: str) -> dict:
    from evaluation.pass_at_k import estimate_pass_at_k
    from evaluation.seed_contrasts import analyse

    ev = load_evidence(evidence)
    prepass, recipe = ev["prepass"], ev["recipe"]
    gate = _read(evidence / "gate.json")
    if prepass is None or recipe is None:
        return {"complete": False, "command": command, "gate": gate, "note": "no pre-pass yet: nothing to report"}
    samples = prepass["samples"]
    task_ids = prepass["heldout_set"]
    ks = ks_for(samples)
    runs = {(r["arm"], r["seed"]): r for r in ev["runs"]}
    arms = [a for a in [BASE, *ARMS] if any(arm == a for arm, _ in runs)]
    trained = [a for a in arms if a != BASE]
    contrasts = [c for c in CONTRASTS if c[0] in arms and c[1] in arms]
    strict = {a: {s: counts_per_task(r, task_ids) for (x, s), r in runs.items() if x == a} for a in arms}
    lenient = {a: {s: lenient_counts_per_task(r, task_ids) for (x, s), r in runs.items() if x == a} for a in arms}
    analysis: dict = {}
    for stratum, idx in strata_of(task_ids).items():
        if not idx:
            continue
        analysis[stratum] = {"tasks": len(idx)}
        for verdict, counts in (("strict", strict), ("lenient", lenient)):
            for k in ks if verdict == "strict" else [1]:
                scores = {
                    a: {s: estimate_pass_at_k(samples, c[idx].tolist(), k) for s, c in by_seed.items()}
                    for a, by_seed in counts.items()
                }
                analysis[stratum][f"{verdict}_pass@{k}"] = analyse(
                    scores, contrasts, trained, RESAMPLES, BOOTSTRAP_SEED
                )
    planned = [(a, s) for s in DEFAULT_SEEDS for a in [BASE, *DEFAULT_ARMS]]
    seeds_done = [s for s in sorted({s for _, s in runs}) if all((a, s) in runs for a in [BASE, *DEFAULT_ARMS])]
    signal = {
        f"{arm}-s{seed}": signal_check(r["metrics"])
        for (arm, seed), r in sorted(runs.items())
        if arm != BASE and ARMS[arm].weights.get("grpo_weight", 0) > 0
    }
    return {
        "complete": all(p in runs for p in planned),
        "seeds": sorted({s for _, s in runs}),
        "seeds_done": seeds_done,
        "arms": {a: {"letter": ARMS[a].letter, "label": ARMS[a].label} for a in trained}
        | ({BASE: {"letter": "base", "label": "no training"}} if BASE in arms else {}),
        "command": command,
        "run_commands": sorted({r["command"] for r in ev["runs"] if r.get("command")}),
        "commits": sorted({(r.get("git") or {}).get("commit") or "unknown" for r in ev["runs"]}),
        "load_at_report": list(os.getloadavg()),
        "recipe": recipe,
        "gate": gate,
        "teacher_data": _read(evidence / "teacher_data.json"),
        "population": {
            "split": {k: len(v) for k, v in prepass["split"].items()},
            "training_pool": prepass["training_pool"],
            "heldout_set": task_ids,
            "strata": {name: len(idx) for name, idx in strata_of(task_ids).items()},
            "prepass_counts": prepass["counts"],
            "prepass_samples": samples,
        },
        "primary_endpoint": f"held-out pass@1 from {samples} samples, strict parser; paired t over seeds per contrast",
        "k_values": ks,
        "runs": {
            f"{arm}-s{seed}": {
                "arm": arm,
                "seed": seed,
                "pass_at_k": r["pass_at_k"],
                "lenient_pass@1": float(np.mean(lenient_counts_per_task(r, task_ids) / samples)),
                "no_code": no_code_share(r),
                "no_code_by_stratum": {
                    name: sum(row[3] == "no_code" for row in r["samples"] if row[0].startswith(prefix))
                    / max(sum(row[0].startswith(prefix) for row in r["samples"]), 1)
                    for name, prefix in STRATA.items()
                },
                "train_s": r["train_s"],
                "stages_s": r.get("stages_s"),
                "eval_s": r["eval_s"],
                "load": r["load"],
                "git": r.get("git"),
                "pass_rate": [m.get("pass_rate") for m in r["metrics"]],
            }
            for (arm, seed), r in sorted(runs.items())
        },
        "analysis": analysis,
        "signal": {"runs": signal, "signal_ok": bool(signal) and all(v["ok"] for v in signal.values())},
        "failure_taxonomy": {arm: taxonomy([r for (a, _), r in runs.items() if a == arm]) for arm in arms},
    }


def _read(path: Path):
    import json

    return json.loads(path.read_text()) if path.is_file() else None


def _ci(interval) -> str:
    return f"[{interval[0]:+.3f}, {interval[1]:+.3f}]" if interval else "n/a"


def _name(arm: str) -> str:
    return f"{ARMS[arm].letter} {arm}" if arm in ARMS else arm


def markdown(report: dict) -> str:
    gate = report.get("gate")
    gate_line = "Gate (before any GRPO arm): " + (
        f"seed {gate['seed']}'s {gate['arm']} run, held-out no_code {gate['no_code']:.3f} vs the base's "
        f"{gate['base_no_code']:.3f} + {gate['margin']}: **{'passed' if gate['passed'] else 'FAILED'}**."
        if gate
        else "not decided yet."
    )
    if "analysis" not in report:
        return f"# Teacher guidance\n\n{report['note']}\n\n{gate_line}\n"
    status = "complete" if report["complete"] else f"partial (whole seeds done: {report['seeds_done'] or 'none'})"
    pop = report["population"]
    data = report.get("teacher_data") or {}
    lines = [
        f"# Teacher guidance: does it add to GRPO? ({status})",
        "",
        f"Report: `{report['command']}`; runs from: " + (", ".join(f"`{c}`" for c in report["run_commands"]) or "n/a"),
        f"at commit(s) {', '.join(report['commits']) or 'n/a'}; load at report time "
        + ", ".join(f"{x:.1f}" for x in report["load_at_report"])
        + " (per run: in the json).",
        "",
        f"Population: the embedded fixtures split {pop['split']['train']} training / {pop['split']['heldout']} held "
        f"out; GRPO pool {len(pop['training_pool'])} tasks; teacher data: code-only references of "
        f"{len(data.get('tasks', []))} training tasks ({data.get('traces', 'n/a')} traces); held-out set "
        f"{len(pop['heldout_set'])} tasks, strata " + ", ".join(f"{k} {v}" for k, v in pop["strata"].items()) + ".",
        "",
        gate_line,
        "",
        f"Primary endpoint: {report['primary_endpoint']}.",
        "",
        "## Arms (mean over seeds)",
        "",
        "| arm | seeds | strict pass@1 | lenient pass@1 | no_code | MBPP-format pass@1 | APPS-format pass@1 | "
        f"pass@{report['k_values'][-1]} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    analysis = report["analysis"]
    last_k = f"strict_pass@{report['k_values'][-1]}"
    for arm in report["arms"]:
        row = analysis["all"]["strict_pass@1"]["arms"].get(arm)
        if row is None:
            continue
        runs = [r for r in report["runs"].values() if r["arm"] == arm]

        def mean_of(stratum: str, key: str, arm: str = arm) -> str:
            a = analysis.get(stratum, {}).get(key, {}).get("arms", {}).get(arm)
            return f"{a['mean']:.3f}" if a else "n/a"

        lines.append(
            f"| {_name(arm)} ({report['arms'][arm]['label']}) | {len(row['per_seed'])} | {row['mean']:.3f} | "
            f"{mean_of('all', 'lenient_pass@1')} | {np.mean([r['no_code'] for r in runs]):.3f} | "
            f"{mean_of('mbpp_format', 'strict_pass@1')} | {mean_of('apps_format', 'strict_pass@1')} | "
            f"{mean_of('all', last_k)} |"
        )
    lines += [
        "",
        "## Pre-registered contrasts (Delta = mean over seeds of the paired per-seed difference; 95% CI: paired t "
        "over seeds, df = seeds - 1)",
        "",
        "| contrast | stratum | verdict | Delta | per seed | paired t 95% CI | seed + task 95% CI | crossed bootstrap "
        "| two-way (secondary) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for stratum, block in analysis.items():
        for verdict in ("strict_pass@1", "lenient_pass@1"):
            for name, c in block[verdict]["contrasts"].items():
                a, b = name.split(" - ")
                tt = c.get("task_term")
                lines.append(
                    f"| {_name(a)} − {_name(b)} | {stratum} ({block['tasks']}) | {verdict.split('_')[0]} | "
                    f"{c['delta']:+.3f} | {', '.join(f'{v:+.3f}' for v in c['per_seed'])} | {_ci(c['ci95'])} | "
                    f"{_ci(tt['ci95']) if tt else 'n/a'} | {_ci(c['ci95_bootstrap'])} | {_ci(c['ci95_two_way'])} |"
                )
    p1 = analysis["all"]["strict_pass@1"]
    ratio = p1.get("seed_sd_ratio")
    lines += [
        "",
        "Two-way model (secondary): residual SD "
        + (f"{p1['residual_sd']:.3f} (df {p1['df']})" if p1["residual_sd"] is not None else "n/a")
        + "; largest / smallest seed SD among the trained arms "
        + (f"{ratio:.1f}" if ratio is not None else "n/a")
        + " (a large ratio: one arm's variance sets every two-way interval; read the paired t).",
        "",
        "## Signal check (GRPO runs)",
        "",
        "| run | median flat-group share | mean training pass rate | ok |",
        "|---|---|---|---|",
    ]
    for run, s in report["signal"]["runs"].items():
        flat = f"{s['median_flat_share']:.2f}" if s["median_flat_share"] is not None else "n/a"
        rate = f"{s['mean_pass_rate']:.2f}" if s["mean_pass_rate"] is not None else "n/a"
        lines.append(f"| {run} | {flat} | {rate} | {'yes' if s['ok'] else 'NO'} |")
    lines += [
        "",
        "## Runs",
        "",
        "| run | strict pass@1 | lenient pass@1 | no_code | no_code MBPP / APPS | train s | eval s | load start |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, r in report["runs"].items():
        strata = r["no_code_by_stratum"]
        lines.append(
            f"| {key} | {r['pass_at_k']['1']:.3f} | {r['lenient_pass@1']:.3f} | {r['no_code']:.3f} | "
            f"{strata.get('mbpp_format', 0):.2f} / {strata.get('apps_format', 0):.2f} | {r['train_s']:.0f} | "
            f"{r['eval_s']:.0f} | {r['load']['start'][0]:.1f} |"
        )
    lines += [
        "",
        "## What this can and cannot show",
        "",
        "Every interval is conditional on these held-out fixture tasks, this 135M student and this recipe; the "
        "seed + task column adds the task-sampling term for a claim over tasks like these. An interval straddling "
        "0 is 'not shown', not 'no effect'. Nothing here speaks to MBPP/HumanEval difficulty or the GPU preset.",
        "",
    ]
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    analysis = report["analysis"]
    strata = [s for s in ("all", "mbpp_format", "apps_format") if s in analysis]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    left, right = axes
    arms = list(analysis["all"]["strict_pass@1"]["arms"])
    for x, arm in enumerate(arms):
        for offset, stratum, color in zip((-0.2, 0.0, 0.2), strata, ("black", "#6baed6", "#fd8d3c"), strict=False):
            row = analysis[stratum]["strict_pass@1"]["arms"].get(arm)
            if row is None:
                continue
            values = list(row["per_seed"].values())
            left.scatter([x + offset] * len(values), values, color=color, s=10, alpha=0.6)
            left.scatter([x + offset], [row["mean"]], color=color, marker="D", label=stratum if x == 0 else None)
    left.set_xticks(range(len(arms)), [_name(a) for a in arms], rotation=20, fontsize=8)
    left.set_ylim(bottom=0)
    left.set_ylabel("held-out pass@1 (strict)")
    left.legend(fontsize=7)
    left.set_title("dots: seeds; diamonds: means", fontsize=8)
    rows = [
        (f"{name} ({stratum})", c)
        for stratum in strata
        for name, c in analysis[stratum]["strict_pass@1"]["contrasts"].items()
    ]
    for y, (_, c) in enumerate(rows):
        if c["ci95"]:
            right.plot(c["ci95"], [y, y], color="black")
        right.scatter([c["delta"]], [y], color="#fd8d3c", zorder=3)
    right.axvline(0, color="#999999", lw=0.8)
    right.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=7)
    right.set_xlabel("Delta pass@1 (95% CI, paired t over seeds)")
    fig.suptitle("Teacher guidance" + ("" if report["complete"] else " (partial)"), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(report: dict, results_dir: Path) -> list[Path]:
    return write_report_files(report, results_dir, "teacher_guidance", markdown, plot, plotted="analysis" in report)
