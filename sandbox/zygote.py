"""The zygote: clones program processes from a state that never saw a job (standard library only).

Forked by the worker before its first job, it serves the supervisor's requests over a socket (clone a
spare program process with `_clone`, in fresh PID, mount and IPC namespaces as root; move to a fresh
network namespace when a program left a socket in its own; sweep what a program left in basic mode)
and reaps ended children, all from one loop (`run_zygote`).
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import socket
import time
from typing import Any

from sandbox.harness import HARNESS_FAILED, program_process, recv_fds_all
from sandbox.isolation import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    PR_SET_CHILD_SUBREAPER,
    PR_SET_PDEATHSIG,
    os_fork,
    os_kill,
    os_rmdir,
    os_setgid,
    os_setuid,
    prctl,
    remove_tree,
    unshare,
)

# --------------------------------------------------------------------------------------------
# The zygote: clones program processes from a state that never saw a job
# --------------------------------------------------------------------------------------------

_py_syscall = ctypes.PyDLL(None, use_errno=True).syscall  # keeps the GIL across clone (the child returns holding it)
_py_syscall.restype = ctypes.c_long
_SYS_CLONE = {"x86_64": 56, "aarch64": 220}


def _clone(flags: int) -> int:
    """fork() that also creates namespaces: the child is PID 1 of its new PID namespace, so
    killing it (or its exit) ends every process it started. Single-threaded callers only."""
    import platform

    number = _SYS_CLONE.get(platform.machine())
    if number is None:
        raise OSError("clone with namespaces is wired for x86_64 and aarch64 only")
    # x86_64: clone(flags, stack, parent_tid, child_tid, tls); aarch64 has the same order
    pid = _py_syscall(ctypes.c_long(number), ctypes.c_ulong(flags | signal.SIGCHLD), None, None, None, None)
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"clone: {os.strerror(err)}")
    return pid


def join_cgroup(ctx: dict) -> None:
    """The zygote joins the memory cgroup (and the CPU one) once: every process it clones is born inside it (moving
    each program process in would cost a cgroup migration, milliseconds, per program). Its own
    pages stay charged where they were; program processes raise their OOM score to the maximum, so
    the OOM killer takes them first (lowering the zygote's score needs CAP_SYS_RESOURCE)."""
    for fd in [ctx["cgroup_fd"], *ctx["cpu_fds"]]:
        if fd is not None:
            os.write(fd, b"%d" % os.getpid())
            os.close(fd)


def run_zygote(ctx: dict, sock: socket.socket) -> None:
    """Serve the supervisor's requests (clone a spare, sweep) and reap ended children, all from one
    loop. SIGCHLD only wakes the loop (its C-level handler writes a byte to a pipe the loop selects
    on); reaping and the exit notes happen here, never inside a signal handler, so nothing is sent
    to the supervisor from a handler that interrupted another send.

    An ended program can still be seen as a zombie for a while, measured under load (2 cores, load
    11-16): the zygote, runnable with SIGCHLD pending, waits for a CPU (the batteries run at nice 19),
    or the program's main thread has exited while another of its threads is still exiting, and the
    kernel notifies the parent (and lets it reap) only when the last thread is gone. Neither is a
    lost wake-up, and polling cannot shorten either."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    prctl(PR_SET_CHILD_SUBREAPER, 1)  # basic isolation: orphans of a program land here, to be swept
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # the wake-up byte is the signal
    flags = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC if ctx["namespaces"] else 0
    if ctx["namespaces"] and ctx["network"] == "per_program":
        # a fresh network namespace per program (where programs may open sockets of any family):
        # nothing a program leaves in one, a socket name, a bound port, a counter, reaches the next
        flags |= CLONE_NEWNET
    while True:
        try:
            watched: list[Any] = [sock, wake_r]
            readable, _, _ = select.select(watched, [], [])
        except InterruptedError:
            continue
        if wake_r in readable:
            _drain(wake_r)
            _reap(sock)
        if sock not in readable:
            continue
        try:
            request, fds = recv_fds_all(sock)
        except InterruptedError:
            continue
        except OSError:  # the supervisor is gone
            _zygote_exit()
        if not request:
            _zygote_exit()
        if request.get("k") == "renew_net":  # a program left a socket in this namespace: the next ones get a fresh one
            unshare(CLONE_NEWNET)
            sock.send(b'{"k": "renewed"}')
            continue
        if request.get("k") == "sweep":
            _sweep(ctx, request.get("workdirs", []), sock)
            sock.send(b'{"k": "swept"}')
            continue
        pid, pidfd = -1, None
        try:
            pid = _clone(flags)
            if pid == 0:
                signal.set_wakeup_fd(-1)
                os.close(wake_r)
                os.close(wake_w)
                sock.close()
                program_process(ctx, fds[0])
                os._exit(HARNESS_FAILED)
            # the child cannot be reaped (and its pid reused) before this: only this loop reaps
            pidfd = os.pidfd_open(pid)
        except OSError as exc:
            sock.send(json.dumps({"k": "pid", "pid": None, "error": str(exc)}).encode())
        finally:
            if pid != 0:
                for fd in fds:
                    os.close(fd)
        if pidfd is not None:
            try:
                socket.send_fds(sock, [json.dumps({"k": "pid", "pid": pid}).encode()], [pidfd])
            except OSError:  # the supervisor is gone (its pool closed while a spare was being cloned)
                _zygote_exit()
            os.close(pidfd)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _reap(sock: socket.socket) -> None:
    """Collect every ended child and tell the supervisor each one's exit status."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        try:
            sock.send(json.dumps({"k": "exit", "pid": pid, "status": status}).encode())
        except OSError:
            pass


def _zygote_exit() -> None:
    """Kill and reap every child (spares, a program being torn down) before going: none may be left
    as a zombie of an init that does not reap."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for _ in range(1000):
        for kid in _children():
            try:
                os_kill(kid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    os._exit(0)


def _children() -> list[int]:
    """Direct children of this process (orphaned descendants land here: it is a subreaper)."""
    me, kids = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    if int(handle.read().rsplit(b")", 1)[1].split()[1]) == me:
                        kids.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return kids


def _sweep(ctx: dict, workdirs: list[str], sock: socket.socket) -> None:
    """Basic isolation only (no PID namespace): kill and reap what a program left (its uid's
    processes, the orphans re-parented here), then remove its working directories with the
    program's own rights."""
    if ctx["uid"] is not None:
        helper = os_fork()
        if helper == 0:
            try:
                os_setgid(ctx["uid"])
                os_setuid(ctx["uid"])
                os_kill(-1, signal.SIGKILL)  # every process this uid may signal, except itself
            finally:
                os._exit(0)
        _wait_child(helper)
    for _ in range(1000):
        kids = _children()
        if not kids:
            break
        for kid in kids:
            try:
                os_kill(kid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.002)
        _reap(sock)
    for path in workdirs:
        if not path.startswith(ctx["base"] + "/"):
            continue
        if ctx["uid"] is None:
            remove_tree(path)
            continue
        helper = os_fork()
        if helper == 0:
            try:
                os_setgid(ctx["uid"])
                os_setuid(ctx["uid"])
                remove_tree(path)
            finally:
                os._exit(0)
        _wait_child(helper)
        try:
            os_rmdir(path)
        except OSError:
            pass


def _wait_child(pid: int) -> None:
    """waitpid that tolerates the child having been reaped already."""
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
