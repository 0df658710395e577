"""The sandbox worker pool: pre-started `sandbox.worker` processes and the pipes to them.

The pool sends each worker a job (the program, its test *inputs* and limits; never an expected
value: those stay in `sandbox.judge`) and reads the reply under a deadline and a size bound. It
trusts nothing a worker sends: any error replaces that worker and fails only that program.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import selectors
import signal
import site
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.protocol import HEADER, MAX_MESSAGE

PROJECT_ROOT = Path(__file__).resolve().parent.parent
WORKER_SCRIPT = Path(__file__).resolve().with_name("worker.py")  # run, never imported here
PRELOAD = (
    "collections",
    "itertools",
    "functools",
    "heapq",
    "bisect",
    "math",
    "re",
    "string",
    "typing",
    "fractions",
    "decimal",
    "random",
    "statistics",
    "operator",
    "copy",
    "datetime",
    "array",
    "queue",
    "json",
    "ctypes",
    "cmath",
    "textwrap",
    "unicodedata",
    "calendar",
    "enum",
    "dataclasses",
    "threading",
    "io",
    "shutil",
    "subprocess",
    "traceback",
    "base64",
    "struct",
    "hashlib",
    "time",
)


def _wait(selector: selectors.BaseSelector, deadline: float, late: str) -> None:
    """Until the selector's one pipe is ready; SandboxError(`late`) once `deadline` (time.monotonic()) passes."""
    left = deadline - time.monotonic()
    if left <= 0 or not selector.select(left):
        raise SandboxError(late)


@dataclass(frozen=True)
class SandboxLimits:
    test_timeout: float = 4.0  # seconds per test (APPS harness: 4)
    program_timeout: float | None = None  # seconds for the whole program; None: tests * test_timeout + 2, capped at 60
    memory_mb: int = 1024  # address space added on top of the interpreter's own
    file_size_mb: int = 16
    max_processes: int = 32  # threads count too
    output_bytes: int = 1 << 22  # cap on captured stdout/stderr per test
    # where the host has a CPU cgroup, a test's time is charged as its CPU time, and wall clock stops it
    # only at this many times its limit (a program that sleeps or blocks): a neighbour's load slows a
    # program down but cannot time it out
    wall_factor: float = 3.0

    @classmethod
    def from_config(cls, sandbox: Any) -> SandboxLimits:
        """From a config.SandboxConfig section."""
        return cls(test_timeout=sandbox.timeout_per_test, memory_mb=sandbox.memory_limit_mb)

    def total_for(self, n_tests: int) -> float:
        if self.program_timeout is not None:
            return self.program_timeout
        return min(n_tests * self.test_timeout + 2.0, 60.0)

    def job_limits(self, n_tests: int) -> dict[str, float | int]:
        """The `limits` of a worker job (`sandbox.protocol`) running `n_tests` tests."""
        return {
            "test_timeout": self.test_timeout,
            "total_timeout": self.total_for(n_tests),
            "memory_mb": self.memory_mb,
            "file_size_mb": self.file_size_mb,
            "max_processes": self.max_processes,
            "output_bytes": self.output_bytes,
            "wall_factor": self.wall_factor,
        }


class SandboxError(RuntimeError):
    """The harness itself failed (not the program)."""


class SandboxIsolationWarning(UserWarning):
    """The pool runs programs with less than the full isolation (see docs/sandbox.md, class 6)."""


def isolation_shortfall(info: dict, machine: str | None = None) -> str | None:
    """What a worker's ready message (and this `machine`, default the host's) says is missing from the full
    isolation, or None (pure given `machine`)."""
    import platform

    from sandbox.isolation import KEYRING_FILTER_MACHINES

    machine = machine or platform.machine()
    missing = []
    if machine not in KEYRING_FILTER_MACHINES:
        missing.append(f"no keyring filter on {machine}: a worker's programs share its uid's kernel keyrings")
    if info.get("isolation") != "namespaces":
        why = info.get("isolation_error") or ("not root" if info.get("uid") is None else "isolate=False")
        missing.append(f"basic isolation, no namespaces ({why}): programs share the host's /tmp and network")
    elif not info.get("memory_cgroup"):
        missing.append(f"no memory cgroup ({info.get('cgroup_error', 'unavailable')}): only the per-process limit")
    if info.get("isolation") == "namespaces" and "cpu_cgroup" in info and not info["cpu_cgroup"]:
        missing.append(
            f"no CPU cgroup ({info.get('cpu_cgroup_error', 'unavailable')}): wall-clock time limits, so a "
            "neighbour's load can time a program out"
        )
    return "; ".join(missing) or None


