"""The teacher-guidance rerun's report, built from its evidence alone (experiments/results/teacher_guidance/):
teacher_guidance.json, .md and .png under --results_dir. Any subset of runs gives a report; `complete` says whether
every planned run is in. Per arm × seed: strict and sanitized pass@1, the share ended by the budget, what phase 3
trained on, the stages' times; per contrast, stratum and grade: the paired t over seeds (evaluation/seed_contrasts.py);
what the held-out answers and the GRPO rollouts look like (stdin programs, cut answers, guided samples' prefixes).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import numpy as np

from experiments.frame import SAMPLE_COLUMNS, has_config_section, ks_for, write_report_files
from experiments.teacher_guidance.design import ARMS, BASE, CONTRASTS, DEFAULT_ARMS, DEFAULT_SEEDS, NAME, STRATA

RESAMPLES, BOOTSTRAP_SEED = 10_000, 0
GRADES = {"strict": SAMPLE_COLUMNS.index("passed"), "sanitized": SAMPLE_COLUMNS.index("sanitized_passed")}
STATUS, FINISH, READS_STDIN = (SAMPLE_COLUMNS.index(c) for c in ("status", "finish_reason", "reads_stdin"))


def load_runs(evidence: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((evidence / "runs").glob("*.json"))]


def counts_per_task(run: dict, task_ids: list[str], column: int) -> np.ndarray:
    """Passes per held-out task by one grade's column, in `task_ids` order; shape (T,)."""
    passes: Counter[str] = Counter()
    for row in run.get("samples", []):
        passes[row[0]] += row[column] if len(row) > column else row[2]
    return np.array([passes[t] for t in task_ids], dtype=np.int64)


def strata_of(task_ids: list[str]) -> dict[str, list[int]]:
    out = {"all": list(range(len(task_ids)))}
    out.update({name: [i for i, t in enumerate(task_ids) if t.startswith(prefix)] for name, prefix in STRATA.items()})
    return out


def analyse_runs(all_runs: list[dict], task_ids: list[str], samples: int) -> dict:
    """Per stratum and grade, the arms and the pre-registered contrasts (pass@1, paired t over seeds)."""
    from evaluation.pass_at_k import estimate_pass_at_k
    from evaluation.seed_contrasts import analyse

    runs = {(r["arm"], r["seed"]): r for r in all_runs if not r.get("stopped")}
    arms = [a for a in [BASE, *ARMS] if any(arm == a for arm, _ in runs)]
    trained = [a for a in arms if a != BASE]
    contrasts = [c for c in CONTRASTS if c[0] in arms and c[1] in arms]
    analysis: dict = {}
    for grade, column in GRADES.items():
        counts = {a: {s: counts_per_task(r, task_ids, column) for (x, s), r in runs.items() if x == a} for a in arms}
        for stratum, idx in strata_of(task_ids).items():
            if not idx:
                continue
            scores = {
                a: {s: estimate_pass_at_k(samples, c[idx].tolist(), 1) for s, c in by_seed.items()}
                for a, by_seed in counts.items()
            }
            block = analysis.setdefault(stratum, {"tasks": len(idx)})
            block[f"{grade}_pass@1"] = analyse(scores, contrasts, trained, RESAMPLES, BOOTSTRAP_SEED) if scores else {}
    return analysis


def run_rows(all_runs: list[dict]) -> dict:
    """One summary row per run: scores, the share at the budget, the signal check, what phase 3 used, times."""
    return {
        f"{r['arm']}-s{r['seed']}": {
            "arm": r["arm"],
            "seed": r["seed"],
            "stopped": r.get("stopped"),
            "pass@1": (r.get("pass_at_k") or {}).get("1"),
            "sanitized_pass@1": (r.get("pass_at_k_sanitized") or {}).get("1"),
            "at_budget": r.get("at_budget"),
            "signal": r.get("signal"),
            "teacher_traces_used": {
                stage: (s.get("teacher_data_used") or {}).get("usable_traces")
                for stage, s in (r.get("stages") or {}).items()
                if isinstance(s, dict) and "train_s" in s
            },
            "pool": len((r.get("stages") or {}).get("pool", {}).get("pool", [])) or None,
            "train_s": r.get("train_s"),
            "eval_s": r.get("eval_s"),
            "wall_s": r.get("wall_s"),
            "load_start": r["load"]["start"][0],
        }
        for r in sorted(all_runs, key=lambda r: (r["seed"], r["arm"]))
    }


STDIN_GROUP = "apps_stdin"  # descriptive, not a stratum of the design: the APPS tasks judged on stdin


