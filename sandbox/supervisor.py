"""The supervisor: runs the parent's jobs and keeps every clock (standard library only).

It never forks a program itself: it asks the zygote (`sandbox.zygote`) for program processes, hands each
its job's fds, times the run from the ready byte, reads the reports under deadlines and a size bound, and
turns what came back (or how the run ended) into one record per test (`Supervisor.run_job`).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import time
from typing import Any

from sandbox.harness import HARNESS_FAILED
from sandbox.isolation import Cgroup, CpuGroup, memfd, read_all
from sandbox.protocol import MAX_FRAME_NODES, FrameBuffer, valid_text

# --------------------------------------------------------------------------------------------
# The supervisor
# --------------------------------------------------------------------------------------------


class HarnessError(RuntimeError):
    """The sandbox itself failed (never something a program can cause)."""


class ParentClosed(Exception):  # noqa: N818 - a signal to shut down, not an error
    """The parent closed its pipe mid-run (`SandboxPool.close`): stop the program and exit."""


def _wait_readable(fds: list[int], timeout: float) -> list[int]:
    try:
        ready, _, _ = select.select(fds, [], [], max(timeout, 0.0))
    except InterruptedError:
        return []
    return ready


class Supervisor:
    """Runs jobs for the parent. Timing is its own: a run's clock starts at the ready byte the
    harness writes before any untrusted code, and a report counts only if it arrived before the
    run's deadline. Every test gets `test_timeout` from that clock: all tests of a program first run
    together in one process (a report arriving within `test_timeout` of the start proves that test
    took less); the tests left without a report then run again, each in a fresh process of its own
    with its own `test_timeout`. No program can move these clocks or pool time across tests."""

    def __init__(
        self,
        zygote_sock: socket.socket,
        cgroup: Cgroup | None,
        base: str | None,
        parent_fd: int,
        cpu: CpuGroup | None = None,
    ) -> None:
        self.zygote, self.cgroup, self.base, self.parent_fd = zygote_sock, cgroup, base, parent_fd
        self.cpu = cpu
        self.watch_network: int | None = None  # the zygote's pid, when its network namespace is watched
        self.cpus = len(os.sched_getaffinity(0))  # how fast the group's CPU time can grow per wall second
        self.notes: list[tuple[dict, list[int]]] = []
        self.unwaited: set[int] = set()  # programs whose exit note is not awaited
        self.spares: list[socket.socket] = []  # handoff sockets of program processes waiting for a job

    # ---------------------------------------------------------------- talking to the zygote

    def _note(self, kind: str, pid: int | None, deadline: float) -> tuple[dict, list[int]]:
        while True:
            for k, (note, fds) in enumerate(self.notes):
                if note.get("k") == kind and (pid is None or note.get("pid") == pid):
                    del self.notes[k]
                    return note, fds
            if not _wait_readable([self.zygote.fileno()], deadline - time.monotonic()):
                raise HarnessError(f"the zygote did not send {kind!r} in time")
            message, fds, _, _ = socket.recv_fds(self.zygote, 1 << 12, 4)
            if not message:
                raise HarnessError("the zygote exited")
            note = json.loads(message)
            if note.get("k") == "exit" and note.get("pid") in self.unwaited:
                self.unwaited.discard(note["pid"])  # before its pid can be reused: the zygote reaps, then notes
                continue
            self.notes = self.notes[-64:]  # notes nobody waits for (a run that failed early) do not pile up
            self.notes.append((note, fds))

    def spawn_spare(self) -> None:
        """Ask the zygote for the next program process now: it builds its namespaces and scratch
        space while the current program runs or the parent prepares the next job."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            socket.send_fds(self.zygote, [b'{"k": "launch", "nfds": 1}'], [theirs.fileno()])
        finally:
            theirs.close()
        self.spares.append(mine)

    @staticmethod
    def _send_fds_all(sock: socket.socket, fds: list[int]) -> None:
        socket.send_fds(sock, [json.dumps({"k": "job", "nfds": len(fds)}).encode()], fds[:253])
        for start in range(253, len(fds), 253):
            socket.send_fds(sock, [b"{}"], fds[start : start + 253])

    def _launch(self, fds: list[int]) -> tuple[int, int]:
        if not self.spares:
            self.spawn_spare()
        handoff = self.spares.pop(0)
        try:
            note, pidfds = self._note("pid", None, time.monotonic() + 30.0)  # FIFO: this spare's
            if len(pidfds) != 1:
                raise HarnessError(f"the zygote could not start a program process: {note.get('error')}")
            try:
                self._send_fds_all(handoff, fds)
            except OSError as exc:
                os.close(pidfds[0])
                raise HarnessError(f"the program process died before its job: {exc}") from None
        finally:
            handoff.close()
        if self.base is None:  # basic isolation sweeps every child of the zygote after a run: no spare
            self.spawn_spare()
        return note["pid"], pidfds[0]

    # ---------------------------------------------------------------- one run of some tests

    def _run(self, job: dict, indices: list[int], program_deadline: float) -> tuple[dict, dict]:
        """Run `indices` in one fresh program process; return (reports by index, how the run ended)."""
        limits, stdin_mode = job["limits"], job["mode"] == "stdin"
        cap = limits["output_bytes"]
        job_fd = memfd("job", json.dumps(dict(job, run=indices)).encode("utf-8"))
        ready_r, ready_w = os.pipe()
        res_r, res_w = os.pipe()
        err = memfd("err")
        outs = [memfd(f"out{i}") for i in indices] if stdin_mode else []
        oom_before = self.cgroup.oom_kills() if self.cgroup else 0
        try:
            pid, pidfd = self._launch([job_fd, ready_w, res_w, err, *outs])
        finally:
            for fd in (job_fd, ready_w, res_w):
                os.close(fd)
        reports: dict[int, dict] = {}
        end: dict[str, Any] = {"killed": None}
        killed = False
        try:
            ready = False
            if ready_r in _wait_readable([ready_r], 30.0):
                ready = os.read(ready_r, 1) == b"R"
            start = time.monotonic()
            cpu_start = self.cpu.usage_ns() if self.cpu is not None else 0
            if not ready:
                end["harness"] = True
            # With a CPU cgroup the run is charged its CPU time (a neighbour's load cannot make it late),
            # wall clock only as the backstop (a program that sleeps or blocks); without one, wall clock.
            wall = limits["test_timeout"] * (limits.get("wall_factor", 1.0) if self.cpu is not None else 1.0)
            deadline = min(start + wall, program_deadline)
            frames = FrameBuffer(4 * cap)
            os.set_blocking(res_r, False)
            previous = start
            exited = not ready
            while ready and not exited and len(reports) < len(indices):
                left = wait = deadline - time.monotonic()
                if self.cpu is not None:
                    cpu_left = limits["test_timeout"] - (self.cpu.usage_ns() - cpu_start) / 1e9
                    if cpu_left <= 0:
                        left = 0.0
                    # look again when the group could have used up the rest on every CPU
                    wait = min(left, max(cpu_left / self.cpus, 0.002))
                if left <= 0:
                    end["killed"] = "timeout"
                    break
                for fd in _wait_readable([res_r, pidfd, self.parent_fd], wait):
                    if fd == self.parent_fd:  # during a run the parent sends nothing: this is its close
                        raise ParentClosed
                    if fd == pidfd:
                        exited = True
                        continue
                    try:
                        chunk = os.read(res_r, 1 << 16)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        exited = True  # the program closed its result channel: treat as done
                        continue
                    try:
                        messages = frames.feed(chunk)
                    except OverflowError:
                        end["killed"] = "output_limit"
                        exited = True
                        break
                    now = time.monotonic()
                    for message in messages:
                        if self._accept(message, indices, reports, now - previous, stdin_mode):
                            previous = now
            killed = self.kill(pidfd)
            if len(reports) == len(indices) and self.base is None:
                # every test reported: the exit status is not needed, only the exit itself (a PID 1
                # exits after every process of its namespace); the zygote's note is dropped later
                _wait_readable([pidfd], 30.0)
                self.unwaited.add(pid)
                status = 0
            else:
                note, _ = self._note("exit", pid, time.monotonic() + 30.0)
                status = note["status"]
            if end["killed"] is None and ready:  # what it wrote before it exited (all within the deadline)
                try:
                    while chunk := os.read(res_r, 1 << 16):
                        for message in frames.feed(chunk):
                            self._accept(message, indices, reports, time.monotonic() - previous, stdin_mode)
                except (BlockingIOError, OverflowError):
                    pass
            if self.base is not None:  # basic isolation: nothing but this worker kills leftovers
                self.zygote.send(json.dumps({"k": "sweep", "workdirs": self._workdirs()}).encode())
                self._note("swept", None, time.monotonic() + 30.0)
            end.update(
                time=time.monotonic() - start,
                exit=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                oom=(self.cgroup.oom_kills() if self.cgroup else 0) > oom_before,
                err_size=os.fstat(err).st_size,
            )
            if end.get("harness") and end["exit"] == HARNESS_FAILED:
                raise HarnessError("the sandbox could not set up the program's process")
            if end.get("harness"):
                raise HarnessError(f"the program's process ended before the harness was ready ({status})")
            if stdin_mode:
                for k, index in enumerate(indices):
                    data = read_all(outs[k], cap + 1)
                    reports.setdefault(index, {})["stdout"] = data
        finally:
            if not killed:  # whatever went wrong above, nothing of the program outlives this run
                self.kill(pidfd)
                _wait_readable([pidfd], 10.0)
            for fd in (ready_r, res_r, err, pidfd, *outs):
                os.close(fd)
        return reports, end

    def _keep_network_clean(self) -> None:
        """After a run (its program's processes are gone): programs share the zygote's network namespace
        and can open unix sockets only (the seccomp filter), so any socket still listed there is one a
        program left (an abstract name kept alive by its own fd in flight on its queue carried an answer
        to the next program). Then the zygote moves to a fresh namespace and the spares cloned in the old
        one are dropped: no program starts where another left anything. Reading one /proc file per run
        costs far less than a fresh namespace per program."""
        if self.watch_network is None:
            return
        try:
            with open(f"/proc/{self.watch_network}/net/unix", "rb") as handle:
                clean = handle.read().count(b"\n") <= 1  # the header line only
        except OSError:
            clean = False
        if clean:
            return
        deadline = time.monotonic() + 30.0
        self.zygote.send(b'{"k": "renew_net"}')
        self._note("renewed", None, deadline)
        spares, self.spares = self.spares, []
        for spare in spares:  # each spare has its pid note, in order: take them with the spares
            spare.close()
            _, fds = self._note("pid", None, deadline)
            for fd in fds:
                os.close(fd)

    @staticmethod
    def kill(pidfd: int) -> bool:
        """SIGKILL the program process: PID 1 of its namespace, so every process of it goes too."""
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return True

    def _workdirs(self) -> list[str]:
        try:
            return [os.path.join(self.base or "", name) for name in os.listdir(self.base or "")]
        except OSError:
            return []

    @staticmethod
    def _accept(message: object, indices: list[int], reports: dict, elapsed: float, stdin_mode: bool) -> bool:
        """Take one frame of the program's result channel. Only the reports its job type produces, with
        exactly their fields and types, are believed; a frame with a test index that is anything else is
        that test's failure (`"bad"`), never an error of the sandbox; a frame without one is ignored."""
        if not isinstance(message, dict):
            return False
        kind, index = message.get("k"), message.get("i")
        if kind == "setup_err":  # the program failed before its first test: every test of the run fails so
            ok = _well_formed(message, _SETUP_ERROR)
            for i in indices:
                reports.setdefault(i, dict(message, time=elapsed) if ok else {"k": "bad", "time": elapsed})
            return True
        if type(index) is not int or index not in indices or index in reports:
            return False
        schema = (_STDIN_REPORTS if stdin_mode else _CALL_REPORTS).get(kind) if type(kind) is str else None
        ok = schema is not None and _well_formed(message, schema)
        reports[index] = dict(message, time=elapsed) if ok else {"k": "bad", "time": elapsed}
        return True

    # ---------------------------------------------------------------- a whole job

    def run_job(self, job: dict) -> dict:
        limits = job["limits"]
        start = time.monotonic()
        program_deadline = start + limits["total_timeout"] * (limits.get("wall_factor", 1.0) if self.cpu else 1.0)
        n = len(job["inputs"]) if job["mode"] == "stdin" else len(job["tests"])
        if self.cgroup is not None:  # the program's whole process tree (its memfds and tmpfs files included)
            self.cgroup.set_limit((limits["memory_mb"] + 64) * 1024 * 1024)
        tests: dict[int, dict] = {}
        # what one reply may carry: bytes of values and outputs, and JSON nodes of values (each becomes
        # an object of ~60 bytes, twice, in the judging process: 64 MiB of `[], ` would be 16 M lists)
        budget = [64 << 20, MAX_REPLY_NODES]
        pending, together = list(range(n)), True
        while pending:
            if time.monotonic() >= program_deadline:
                for i in pending:
                    tests[i] = {
                        "status": "timeout",
                        "error": "program time limit reached before this test ran",
                        "time": 0.0,
                    }
                break
            run = pending if together else pending[:1]
            reports, end = self._run(job, run, program_deadline)
            self._keep_network_clean()
            for index in run:
                if index in reports and (reports[index].get("k") or not together):
                    tests[index] = self._record(job, reports[index], end, budget)
                elif not together or len(run) == 1:
                    tests[index] = self._record(job, reports.get(index, {}), end, budget)
            pending = [i for i in pending if i not in tests]
            together = False
            if job.get("stop_at_first_failure"):  # the binary reward: a failure decides the program's verdict
                failed = [i for i in sorted(tests) if _failed(tests[i])]
                if failed:
                    for i in range(failed[0] + 1, n):
                        tests[i] = {"status": "not_run", "error": "not run: an earlier test failed", "time": 0.0}
                    pending = []
        return {
            "id": job.get("id"),
            "tests": [_valid_strings(tests[i]) for i in range(n)],
            "setup_error": None,
            "wall_time": time.monotonic() - start,
        }

    @staticmethod
    def _record(job: dict, report: dict, end: dict, budget: list[int]) -> dict:
        """One test's record for the parent: what the program reported, or how its run ended."""
        cap = job["limits"]["output_bytes"]
        file_cap = job["limits"]["file_size_mb"] * 1024 * 1024  # RLIMIT_FSIZE stopped a write at this size
        record: dict = {"time": float(report.get("time", end.get("time", 0.0)))}
        kind = report.get("k")
        stdout = report.get("stdout", b"")
        if kind is None:  # no report: the run's end decides
            if end.get("killed") == "timeout":
                return dict(record, status="timeout", error="time limit exceeded")
            if end.get("killed") == "output_limit" or end.get("err_size", 0) > min(cap, file_cap - 1):
                return dict(record, status="output_limit", error="output limit exceeded")
            if end.get("signal") == signal.SIGKILL and end.get("oom"):
                return dict(record, status="memory_limit", error="memory limit of the process tree exceeded")
            if end.get("signal") is not None:
                return dict(record, status="crashed", signal=end["signal"], error=f"killed by signal {end['signal']}")
            if job["mode"] == "stdin":  # it exited by itself (os._exit) during this test: its status is the test's
                if len(stdout) > cap:
                    return dict(record, status="output_limit", error="output limit exceeded")
                return dict(
                    record,
                    status="done",
                    exit_code=end.get("exit"),
                    stdout=stdout.decode("utf-8", "replace"),
                    error=f"program exited (code {end.get('exit')})" if end.get("exit") else None,
                )
            return dict(
                record,
                status="crashed",
                signal=None,
                exit_code=end.get("exit"),
                error=f"program exited (code {end.get('exit')}) before returning a result",
            )
        if kind == "bad":
            return dict(record, status="crashed", signal=None, error="the program sent a malformed report")
        if kind == "setup_err" or kind == "err":
            return dict(
                record,
                status="error",
                type=str(report.get("type"))[:100],
                error=str(report.get("msg"))[:500],
                phase=str(report.get("phase") or "test")[:20],
            )
        if kind == "big":  # the child's encoder stopped at the limit (see sandbox.protocol.encode_json)
            return dict(record, status="output_limit", error="the returned value exceeds the output limit")
        if kind == "done":
            if len(stdout) > cap:
                return dict(record, status="output_limit", error="output limit exceeded")
            text = stdout.decode("utf-8", errors="replace")
            # charged at its size in the reply: JSON writes a non-ASCII character (and U+FFFD for each
            # byte that is not UTF-8) as 6 bytes, so the raw byte count would let a reply grow 6-fold
            budget[0] -= _json_size(text)
            if budget[0] < 0:
                return dict(record, status="output_limit", error="the program's outputs exceed the reply budget")
            exit_code = report.get("exit")
            error = report.get("error")
            return dict(
                record,
                status="done",
                exit_code=exit_code if type(exit_code) is int else 1,
                stdout=text,
                error=str(error)[:500] if error else None,
            )
        size = len(json.dumps(report.get("v")))  # the size it takes in the reply (the child's frame may be forged)
        budget[0] -= size
        budget[1] -= _count_nodes(report.get("v"), budget[1] + 1)
        if budget[0] < 0 or budget[1] < 0 or size > cap:
            return dict(record, status="output_limit", error="the program's outputs exceed the reply budget")
        return dict(record, status="ok", value=report.get("v"))


