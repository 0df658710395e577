"""The closing summary of a whole run (`make run`), read from the files the phases wrote.

    python -m training.run_summary [--data_dir data] [--output_dir outputs]

Prints how phase 2's teacher did (answered N of M, usable traces), how many steps phase 3 ran and where their
time went (rollout, scoring, update), how much teacher guidance it used (when on), and pass@k of
the adapter against the base model with their 95% intervals (also drawn: evaluation_pass_at_k.png beside
the results); then either `run healthy` or one WARNING line per degraded phase (phase 3 with no update at all is
one: its adapter is the initial one; so is each `--warn`), and exits 3 in that case (0 when healthy), so a
degraded run does not end as a success.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEGRADED_EXIT = 3


@dataclass
class RunSummary:
    lines: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.warnings

    def text(self) -> str:
        out = ["Run summary:", *(f"  {line}" for line in self.lines)]
        out += [f"WARNING: {warning}" for warning in self.warnings] or ["run healthy"]
        return "\n".join(out)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _interval(ci: Any) -> str:
    if isinstance(ci, list) and len(ci) == 2 and all(isinstance(v, int | float) for v in ci):
        return f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci[0] < 0 else f" [{ci[0]:.3f}, {ci[1]:.3f}]"
    return ""


def _phase2(summary: RunSummary, data_dir: Path) -> None:
    stats = _read_json(data_dir / "teacher_traces.stats.json")
    if stats is None:
        summary.warnings.append(f"phase 2 wrote no statistics ({data_dir / 'teacher_traces.stats.json'})")
        return
    asked = int(stats.get("total", 0))
    failed = int(stats.get("api_errors", 0))
    answered = asked - failed
    earlier = int(stats.get("skipped_existing", 0))
    if stats.get("teacher_model") == REFERENCE_TEACHER:  # no server was asked: the tasks' own solutions ran
        line = f"phase 2: {asked} reference solutions run, {int(stats.get('passed', 0))} passed (no teacher asked)"
    else:
        line = f"phase 2: the teacher answered {answered} of {asked} requests"
    if earlier:
        line += f" ({earlier} samples kept from an earlier run)"
    summary.lines.append(line)
    if asked and answered * 2 < asked:
        summary.warnings.append(f"phase 2's teacher answered under half of the requests ({answered} of {asked})")
    fit = stats.get("teacher_sft_fit")
    if isinstance(fit, dict):
        usable = int(fit.get("usable", 0)) - int(fit.get("too_long", 0))
        summary.lines.append(f"phase 2: {usable} traces usable for teacher-SFT")
        if usable == 0:
            summary.warnings.append("no usable teacher traces: phase 3 trained without teacher-SFT data")


REFERENCE_TEACHER = "references"  # phase 2's teacher_model when teacher.source=references (synthesis/)

# Below this share of evaluated samples with code, pass@k measures the answer format, not the programs.
MIN_CODE_SHARE = 0.05

# The parts of a training step, in the order they happen, and the metric each is logged as (seconds).
STEP_TIME_PARTS = (
    ("rollout", "time/rollout_s"),
    ("scoring", "time/score_s"),
    ("update", "time/update_s"),
)


def step_time_split(rows: list[dict[str, Any]]) -> str:
    """Mean seconds per logged step of each step-time part ('' when no row has any), e.g. 'step time (mean of 12
    steps): rollout 8.1 s, scoring 2.0 s (log-probs beside it 0.4 s), update 5.2 s'. The no-grad log-prob forwards
    run beside the scoring, so they are inside its time, not added to it."""
    parts = []
    for name, key in STEP_TIME_PARTS:
        values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        if not values:
            continue
        part = f"{name} {sum(values) / len(values):.1f} s"
        beside = [float(r["time/logprobs_s"]) for r in rows if isinstance(r.get("time/logprobs_s"), (int, float))]
        if key == "time/score_s" and beside:
            part += f" (log-probs beside it {sum(beside) / len(beside):.1f} s)"
        parts.append(part)
    if not parts:
        return ""
    return f"step time (mean of {len(rows)} steps): " + ", ".join(parts)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The step rows of a metrics.jsonl (a line that does not parse, e.g. torn by a kill, is skipped)."""
    rows = []
    try:
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                rows.append(row)
    except OSError:
        pass
    return rows


def _phase3(summary: RunSummary, output_dir: Path) -> None:
    rows = read_metrics(output_dir / "metrics.jsonl")
    if not rows:
        summary.warnings.append(f"phase 3 logged no training step ({output_dir / 'metrics.jsonl'})")
        return
    split = step_time_split(rows)
    steps = max(r["step"] for r in rows)
    skipped = [r for r in rows if r.get("update/skipped") == 1.0]
    updates = f" ({len(rows) - len(skipped)} updates)" if skipped else ""
    summary.lines.append(f"phase 3: {steps} training steps{updates}" + (f"; {split}" if split else ""))
    if len(skipped) == len(rows):
        summary.warnings.append(
            f"phase 3 made no update in {len(rows)} steps ({no_update_reason(rows)}): "
            f"the adapter in {output_dir / 'final_model'} is the initial one"
        )
    guidance = guidance_line(rows)
    if guidance:
        summary.lines.append(guidance)


