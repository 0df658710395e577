"""The seeded ablation's report, built from its committed evidence alone (the recorded run's:
benchmarks/results/ablation_seeds/): ablation_seeds.json, .md and .png. Any subset of runs gives a report;
`complete` says whether every planned run is in. The statistics are evaluation/seed_contrasts.py's."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path

import numpy as np

from experiments.ablation_seeds.design import (
    ARMS,
    BASE,
    CONTRASTS,
    DEFAULT_ARMS,
    DEFAULT_SEEDS,
    teacher_check,
)
from experiments.frame import ks_for, write_report_files

# The signal check: GRPO learns only from groups with correctness spread.
MAX_FLAT_SHARE = 0.5
PASS_RATE_BAND = (0.1, 0.7)
STATUS_CLASSES = ("passed", "no_code", "syntax_error", "runtime_error", "wrong_answer", "timeout", "other")
RESAMPLES, BOOTSTRAP_SEED = 10_000, 0


def load_evidence(evidence: Path) -> dict:
    def read(path: Path):
        return json.loads(path.read_text()) if path.is_file() else None

    runs = [json.loads(p.read_text()) for p in sorted((evidence / "runs").glob("*.json"))]
    return {
        "recipe": read(evidence / "recipe.json"),
        "prepass": read(evidence / "prepass.json"),
        "teacher": read(evidence / "teacher.json"),
        "runs": runs,
    }


def counts_per_task(run: dict, task_ids: list[str]) -> np.ndarray:
    """Passing samples per held-out task, in `task_ids` order; shape (T,)."""
    passes: Counter[str] = Counter()
    for task_id, _, passed, *_ in run["samples"]:
        passes[task_id] += passed
    return np.array([passes[t] for t in task_ids], dtype=np.int64)


def signal_check(metrics: list[dict]) -> dict:
    """Median share of flat groups and mean training pass rate of one GRPO run, against the thresholds."""
    flat = [m["frac_reward_zero_std"] for m in metrics if m.get("frac_reward_zero_std") is not None]
    rate = [m["pass_rate"] for m in metrics if m.get("pass_rate") is not None]
    median_flat = statistics.median(flat) if flat else None
    mean_rate = statistics.fmean(rate) if rate else None
    ok = (
        median_flat is not None
        and mean_rate is not None
        and median_flat <= MAX_FLAT_SHARE
        and PASS_RATE_BAND[0] <= mean_rate <= PASS_RATE_BAND[1]
    )
    return {"median_flat_share": median_flat, "mean_pass_rate": mean_rate, "ok": ok}


def taxonomy(runs: list[dict]) -> dict:
    """Share of each sandbox status among all samples of these runs, the truncated share, mean tokens, and the share
    passing strict and sanitized (None where the evidence predates the sanitized column, the 8th)."""
    rows = [r for run in runs for r in run["samples"]]
    status = Counter(r[3] if r[3] in STATUS_CLASSES else "other" for r in rows)
    n = max(len(rows), 1)
    graded = [r[7] for r in rows if len(r) > 7]
    return {
        **{s: status[s] / n for s in STATUS_CLASSES},
        "passed": sum(bool(r[2]) for r in rows) / n,
        "sanitized_passed": sum(map(bool, graded)) / len(graded) if rows and len(graded) == len(rows) else None,
        "truncated": sum(r[4] == "length" for r in rows) / n,
        "truncated_among_failures": sum(r[4] == "length" for r in rows if not r[2])
        / max(sum(not r[2] for r in rows), 1),
        "mean_tokens": float(np.mean([r[5] for r in rows])) if rows else None,
        "samples": len(rows),
    }


def build_report(evidence: Path, command: str) -> dict:
    from evaluation.pass_at_k import estimate_pass_at_k
    from evaluation.seed_contrasts import analyse

    ev = load_evidence(evidence)
    prepass, recipe = ev["prepass"], ev["recipe"]
    if prepass is None or recipe is None:
        return {"complete": False, "command": command, "note": "no pre-pass yet: nothing to report"}
    samples = prepass["samples"]
    task_ids = prepass["heldout_set"]
    ks = ks_for(samples)
    runs = {(r["arm"], r["seed"]): r for r in ev["runs"]}
    arms = [a for a in [*ARMS, BASE] if any(arm == a for arm, _ in runs)]
    counts = {arm: {seed: counts_per_task(r, task_ids) for (a, seed), r in runs.items() if a == arm} for arm in arms}
    trained = [a for a in arms if a != BASE]
    contrasts = [c for c in CONTRASTS if c[0] in arms and c[1] in arms]
    contrasts += [(a, BASE) for a in trained if BASE in arms]
    by_k = {}
    for k in ks:
        scores = {
            arm: {seed: estimate_pass_at_k(samples, c.tolist(), k) for seed, c in by_seed.items()}
            for arm, by_seed in counts.items()
        }
        by_k[str(k)] = analyse(scores, contrasts, trained, RESAMPLES, BOOTSTRAP_SEED)
    # the review's subgroup: the APPS-format held-out tasks are all at 0 for the base, so the MBPP-format ones
    # carry most of the signal; reported beside the primary endpoint, not instead of it
    mbpp = [i for i, t in enumerate(task_ids) if t.startswith("mbpp")]
    mbpp_format = (
        analyse(
            {arm: {seed: c[mbpp] / samples for seed, c in by_seed.items()} for arm, by_seed in counts.items()},
            contrasts,
            trained,
            RESAMPLES,
            BOOTSTRAP_SEED,
        )
        if mbpp
        else None
    )
    signal = {
        f"{arm}-s{seed}": signal_check(r["metrics"])
        for (arm, seed), r in sorted(runs.items())
        if arm != BASE and ARMS[arm].weights.get("grpo_weight", 0) > 0
    }
    planned = [(a, s) for s in DEFAULT_SEEDS for a in [*DEFAULT_ARMS, BASE]]
    seeds_done = [s for s in sorted({s for _, s in runs}) if all((a, s) in runs for a in [*DEFAULT_ARMS, BASE])]
    teacher = ev["teacher"]
    teacher_gate = None
    if teacher is not None:
        base_run = runs.get((BASE, teacher["seed"]))
        teacher_gate = {"seed": teacher["seed"]}
        if base_run:
            teacher_gate |= teacher_check(teacher, base_run)
            teacher_gate["teacher_beats_base"] = teacher_gate["teacher_pass@1"] > teacher_gate["base_pass@1"]
        else:
            teacher_gate["teacher_pass@1"] = float(np.mean(counts_per_task(teacher, task_ids) / samples))
    return {
        "complete": all(p in runs for p in planned),
        "seeds_done": seeds_done,
        "command": command,
        "run_commands": sorted({r["command"] for r in ev["runs"] if r.get("command")}),
        "recipe": recipe,
        "population": {
            "split": {k: len(v) for k, v in prepass["split"].items()},
            "training_pool": prepass["training_pool"],
            "heldout_set": task_ids,
            "prepass_counts": prepass["counts"],
            "prepass_samples": samples,
            "prepass_seed": prepass["seed"],
        },
        "primary_endpoint": f"held-out pass@1 from {samples} samples",
        "k_values": ks,
        "runs": {
            f"{arm}-s{seed}": {
                "arm": arm,
                "seed": seed,
                "pass_at_k": r["pass_at_k"],
                "train_s": r["train_s"],
                "eval_s": r["eval_s"],
                "load": r["load"],
                "resumed_from_checkpoint": r.get("resumed_from_checkpoint", False),
                "pass_rate": [m.get("pass_rate") for m in r["metrics"]],
                "frac_reward_zero_std": [m.get("frac_reward_zero_std") for m in r["metrics"]],
            }
            for (arm, seed), r in sorted(runs.items())
        },
        "pass_at_k": by_k,
        "pass_at_1_mbpp_format": {"tasks": len(mbpp), **mbpp_format} if mbpp_format else None,
        "signal": {"runs": signal, "signal_ok": bool(signal) and all(v["ok"] for v in signal.values())},
        "failure_taxonomy": {arm: taxonomy([r for (a, _), r in runs.items() if a == arm]) for arm in arms},
        "teacher": teacher_gate,
    }


def _ci(interval) -> str:
    return f"[{interval[0]:+.3f}, {interval[1]:+.3f}]" if interval else "n/a"


def markdown(report: dict) -> str:
    if "pass_at_k" not in report:
        return f"# Seeded ablation\n\n{report['note']}\n"
    p1 = report["pass_at_k"]["1"]
    pop = report["population"]
    status = "complete" if report["complete"] else f"partial (whole seeds done: {report['seeds_done'] or 'none'})"
    lines = [
        f"# Seeded ablation of the objective's terms: {report['primary_endpoint']} ({status})",
        "",
        f"Report: `{report['command']}`; runs from: " + (", ".join(f"`{c}`" for c in report["run_commands"]) or "n/a"),
        "",
        f"Population: the embedded fixtures split {pop['split']['train']} training / {pop['split']['heldout']} held "
        f"out; training pool {len(pop['training_pool'])} tasks (base passes 1 .. {pop['prepass_samples'] - 1} of "
        f"{pop['prepass_samples']} in the pre-pass, seed {pop['prepass_seed']}); held-out set "
        f"{len(pop['heldout_set'])} tasks (base below all-pass).",
        "",
    ]
    if not report["signal"]["signal_ok"]:
        lines += [
            "**SIGNAL CHECK FAILED: raise G before reading these results.** A GRPO run had a median share of flat "
            f"groups above {MAX_FLAT_SHARE} or a training pass rate outside {list(PASS_RATE_BAND)}.",
            "",
        ]
    lines += [
        "## Arms (pass@1, mean over seeds; per seed; SD over seeds)",
        "",
        "| arm | mean | per seed | seed SD | " + " | ".join(f"pass@{k}" for k in report["k_values"][1:]) + " |",
        "|---|---|---|---|" + "---|" * len(report["k_values"][1:]),
    ]
    for arm, row in p1["arms"].items():
        per_seed = ", ".join(f"s{s} {v:.3f}" for s, v in row["per_seed"].items())
        sd = f"{row['seed_sd']:.3f}" if row["seed_sd"] is not None else "n/a"
        others = [f"{report['pass_at_k'][str(k)]['arms'][arm]['mean']:.3f}" for k in report["k_values"][1:]]
        label = ARMS[arm].label if arm in ARMS else "no training"
        lines.append(f"| {arm} ({label}) | {row['mean']:.3f} | {per_seed} | {sd} | " + " | ".join(others) + " |")
    sd = p1["residual_sd"]
    lines += [
        "",
        "Residual SD of a run mean in the two-way (arm + seed) model over the trained arms: "
        + (f"{sd:.3f} (df {p1['df']})." if sd is not None else "not estimable yet (needs >= 2 arms and >= 2 seeds)."),
        "",
        "## Contrasts (pass@1; Delta = mean over seeds of the paired per-seed difference)",
        "",
        "| contrast | Delta | per seed | 95% CI, paired t over seeds (primary) | seed + task 95% CI | two-way model "
        "(t, pooled) | crossed bootstrap | seeds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, c in p1["contrasts"].items():
        per_seed = ", ".join(f"{v:+.3f}" for v in c["per_seed"])
        task = c.get("task_term")
        lines.append(
            f"| {name} | {c['delta']:+.3f} | {per_seed} | {_ci(c['ci95'])} | {_ci(task['ci95']) if task else 'n/a'} | "
            f"{_ci(c['ci95_two_way'])} | {_ci(c['ci95_bootstrap'])} | {len(c['seeds'])} |"
        )
    ratio = p1.get("seed_sd_ratio")
    if ratio is not None:
        lines += [
            "",
            f"Largest / smallest seed SD among the trained arms: {ratio:.1f} (the two-way model pools one variance; "
            "a large ratio means one arm sets every two-way interval: read the paired t).",
        ]
    lines += ["", "Secondary, pass@k (paired t 95% CI):", ""]
    for k in report["k_values"][1:]:
        cs = report["pass_at_k"][str(k)]["contrasts"]
        lines.append(f"- pass@{k}: " + "; ".join(f"{n} {c['delta']:+.3f} {_ci(c['ci95'])}" for n, c in cs.items()))
    sub = report.get("pass_at_1_mbpp_format")
    if sub:
        lines += ["", f"Subgroup, the {sub['tasks']} MBPP-format held-out tasks (pass@1, paired t 95% CI):", ""]
        lines.append("- " + "; ".join(f"{n} {c['delta']:+.3f} {_ci(c['ci95'])}" for n, c in sub["contrasts"].items()))
    lines += ["", "## Signal check (GRPO arms)", "", "| run | median flat-group share | mean training pass rate | ok |"]
    lines += ["|---|---|---|---|"]
    for run, s in report["signal"]["runs"].items():
        flat = f"{s['median_flat_share']:.2f}" if s["median_flat_share"] is not None else "n/a"
        rate = f"{s['mean_pass_rate']:.2f}" if s["mean_pass_rate"] is not None else "n/a"
        lines.append(f"| {run} | {flat} | {rate} | {'yes' if s['ok'] else 'NO'} |")
    lines += [
        "",
        "## Failure taxonomy (share of all held-out samples, over seeds)",
        "",
        "| arm | passed, strict / sanitized | "
        + " | ".join(STATUS_CLASSES)
        + " | truncated | truncated among failures | mean tokens |",
        "|---|" + "---|" * (len(STATUS_CLASSES) + 4),
    ]
    for arm, t in report["failure_taxonomy"].items():
        sanitized = f"{t['sanitized_passed']:.2f}" if t.get("sanitized_passed") is not None else "n/a"
        lines.append(
            f"| {arm} | {t.get('passed', 0.0):.2f} / {sanitized} | "
            + " | ".join(f"{t[s]:.2f}" for s in STATUS_CLASSES)
            + f" | {t['truncated']:.2f} | {t['truncated_among_failures']:.2f} | "
            + (f"{t['mean_tokens']:.0f}" if t["mean_tokens"] is not None else "n/a")
            + " |"
        )
    if report["teacher"]:
        t = report["teacher"]
        if "base_pass@1" not in t:
            line = f"pass@1 {t['teacher_pass@1']:.3f}; the base of its seed is not evaluated yet"
        else:
            line = (
                f"pass@1 {t['teacher_pass@1']:.3f} vs the base {t['base_pass@1']:.3f}, no_code "
                f"{t['teacher_no_code']:.3f} vs {t['base_no_code']:.3f}: the gate "
                + ("passes" if t["passed"] else "**fails** (an OPD teacher must beat the base with its format intact)")
            )
        lines += ["", f"OPD teacher on the held-out set (seed {t['seed']}'s evaluation streams): {line}."]
    arms = list(p1["per_problem"])
    lines += [
        "",
        "## Per problem (pass@1 averaged over seeds)",
        "",
        "| task | pre-pass | " + " | ".join(arms) + " |",
        "|---|---|" + "---|" * len(arms),
    ]
    for i, task in enumerate(pop["heldout_set"]):
        lines.append(
            f"| {task} | {pop['prepass_counts'][task]}/{pop['prepass_samples']} | "
            + " | ".join(f"{p1['per_problem'][a][i]:.2f}" for a in arms)
            + " |"
        )
    lines += [
        "",
        "## What this population can and cannot show",
        "",
        "Every claim is conditional on these fixture tasks: short MBPP- and APPS-format problems at the difficulty "
        "where the 135M student passes some samples, one seeded split of 71 tasks. The intervals include "
        "between-seed variance (training seed: LoRA init, data order, rollouts), so a contrast whose interval "
        "excludes 0 says the term changes held-out pass@1 on *these* held-out tasks for this student and recipe. "
        "They cannot show transfer to MBPP/HumanEval difficulty, to the GPU preset's larger student, or to another "
        "draw of tasks (the split is fixed, so task-sampling variance is not in the interval). With three seeds a "
        "term worth less than roughly 10 points is not resolvable; an interval straddling 0 is 'not shown', not "
        "'no effect'.",
        "",
        "Wall time and machine load per run: in the json (`runs`).",
        "",
    ]
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p1 = report["pass_at_k"]["1"]
    arms = list(p1["arms"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for x, arm in enumerate(arms):
        row = p1["arms"][arm]
        values = list(row["per_seed"].values())
        left.scatter([x] * len(values), values, color="#6baed6", zorder=3, s=18)
        ci = row["ci95_over_seeds"]
        err = [[row["mean"] - ci[0]], [ci[1] - row["mean"]]] if ci else None
        left.errorbar([x], [row["mean"]], yerr=err, fmt="D", color="black", capsize=5, zorder=4)
    left.set_xticks(range(len(arms)), arms, rotation=20)
    left.set_ylim(bottom=0)
    left.set_ylabel("held-out pass@1")
    left.set_title("dots: seeds; diamond: mean, 95% t interval over seeds", fontsize=8)
    names = list(p1["contrasts"])
    for y, name in enumerate(names):
        c = p1["contrasts"][name]
        ci = c["ci95"]
        if ci:
            right.plot(ci, [y, y], color="black")
        right.scatter([c["delta"]], [y], color="#fd8d3c", zorder=3)
    right.axvline(0, color="#999999", lw=0.8)
    right.set_yticks(range(len(names)), names, fontsize=8)
    right.set_xlabel("Delta pass@1 (95% CI, paired t over seeds)")
    fig.suptitle("Seeded ablation" + ("" if report["complete"] else " (partial)"), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(report: dict, results_dir: Path) -> list[Path]:
    return write_report_files(report, results_dir, "ablation_seeds", markdown, plot, plotted="pass_at_k" in report)