def shape_groups(task_ids: list[str], types: dict[str, str]) -> dict[str, set[str]]:
    """The strata's task sets and, where the evidence has the test types, the APPS tasks judged on stdin (the
    fixtures' APPS tasks are stdin or call-based; only a stdin program can solve the former)."""
    groups = {name: {task_ids[i] for i in idx} for name, idx in strata_of(task_ids).items()}
    stdin = {t for t in task_ids if t.startswith(STRATA["apps_format"]) and types.get(t) == "stdin"}
    if stdin:
        groups[STDIN_GROUP] = stdin
    return groups


def answer_shapes(all_runs: list[dict], task_ids: list[str], types: dict[str, str] | None = None) -> dict:
    """Per arm and stratum (and the APPS stdin tasks, with `types`), what its held-out answers look like, pooled
    over seeds: the share passed (strict), with no gradable code, ended by the budget, and whose graded program
    reads stdin (over the runs whose evidence has that column). A stdin task is solved only by a stdin program:
    an arm that never writes one there has not been taught the format, whatever its score."""
    strata = shape_groups(task_ids, types or {})
    shapes: dict = {}
    for arm in dict.fromkeys(r["arm"] for r in all_runs if not r.get("stopped")):
        rows = [row for r in all_runs if r["arm"] == arm and not r.get("stopped") for row in r.get("samples", [])]
        for stratum, tasks in strata.items():
            picked = [row for row in rows if row[0] in tasks]
            if not picked:
                continue
            known = [row[READS_STDIN] for row in picked if len(row) > READS_STDIN]
            shapes.setdefault(arm, {})[stratum] = {
                "samples": len(picked),
                "passed": sum(row[GRADES["strict"]] for row in picked) / len(picked),
                "no_code": sum(row[STATUS] == "no_code" for row in picked) / len(picked),
                "at_budget": sum(row[FINISH] == "length" for row in picked) / len(picked),
                "reads_stdin": sum(known) / len(known) if known else None,
                "reads_stdin_samples": len(known),
            }
    return shapes


ROLLOUT_KINDS = ("unguided", "guided", "unguided, on a task guided earlier")


def rollout_shapes(all_runs: list[dict], types: dict[str, str] | None = None) -> dict:
    """Per arm, kind and stratum, what its GRPO stage's rollout samples were, pooled over seeds (the runs whose
    evidence keeps them): samples, pass rate, the share ended by the budget, the share whose graded program reads
    stdin, and for guided samples the share that repeats its teacher prefix (`frame.echoes_prefix`). Kinds: every
    unguided sample, every guided one, and the unguided samples on a task the run guided at an earlier step (what
    guidance carried over to the prompt alone)."""
    out: dict = {}
    for r in all_runs:
        stage = (r.get("stages") or {}).get("grpo") or {}
        if not stage.get("rollouts") or r.get("stopped"):
            continue
        col = {c: i for i, c in enumerate(stage["rollout_columns"])}
        rows = stage["rollouts"]
        first_guided: dict[str, int] = {}
        for row in rows:
            if row[col["prefix_tokens"]]:
                first_guided.setdefault(row[col["task_id"]], row[col["step"]])
        for row in rows:
            task, step, guided = row[col["task_id"]], row[col["step"]], bool(row[col["prefix_tokens"]])
            kinds = ["guided"] if guided else ["unguided"]
            if not guided and step > first_guided.get(task, step):
                kinds.append("unguided, on a task guided earlier")
            groups = [name for name, prefix in STRATA.items() if task.startswith(prefix)]
            if task.startswith(STRATA["apps_format"]) and (types or {}).get(task) == "stdin":
                groups.append(STDIN_GROUP)
            for stratum in groups:
                for kind in kinds:
                    cell = (
                        out.setdefault(r["arm"], {})
                        .setdefault(kind, {})
                        .setdefault(
                            stratum, {"samples": 0, "passed": 0, "at_budget": 0, "reads_stdin": 0, "echoes_prefix": 0}
                        )
                    )
                    cell["samples"] += 1
                    cell["passed"] += row[col["passed"]]
                    cell["at_budget"] += row[col["finish_reason"]] == "length"
                    cell["reads_stdin"] += row[col["reads_stdin"]]
                    cell["echoes_prefix"] += row[col["echoes_prefix"]]
    return out