def _secret_paths(extra: Sequence[str | os.PathLike] = ()) -> list[str]:
    """Folders a program must not read: home folders, the project (and its siblings), the caches."""
    system = {"/", "/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/proc", "/dev", "/sys", "/var", "/opt"}
    candidates = ["/root", "/home", str(PROJECT_ROOT)]
    if str(PROJECT_ROOT.parent) not in system:
        candidates.append(str(PROJECT_ROOT.parent))
    for var in ("HF_HOME", "TGRPO_CACHE_DIR", "XDG_CACHE_HOME"):
        if os.environ.get(var):
            candidates.append(os.environ[var])
    candidates += [str(p) for p in extra]
    return [c for c in dict.fromkeys(os.path.realpath(c) for c in candidates) if c not in system]


def task_secret_paths(config: Any) -> list[str]:
    """The task files of a run (`config.paths`): hidden from programs by every pool that scores
    them (phase 4 adds its --eval_file, the trainer and phases 1-2 hide these)."""
    paths = config.paths
    return [str(p) for p in (paths.data_dir, paths.train_file, paths.val_file, paths.teacher_traces_file)]


def _python_paths() -> list[str]:
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    paths.update(site.getsitepackages())
    return sorted(p for p in paths if p)


class _Worker:
    def __init__(self, init: dict) -> None:
        self._close_lock = threading.Lock()
        to_worker_r, self._to_worker = os.pipe()
        self._from_worker, from_worker_w = os.pipe()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "LANG": "C.UTF-8",
        }
        self.process = subprocess.Popen(
            [sys.executable, "-I", str(WORKER_SCRIPT), str(to_worker_r), str(from_worker_w)],
            pass_fds=(to_worker_r, from_worker_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
            cwd="/",
        )
        os.close(to_worker_r)
        os.close(from_worker_w)
        os.set_blocking(self._to_worker, False)
        os.set_blocking(self._from_worker, False)
        self._send(init, 60.0)
        ready = self._receive(60.0)
        if not isinstance(ready, dict) or ready.get("k") != "ready":
            self.close()
            raise SandboxError(f"sandbox worker failed to start: {ready!r}")
        self.info = ready

    def _receive(self, timeout: float) -> Any:
        """One reply frame, read under a deadline with a size bound (a stuck, dead or babbling
        worker raises SandboxError; it never blocks this process)."""
        deadline = time.monotonic() + timeout
        header = self._read_exact(HEADER.size, deadline)
        (size,) = HEADER.unpack(header)
        if size > MAX_MESSAGE:
            raise SandboxError(f"sandbox worker sent a {size}-byte reply (limit {MAX_MESSAGE})")
        body = self._read_exact(size, deadline)
        try:
            return json.loads(body)
        except (ValueError, RecursionError, MemoryError) as exc:
            raise SandboxError(f"sandbox worker sent an unreadable reply: {type(exc).__name__}") from None

    def _read_exact(self, n: int, deadline: float) -> bytes:
        chunks, remaining = [], n
        with selectors.DefaultSelector() as selector:
            selector.register(self._from_worker, selectors.EVENT_READ)
            while remaining:
                _wait(selector, deadline, "sandbox worker did not answer in time")
                chunk = os.read(self._from_worker, min(remaining, 1 << 20))
                if not chunk:
                    raise SandboxError(f"sandbox worker exited (code {self.process.poll()})")
                chunks.append(chunk)
                remaining -= len(chunk)
        return b"".join(chunks)

    def _send(self, obj: object, timeout: float) -> None:
        data = json.dumps(obj).encode("utf-8")
        view = memoryview(HEADER.pack(len(data)) + data)
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(self._to_worker, selectors.EVENT_WRITE)
            while view:
                _wait(selector, deadline, "sandbox worker did not take its job in time")
                view = view[os.write(self._to_worker, view[: 1 << 16]) :]

    def run(self, job: dict, timeout: float) -> dict:
        self._send(job, timeout)
        reply = self._receive(timeout)
        if not isinstance(reply, dict):
            raise SandboxError("sandbox worker sent a reply that is not an object")
        return reply

    def close(self, grace: float = 5.0) -> None:
        """Close the job pipe (the worker then stops any running program, ends its zygote and removes
        its cgroup), kill it after `grace` s; a thread still waiting for a reply then sees it gone."""
        with self._close_lock:  # close each fd once (a second close could hit a reused fd number)
            to_worker, self._to_worker = self._to_worker, -1
        if to_worker >= 0:
            os.close(to_worker)
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        _empty_cgroup(getattr(self, "info", {}).get("memory_cgroup"))
        with self._close_lock:
            from_worker, self._from_worker = self._from_worker, -1
        if from_worker >= 0:
            os.close(from_worker)


def _empty_cgroup(path: str | None) -> None:
    """Kill every process left in a dead worker's memory cgroup (a program that cleared its parent-death
    signal while its worker was killed), then remove the cgroup. Nothing a program starts can leave it."""
    if not path or not os.path.isdir(path):
        return
    for _ in range(100):
        try:
            with open(os.path.join(path, "cgroup.procs")) as handle:
                pids = [int(x) for x in handle.read().split()]
        except (OSError, ValueError):
            return
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
    try:
        os.rmdir(path)
    except OSError:
        pass


class SandboxPool:
    """A fixed set of sandbox workers; `run` borrows one per program (thread-safe)."""

    @classmethod
    def from_config(
        cls, sandbox: Any, *, workers: int | None = None, secret_paths: Sequence[str | os.PathLike] = ()
    ) -> SandboxPool:
        """A pool with a config.SandboxConfig section's limits and isolation, `workers` workers (the section's
        max_workers if None). Everything that runs on it takes these limits: the pool owns them."""
        return cls(
            sandbox.max_workers if workers is None else workers,
            SandboxLimits.from_config(sandbox),
            sandbox.isolate,
            secret_paths=secret_paths,
        )

    def __init__(
        self,
        workers: int = 0,
        limits: SandboxLimits | None = None,
        isolate: bool = True,
        secret_paths: Sequence[str | os.PathLike] = (),
        network: str = "renewed",
        cpu_cgroup: bool = True,
    ) -> None:
        """`network`: "renewed" (a network namespace per worker, replaced by a fresh one whenever a program
        leaves a socket in it: no program starts where another left anything), "per_program" (a fresh one
        for every program: the same guarantee at a kernel cost per program; the default where the
        seccomp filter that confines programs to unix sockets is missing) or "shared" (one per worker,
        never renewed). "shared" and `cpu_cgroup=False` (wall-clock limits) only measure what the
        isolation costs (benchmarks/bench_executor.py)."""
        if network not in ("renewed", "per_program", "shared"):
            raise ValueError(f"network must be renewed, per_program or shared, not {network!r}")
        self.size = workers or os.cpu_count() or 1
        self.limits = limits or SandboxLimits()
        self._init = {
            "isolate": isolate,
            "hide": _secret_paths(secret_paths),
            "keep": _python_paths(),
            "preload": list(PRELOAD),
            "uid_base": 200000,
            "tmp_size_mb": 512,
            "network": network,
            "cpu_cgroup": cpu_cgroup,
        }
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        for _ in range(self.size):
            self._spawn()
        self.isolation = self._all[0].info.get("isolation", "basic")
        shortfall = isolation_shortfall(self._all[0].info)
        if shortfall:  # the fallback is documented, never silent: every caller's log shows it
            warnings.warn(f"sandbox: {shortfall}", SandboxIsolationWarning, stacklevel=2)

    def _spawn(self) -> None:
        worker = _Worker(self._init)
        with self._lock:
            self._all.append(worker)
        self._idle.put(worker)

    def run(self, job: dict) -> dict:
        if self._closed:
            raise SandboxError("sandbox pool is closed")
        worker = self._idle.get()
        limits = job["limits"]
        budget = (
            limits["total_timeout"] * limits.get("wall_factor", 1.0) * 1.5 + 30.0
        )  # the worker enforces the real limits
        try:
            result = worker.run(job, budget)
        except Exception as exc:
            with self._lock:
                if worker in self._all:
                    self._all.remove(worker)
            worker.close(grace=0.0)
            if not self._closed:
                self._spawn()
            raise SandboxError(f"{type(exc).__name__}: {exc}") from exc
        self._idle.put(worker)
        return result

    def close(self) -> None:
        self._closed = True
        with self._lock:
            workers, self._all = self._all, []
        threads = [threading.Thread(target=worker.close) for worker in workers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_default_pool: SandboxPool | None = None
_default_lock = threading.Lock()


def default_pool() -> SandboxPool:
    """A process-wide pool (one worker per core), started on first use and closed at exit."""
    global _default_pool
    with _default_lock:
        if _default_pool is None or _default_pool._closed:
            _default_pool = SandboxPool()
            atexit.register(_default_pool.close)
        return _default_pool