def _failed(record: dict) -> bool:
    """A test this process already knows failed (an error, a limit, a crash, a non-zero exit); a wrong value
    or a wrong output is known only to the judge."""
    status = record.get("status")
    return status not in ("ok", "done") or (status == "done" and record.get("exit_code") != 0)


MAX_REPLY_NODES = MAX_FRAME_NODES  # a frame over it is never parsed (sandbox.protocol.parse_frames)

# The reports a program process writes (sandbox.harness), field by field: a field's allowed types, or
# None for any JSON value. Anything else on the result channel was written by the program itself.
_ANY = None
_SETUP_ERROR: dict[str, tuple[type, ...] | None] = {"k": (str,), "type": (str,), "msg": (str,), "phase": (str,)}
_CALL_REPORTS: dict[str, dict[str, tuple[type, ...] | None]] = {
    "val": {"k": (str,), "i": (int,), "v": _ANY},
    "big": {"k": (str,), "i": (int,)},
    "err": {"k": (str,), "i": (int,), "type": (str,), "msg": (str,)},
}
_STDIN_REPORTS: dict[str, dict[str, tuple[type, ...] | None]] = {
    "done": {"k": (str,), "i": (int,), "exit": (int,), "error": (str, type(None))},
}


def _well_formed(message: dict, schema: dict[str, tuple[type, ...] | None]) -> bool:
    """Exactly the schema's fields, each of an allowed exact type (a bool is no int here)."""
    if message.keys() != schema.keys():
        return False
    return all(types is None or type(message[key]) in types for key, types in schema.items())


def _valid_strings(record: dict) -> dict:
    """The record's texts (error, exception name, phase, stdout: the program chose them) as valid
    Unicode, so that nothing downstream (tool output, sample files, tokenizers) meets a lone surrogate."""
    return {k: valid_text(v) if type(v) is str else v for k, v in record.items()}


def _count_nodes(value: object, limit: int) -> int:
    """JSON nodes of a decoded value, counted up to `limit` (then `limit`)."""
    stack, count = [value], 0
    while stack and count < limit:
        item = stack.pop()
        count += 1
        if type(item) is list:
            stack.extend(item)
        elif type(item) is dict:
            stack.extend(item.values())
    return count


def _json_size(text: str) -> int:
    return len(json.encoder.encode_basestring_ascii(text))  # the escaper json.dumps uses
