"""How big must a paired evaluation be? Measured from a pilot's phase-4 sample files.

    python benchmarks/power_from_samples.py outputs/pilot/eval_samples.jsonl            # phase 4 --baseline
    python benchmarks/power_from_samples.py A.samples.jsonl B.samples.jsonl [--half_width 0.03]

With one file (phase 4 run with `--baseline`), A is its `trained` rows and B its `baseline` rows; with
two files, A and B are the files. Both must hold the same problems with the same number of samples each.
Prints (and with --output writes) `evaluation.power.paired_design`: the spread of the per-problem
difference A - B, its within-problem (sampling) and between-problem parts, the half-width the pilot
itself has, and the problems needed at 1, 2, 4, 8 and 16 samples per problem for a paired 95% interval
of +-half_width.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def split_rows(paths: list[str]) -> tuple[list, list]:
    from evaluation.evaluate import read_samples

    if len(paths) == 2:
        return read_samples(paths[0]), read_samples(paths[1])
    rows = read_samples(paths[0])
    trained = [r for r in rows if r.model == "trained"]
    baseline = [r for r in rows if r.model == "baseline"]
    if not trained or not baseline:
        raise SystemExit(f"error: {paths[0]} has no trained and baseline rows (phase 4 --baseline); pass two files")
    return trained, baseline


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", help="one phase-4 --baseline sample file, or two sample files (A B)")
    parser.add_argument("--half_width", type=float, default=0.03, help="Target paired half-width (default 0.03).")
    parser.add_argument("--output", help="Also write the result here (JSON).")
    args = parser.parse_args(argv)
    if len(args.files) > 2:
        parser.error("one or two sample files")
    from evaluation.power import paired_design, pass_counts

    a_rows, b_rows = split_rows(args.files)
    a_n, b_n = Counter(r.task_id for r in a_rows), Counter(r.task_id for r in b_rows)
    if set(a_n) != set(b_n):
        raise SystemExit("error: the two models were evaluated on different problems")
    sizes = set(a_n.values()) | set(b_n.values())
    if len(sizes) != 1:
        raise SystemExit(f"error: every problem needs the same number of samples, found {sorted(sizes)}")
    ids = sorted(a_n)
    design = paired_design(
        pass_counts([(r.task_id, r.passed) for r in a_rows], ids),
        pass_counts([(r.task_id, r.passed) for r in b_rows], ids),
        sizes.pop(),
        args.half_width,
    )
    design["a_pass_rate"] = sum(r.passed for r in a_rows) / len(a_rows)
    design["b_pass_rate"] = sum(r.passed for r in b_rows) / len(b_rows)
    design["files"] = args.files
    print(json.dumps(design, indent=2))
    if args.output:
        Path(args.output).write_text(json.dumps(design, indent=2) + "\n")
    return design


if __name__ == "__main__":
    main()