def guidance_rows(all_runs: list[dict]) -> dict:
    """How much guidance each guided run used, from its GRPO stage's metrics: the run's totals (guided groups,
    their share, tasks, mean prefix as a fraction of the teacher's answer, the guided samples' pass rate), the
    policy's own pass rate as first drawn, and the transfer: the unguided pass rate, at each later step, on tasks
    guided earlier (mean over the steps that measured it)."""
    out = {}
    for r in sorted(all_runs, key=lambda r: (r["seed"], r["arm"])):
        metrics = ((r.get("stages") or {}).get("grpo") or {}).get("metrics") or []
        totals = [m for m in metrics if "guidance/total_guided_groups" in m]
        if not totals:
            continue
        last = totals[-1]
        unguided = [m["guidance/pass_rate_unguided"] for m in metrics if "guidance/pass_rate_unguided" in m]
        transfer = [m["guidance/transfer_pass_rate"] for m in metrics if "guidance/transfer_pass_rate" in m]
        out[f"{r['arm']}-s{r['seed']}"] = {
            "steps": len(metrics),
            "guided_groups": last["guidance/total_guided_groups"],
            "group_share": last.get("guidance/total_group_share"),
            "tasks_guided": last.get("guidance/total_tasks_guided"),
            "prefix_fraction_mean": last.get("guidance/total_prefix_fraction_mean"),
            "prefix_tokens_mean": last.get("guidance/total_prefix_tokens_mean"),
            "pass_rate_guided": last.get("guidance/total_pass_rate_guided"),
            "pass_rate_unguided_mean": float(np.mean(unguided)) if unguided else None,
            "transfer_pass_rate_mean": float(np.mean(transfer)) if transfer else None,
            "transfer_steps": len(transfer),
        }
    return out


def build_report(evidence: Path, command: str) -> dict:
    prepass_path = evidence / "prepass.json"
    if not prepass_path.is_file():
        return {"complete": False, "command": command, "note": "no pre-pass yet: nothing to report"}
    prepass = json.loads(prepass_path.read_text())
    samples, task_ids = prepass["samples"], prepass["heldout_set"]
    all_runs = load_runs(evidence)
    arms = [a for a in [BASE, *ARMS] if any(r["arm"] == a and not r.get("stopped") for r in all_runs)]
    runnable = [a for a in [BASE, *DEFAULT_ARMS] if a == BASE or has_config_section(ARMS[a].needs_section)]
    planned = [(a, s) for s in DEFAULT_SEEDS for a in runnable]
    done = {(r["arm"], r["seed"]) for r in all_runs}
    recipe = json.loads((evidence / "recipe.json").read_text()) if (evidence / "recipe.json").is_file() else {}
    types_path = evidence / "task_types.json"
    types = json.loads(types_path.read_text()) if types_path.is_file() else {}
    parity = {
        path.stem.rsplit("-", 1)[1]: json.loads(path.read_text())
        for path in sorted((evidence / "prepass").glob("sampler-parity-*.json"))
    }
    return {
        "complete": all(p in done for p in planned),
        "seeds": sorted({s for _, s in done}),
        "command": command,
        "run_commands": sorted({r["command"] for r in all_runs if r.get("command")}),
        "commits": sorted({(r.get("git") or {}).get("commit") or "unknown" for r in all_runs}),
        "load_at_report": list(os.getloadavg()),
        "design": "experiments/teacher_guidance/design.py",
        "population": {
            "split": {k: len(v) for k, v in prepass["split"].items()},
            "duplicates_dropped": prepass.get("duplicates_dropped"),
            "training_pool": prepass["training_pool"],
            "heldout_set": task_ids,
            "strata": {name: len(idx) for name, idx in strata_of(task_ids).items()},
            "max_new_tokens": prepass["max_new_tokens"],
            "budgets_tried": prepass.get("budgets_tried"),
        },
        # who sampled: the recipe's sampler for the arms, each pre-pass budget's own (kv before the flag existed)
        "sampler": (recipe.get("flags") or {}).get("sampler", "kv"),
        "sampler_parity": {
            budget: {k: p[k] for k in ("first_name", "second_name", "tasks", "first", "second", "difference")}
            for budget, p in parity.items()
        },
        "arms": ({BASE: {"letter": "base", "label": "no training"}} if BASE in arms else {})
        | {a: {"letter": ARMS[a].letter, "label": ARMS[a].label} for a in arms if a != BASE},
        "k_values": ks_for(samples),
        "runs": run_rows(all_runs),
        "flagged_runs": sorted(
            f"{r['arm']}-s{r['seed']}" for r in all_runs if r.get("signal") and not r["signal"]["ok"]
        ),
        "analysis": analyse_runs(all_runs, task_ids, samples),
        "answer_shapes": answer_shapes(all_runs, task_ids, types),
        "guidance": guidance_rows(all_runs),
        "rollout_shapes": rollout_shapes(all_runs, types),
    }


def _ci(interval) -> str:
    return f"[{interval[0]:+.3f}, {interval[1]:+.3f}]" if interval else "n/a"