def guidance_line(rows: list[dict[str, Any]]) -> str | None:
    """How much teacher guidance phase 3 used (`training.guidance`'s running totals on its last logged step; under
    several processes each process's, averaged), and whether the tasks it guided pass without it later; None when
    guidance was off."""
    last = next((r for r in reversed(rows) if "guidance/total_guided_groups" in r), None)
    if last is None:
        return None
    groups = last["guidance/total_guided_groups"]
    if not groups:
        return "phase 3 guidance: no all-fail group of a task with a teacher trace, nothing guided"
    line = (
        f"phase 3 guidance: {groups:.0f} guided groups ({last['guidance/total_group_share']:.0%} of groups, "
        f"{last['guidance/total_tasks_guided']:.0f} tasks), mean prefix {last['guidance/total_prefix_tokens_mean']:.0f}"
        f" tokens ({last['guidance/total_prefix_fraction_mean']:.0%} of the teacher's answer), guided pass rate "
        f"{last['guidance/total_pass_rate_guided']:.2f}"
    )
    transfer = [r["guidance/transfer_pass_rate"] for r in rows if "guidance/transfer_pass_rate" in r]
    if transfer:
        mean = sum(transfer) / len(transfer)
        line += f"; unguided pass rate on tasks guided earlier {mean:.2f} (mean of {len(transfer)} steps)"
    return line


def no_update_reason(rows: list[dict[str, Any]]) -> str:
    """Why steps took no optimizer step, from their metrics: no group had a reward spread, and no SFT data came."""
    reasons = []
    if all(r.get("frac_reward_zero_std", 1.0) == 1.0 for r in rows):
        rates = sorted({round(float(r.get("pass_rate", 0.0)), 2) for r in rows})
        reasons.append(
            f"no reward spread in any group: every sample of a task passed or failed alike, pass rate {rates}"
        )
    if not any(r.get("teacher_sft/pool") for r in rows):
        reasons.append("no teacher-SFT data")
    if not any(r.get("self_sft/samples") for r in rows):
        reasons.append("no self-SFT samples")
    return "; ".join(reasons) or "no signal beyond the format bonus"


def _phase4(summary: RunSummary, output_dir: Path) -> None:
    results = _read_json(output_dir / "evaluation_results.json")
    if results is None or not isinstance(results.get("pass_at_k"), dict):
        summary.warnings.append(f"phase 4 wrote no results ({output_dir / 'evaluation_results.json'})")
        return
    tasks = (results.get("eval_set") or {}).get("num_tasks")
    base = results.get("baseline") or {}
    for k, value in results["pass_at_k"].items():
        if value is None:
            summary.lines.append(f"phase 4: pass@{k} not computable")
            continue
        line = f"phase 4: pass@{k} adapter {value:.3f}{_interval((results.get('pass_at_k_ci95') or {}).get(k))}"
        base_value = (base.get("pass_at_k") or {}).get(k)
        if base_value is not None:
            line += f", base {base_value:.3f}{_interval((base.get('pass_at_k_ci95') or {}).get(k))}"
            gain = (results.get("delta") or {}).get(k)
            if gain is not None:
                line += f", delta {gain:+.3f}{_interval((results.get('delta_ci95') or {}).get(k))}"
        summary.lines.append(line + (f" ({tasks} tasks)" if tasks is not None else ""))
    shares = {"adapter": _code_share(results), **({"base": _code_share(base)} if base else {})}
    known = {name: share for name, share in shares.items() if share is not None}
    if known and all(share < MIN_CODE_SHARE for share in known.values()):
        found = ", ".join(f"{name} {share:.0%}" for name, share in known.items())
        summary.warnings.append(
            f"phase 4 found code in almost no evaluated sample ({found} of samples had extractable code): its "
            "pass@k measured the answer format, not the programs (see format and status_counts in "
            f"{output_dir / 'evaluation_results.json'})"
        )


def _code_share(results: dict[str, Any]) -> float | None:
    share = (results.get("format") or {}).get("extractable_code")
    return float(share) if isinstance(share, int | float) else None


def summarize_run(data_dir: Path, output_dir: Path, warnings: list[str] | None = None) -> RunSummary:
    summary = RunSummary(warnings=list(warnings or []))
    _phase2(summary, data_dir)
    _phase3(summary, output_dir)
    _phase4(summary, output_dir)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", default="data", help="Where phase 2 wrote its traces (default data).")
    parser.add_argument("--output_dir", default="outputs", help="Phases 3 and 4's folder (default outputs).")
    parser.add_argument(
        "--warn",
        action="append",
        default=[],
        metavar="TEXT",
        help="A warning the caller saw (e.g. the teacher it started died), listed with the others (repeatable).",
    )
    args = parser.parse_args(argv)
    summary = summarize_run(Path(args.data_dir), Path(args.output_dir), args.warn)
    results = Path(args.output_dir) / "evaluation_results.json"
    if results.exists():
        from training.plot import plot_evaluation

        try:
            summary.lines.append(f"evaluation plot: {plot_evaluation(results)}")
        except (OSError, ValueError, KeyError, TypeError) as error:
            summary.warnings.append(f"could not plot {results}: {error}")
    print(summary.text())
    return 0 if summary.healthy else DEGRADED_EXIT


if __name__ == "__main__":
    sys.exit(main())