def _pct(value) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _num(value) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def _name(report: dict, arm: str) -> str:
    letter = (report["arms"].get(arm) or {}).get("letter")
    return f"{letter} {arm}" if letter and letter != arm else arm


def markdown(report: dict) -> str:
    if "analysis" not in report:
        return f"# Teacher guidance (rerun)\n\n{report['note']}\n"
    pop = report["population"]
    lines = [
        f"# Teacher guidance, rerun: the teacher's content against a format control "
        f"({'complete' if report['complete'] else 'partial'})",
        "",
        f"Design (fixed before any outcome): `{report['design']}`. Report: `{report['command']}`; commits "
        + ", ".join(report["commits"])
        + "; load at report time "
        + ", ".join(f"{x:.1f}" for x in report["load_at_report"])
        + ".",
        "",
        (
            pop.get("heldout_note")
            or f"Held-out set: {len(pop['heldout_set'])} tasks after dropping {len(pop['duplicates_dropped'] or [])} "
            f"near-duplicates of training tasks and the base's 8-of-8 tasks; strata "
            + ", ".join(f"{k} {v}" for k, v in pop["strata"].items())
        )
        + f". Budget {pop['max_new_tokens']} tokens (tried: "
        + ", ".join(
            f"{b['budget']}: {b['at_budget']:.1%} of the base's answers at the budget ({b.get('sampler', 'kv')})"
            for b in pop["budgets_tried"] or []
        )
        + f"). Arms sampled by {report.get('sampler', 'kv')}"
        + "".join(
            f"; samplers' parity at {budget} tokens, {p['tasks']} tasks: pass rate {p['first_name']} "
            f"{p['first']['pass_rate']:.3f}, {p['second_name']} {p['second']['pass_rate']:.3f}, difference "
            f"{p['difference']['mean']:+.3f} {_ci(p['difference']['ci95'])}"
            for budget, p in (report.get("sampler_parity") or {}).items()
        )
        + ".",
        "",
        "## Arms (mean over seeds)",
        "",
        "| arm | seeds | strict pass@1 | sanitized pass@1 | ended by the budget |",
        "|---|---|---|---|---|",
    ]
    for arm in report["arms"]:
        rows = [r for r in report["runs"].values() if r["arm"] == arm and not r["stopped"]]
        if not rows:
            continue
        budget = [r["at_budget"] for r in rows if r["at_budget"] is not None]
        lines.append(
            f"| {_name(report, arm)} ({report['arms'][arm]['label']}) | {len(rows)} | "
            f"{np.mean([r['pass@1'] for r in rows]):.3f} | {np.mean([r['sanitized_pass@1'] or 0 for r in rows]):.3f} | "
            f"{np.mean(budget) if budget else float('nan'):.1%} |"
        )
    lines += [
        "",
        "## Pre-registered contrasts (Delta: mean over seeds of the paired per-seed difference; 95% CI: paired t)",
        "",
        "| contrast | stratum | grade | Delta | seeds | paired t 95% CI | seed + task 95% CI |",
        "|---|---|---|---|---|---|---|",
    ]
    for stratum, block in report["analysis"].items():
        for grade in GRADES:
            for name, c in (block.get(f"{grade}_pass@1") or {}).get("contrasts", {}).items():
                a, b = name.split(" - ")
                tt = c.get("task_term")
                lines.append(
                    f"| {_name(report, a)} − {_name(report, b)} | {stratum} ({block['tasks']}) | {grade} | "
                    f"{c['delta']:+.3f} | {len(c['seeds'])} | {_ci(c['ci95'])} | {_ci(tt['ci95']) if tt else 'n/a'} |"
                )
    lines += [
        "",
        f"Runs flagged by the signal check (design.MAX_FLAT_SHARE, PASS_RATE_BAND): "
        f"{', '.join(report['flagged_runs']) or 'none'}.",
        "",
        "## Runs",
        "",
        "| run | strict | sanitized | at budget | teacher traces used | GRPO pool | train s | eval s | run s | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, r in report["runs"].items():
        if r["stopped"]:
            lines.append(f"| {key} | stopped: {r['stopped']} | | | | | {r['train_s']:.0f} | | {r['wall_s']:.0f} | |")
            continue
        used = ", ".join(f"{k} {v}" for k, v in r["teacher_traces_used"].items() if v is not None) or "-"
        lines.append(
            f"| {key} | {r['pass@1']:.3f} | {r['sanitized_pass@1'] or 0:.3f} | {r['at_budget']:.1%} | {used} | "
            f"{r['pool'] or '-'} | {r['train_s']:.0f} | {r['eval_s']:.0f} | {r['wall_s']:.0f} | {r['load_start']:.1f} |"
        )
    lines += ["", "## What the answers look like (pooled over seeds)", ""]
    lines += [
        "| arm | stratum | samples | passed | no gradable code | ended by the budget | program reads stdin |",
        "|---|---|---|---|---|---|---|",
    ]
    shapes = report.get("answer_shapes") or {}
    for arm in [a for a in report["arms"] if a in shapes]:
        for stratum, shape in shapes[arm].items():
            stdin = shape["reads_stdin"]
            stdin_cell = "n/a" if stdin is None else f"{stdin:.1%} (of {shape['reads_stdin_samples']})"
            lines.append(
                f"| {_name(report, arm)} | {stratum} | {shape['samples']} | {_pct(shape.get('passed'))} | "
                f"{shape['no_code']:.1%} | "
                f"{shape['at_budget']:.1%} | {stdin_cell} |"
            )
    if any(STDIN_GROUP in by_stratum for by_stratum in shapes.values()):
        lines += [
            "",
            f"{STDIN_GROUP}: the APPS-format tasks judged on stdin (the others are call-based), a descriptive split "
            "of the apps_format stratum, not a stratum of the design.",
        ]
    if report.get("guidance"):
        lines += [
            "",
            "## Guidance used (guided runs' GRPO stage)",
            "",
            "| run | steps | guided groups (share) | tasks guided | prefix (of the answer, tokens) | pass rate guided "
            "| pass rate unguided | transfer (steps) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for key, g in report["guidance"].items():
            lines.append(
                f"| {key} | {g['steps']} | {g['guided_groups']:.0f} ({_pct(g['group_share'])}) | "
                f"{_num(g['tasks_guided'])} | {_pct(g['prefix_fraction_mean'])}, {_num(g['prefix_tokens_mean'])} | "
                f"{_pct(g['pass_rate_guided'])} | {_pct(g['pass_rate_unguided_mean'])} | "
                f"{_pct(g['transfer_pass_rate_mean'])} ({g['transfer_steps']}) |"
            )
        lines += [
            "",
            "Transfer: the unguided pass rate on training tasks guided at an earlier step (mean over the steps "
            "that measured it). A guided pass rate that climbs while the transfer stays at 0 is a student copying "
            "the prefix, not learning the task.",
        ]
    rollouts = report.get("rollout_shapes") or {}
    if rollouts:
        lines += [
            "",
            "## What the GRPO rollouts look like (training samples, pooled over the seeds that kept them)",
            "",
            "| arm | samples | stratum | n | passed | ended by the budget | program reads stdin | repeats its prefix |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for arm in [a for a in report["arms"] if a in rollouts]:
            for kind in [k for k in ROLLOUT_KINDS if k in rollouts[arm]]:
                by_stratum = rollouts[arm][kind]
                for stratum, c in [(g, by_stratum[g]) for g in [*STRATA, STDIN_GROUP] if g in by_stratum]:
                    n = c["samples"]
                    echo = f"{c['echoes_prefix'] / n:.1%}" if kind == "guided" else "-"
                    lines.append(
                        f"| {_name(report, arm)} | {kind} | {stratum} | {n} | {c['passed'] / n:.1%} | "
                        f"{c['at_budget'] / n:.1%} | {c['reads_stdin'] / n:.1%} | {echo} |"
                    )
        lines += [
            "",
            "A guided sample's program includes its teacher prefix; 'repeats its prefix': a prefix line of at least "
            "20 non-blank characters written again after it. Runs before phase 3 wrote completions.jsonl keep none.",
        ]
    lines += [
        "",
        "Every interval is conditional on these held-out fixture tasks, the 135M student and this recipe. An interval "
        "straddling 0 is 'not shown', not 'no effect'. B − F is the teacher's content at the same format and compute.",
        "",
    ]
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    arms = list(report["arms"])
    for x, arm in enumerate(arms):
        for offset, key, color in ((-0.15, "pass@1", "black"), (0.15, "sanitized_pass@1", "#fd8d3c")):
            values = [r[key] for r in report["runs"].values() if r["arm"] == arm and r[key] is not None]
            ax.scatter([x + offset] * len(values), values, color=color, s=12, label=key if x == 0 else None)
    ax.set_xticks(range(len(arms)), [_name(report, a) for a in arms], rotation=20, fontsize=8)
    ax.set_ylabel("held-out pass@1 (dots: seeds)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(report: dict, results_dir: Path) -> list[Path]:
    return write_report_files(report, results_dir, NAME, markdown, plot, plotted=bool(report.get("runs")))
