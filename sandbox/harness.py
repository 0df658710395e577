"""The program process: the trusted harness prefix and the untrusted program body (standard library only).

A program process is cloned by the zygote (`sandbox.zygote`) as a spare; `program_process` prepares its
scratch space, takes its one job's fds from the supervisor, sets its limits and uid (`_enter_program`),
writes the ready byte, and only then runs the program: `_child_calls` (assert and call tests: one
encoded value per test on the result channel) or `_child_stdin` (stdin tests: the program as `__main__`
once per test, each on its own memfds). Everything after the ready byte is the program's.
"""

from __future__ import annotations

import copy
import fcntl
import importlib.util  # here, in the worker, so that no program process pays for it
import json
import math
import os
import resource
import signal
import socket
import sys
import tempfile
from types import CodeType

from sandbox.isolation import (
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    PR_SET_PDEATHSIG,
    close_from,
    deny_keyrings,
    fresh_scratch,
    fresh_stdio,
    memfd,
    mount,
    os_chown,
    os_setgid,
    os_setsid,
    os_setuid,
    prctl,
    read_all,
)
from sandbox.protocol import (
    WRAPPABLE_ERRORS,
    ValueTooLarge,
    decode_value,
    encode_json,
    wrap_like_apps,
    write_frame,
    write_message,
)

# --------------------------------------------------------------------------------------------
# The program process: harness prefix (trusted) and program body (untrusted)
# --------------------------------------------------------------------------------------------

HARNESS_FAILED = 125  # exit code of a program process whose harness prefix failed (before the ready byte)
_RESULT_FD, _READY_FD, _STDIO_BASE = 3, 4, 10  # stdin mode: k-th test of the run reads fd 10 + 2k, writes 11 + 2k


def _enter_program(ctx: dict, job: dict, workdir: str, fds: dict[int, int]) -> None:
    """Before any untrusted code: fds, limits, uid, working directory."""
    if ctx["cgroup"]:  # born in the worker's memory cgroup: the program is the one the OOM killer takes
        with open("/proc/self/oom_score_adj", "w") as handle:
            handle.write("1000")
    lifted = {target: fcntl.fcntl(source, fcntl.F_DUPFD, max(fds) + 1) for target, source in fds.items()}
    for target, source in lifted.items():
        os.dup2(source, target)
    close_from(max(fds) + 1)  # nothing inherited survives: no pipe to the supervisor, no other job's fd
    limits = job["limits"]
    memory = limits["memory_mb"] * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (ctx["base_address_space"] + memory,) * 2)
    cpu = int(math.ceil(limits["total_timeout"])) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_size_mb"] * 1024 * 1024,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(fds) + 128,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    deny_keyrings()  # the one kernel store shared by a uid's processes that no namespace covers
    uid = ctx["uid"]
    if uid is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"],) * 2)
        os.setgroups([])
        os_setgid(uid)
        os_setuid(uid)
    else:  # without a dedicated uid the count includes the user's other processes
        n = _process_count(os.getuid()) + limits["max_processes"]
        resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
    os_setsid()
    # out of the terminal's group now: the program gets Python's Ctrl-C handler back (the worker ignores SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after the uid change, which clears it
    os.chdir(workdir)


def _process_count(uid: int) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += 1
            except OSError:
                pass
    return count


# APPS's import block (its harness, `eval/testing_util.py`, prepends it to every program, stdin and call
# alike), restated: a program of either APPS style may use these names without importing them, and no other.
# `np` is bound lazily (`_lazy_module`): numpy loads on the program's first use of it, so a program that
# never touches it pays nothing (an eager import costs ~0.25 s per program).
APPS_IMPORTS = (
    "import sys\n"
    "import time\n"
    "import itertools\n"
    "from itertools import accumulate, product, permutations, combinations\n"
    "import collections\n"
    "from collections import Counter, OrderedDict, deque, defaultdict, ChainMap\n"
    "from functools import lru_cache\n"
    "import math\n"
    "from math import sqrt, sin, cos, tan, ceil, fabs, floor, gcd, exp, log, log2\n"
    "import fractions\n"
    "from typing import List, Tuple\n"
    "import random\n"
    "import heapq\n"
    "from heapq import *\n"
)


_SPECS = {"numpy": importlib.util.find_spec("numpy")}  # looked up once, in the worker


def _lazy_module(name: str) -> object | None:
    """`name` as a module that loads on first attribute access (None when it is not installed)."""
    if name in sys.modules:
        return sys.modules[name]
    found = _SPECS.get(name) or importlib.util.find_spec(name)
    if found is None or found.loader is None:
        return None
    spec = copy.copy(found)  # this process's own: the loader becomes lazy
    loader = importlib.util.LazyLoader(found.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


_APPS_BASE: dict = {"__builtins__": __builtins__}
exec(compile(APPS_IMPORTS, "<apps-imports>", "exec"), _APPS_BASE)  # noqa: S102 - once, in the worker, before any program


def apps_namespace() -> dict:
    """The globals an APPS-style program starts with: the builtins and APPS's import block (bound once in the
    worker, copied per program), with `np` bound lazily in the program's own process."""
    namespace = dict(_APPS_BASE)
    numpy = _lazy_module("numpy")
    if numpy is not None:
        namespace["np"] = numpy
    return namespace


def _compile_program(job: dict) -> CodeType | None:
    """The program's code object, compiled here, in its own process and on its own clock (never in the
    judging process: a 200 KB program can hold a compiler, and so an interpreter lock, for ~10 s). A
    stdin program that compiles only inside a function (a top-level `return`) is wrapped as the APPS
    harness does when the job asks for it. On failure the compiler's message is reported as a
    compile-phase SyntaxError for every test (the judge's `syntax_error`) and None is returned."""
    source = job["code"]
    try:
        try:
            return compile(source, "<solution>", "exec", dont_inherit=True)
        except SyntaxError as exc:
            if not (job.get("wrap_like_apps") and any(e in str(exc.msg) for e in WRAPPABLE_ERRORS)):
                raise
            try:
                return compile(wrap_like_apps(source), "<solution>", "exec", dont_inherit=True)
            except SyntaxError:
                raise exc from None
    except SyntaxError as exc:
        message = f"line {exc.lineno}: {exc.msg}"
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, absurd nesting
        message = f"{type(exc).__name__}: {exc}"
    write_message(_RESULT_FD, {"k": "setup_err", "type": "SyntaxError", "msg": message, "phase": "compile"})
    return None


def _child_calls(job: dict) -> None:
    """Program body for assert/call tests: set up once, then report one value per test on fd 3."""
    send, encode, frame = write_message, encode_json, write_frame  # bound before the program can rebind them
    too_large = ValueTooLarge
    stop_early = bool(job.get("stop_at_first_failure"))
    limit = job["limits"]["output_bytes"]  # one value's encoded size, like one test's stdout
    namespace: dict = apps_namespace() if job.get("apps_imports") else {"__builtins__": __builtins__}
    namespace["__name__"] = "__solution__"
    code = _compile_program(job)
    if code is None:
        return
    if job.get("compile_only"):  # a syntax check for a trusted process: the program never runs
        for index in job["run"]:
            frame(_RESULT_FD, b'{"k": "val", "i": %d, "v": null}' % index)
        return
    for phase, source in (("imports", job.get("imports", "")), ("program", None), ("setup", job.get("setup", ""))):
        try:
            exec(code if source is None else compile(source, f"<{phase}>", "exec"), namespace)  # noqa: S102 - running the program is the sandbox's job
        except BaseException as exc:  # noqa: BLE001 - the program may raise anything, SystemExit included
            send(_RESULT_FD, {"k": "setup_err", "type": type(exc).__name__, "msg": _trim(exc), "phase": phase})
            return
    fn_name: str = job.get("fn_name")  # type: ignore[assignment]  # absent only for assert tests
    for index in job["run"]:
        test = job["tests"][index]
        try:
            if test["kind"] == "expr":
                # values computed in another process (a program-free input, a program's result), as plain data
                # (numpy values as numpy values where the test's imports loaded numpy)
                numpy = sys.modules.get("numpy")
                namespace.update({name: decode_value(data, 0, numpy) for name, data in test.get("bind", {}).items()})
                value = eval(compile(test["src"], "<test>", "eval"), namespace)
            elif test["kind"] == "exec":
                exec(compile(test["src"], "<test>", "exec"), namespace)  # noqa: S102 - running the program is the sandbox's job
                value = True
            else:  # call: a plain function, or a method of a fresh Solution()
                target = namespace.get(fn_name)
                if "Solution" in namespace and isinstance(namespace["Solution"], type):
                    target = getattr(namespace["Solution"](), fn_name)
                if target is None:
                    raise NameError(f"name '{fn_name}' is not defined")
                value = target(*json.loads(test["args"]))
            text = encode(value, limit)
            frame(_RESULT_FD, b'{"k": "val", "i": %d, "v": %s}' % (index, text.encode("ascii")))
        except too_large:
            send(_RESULT_FD, {"k": "big", "i": index})
        except BaseException as exc:  # noqa: BLE001
            send(_RESULT_FD, {"k": "err", "i": index, "type": type(exc).__name__, "msg": _trim(exc)})
            if stop_early:  # the supervisor marks the rest not run whatever comes after
                return


def _child_stdin(job: dict) -> None:
    """Program body for stdin tests: run the program as __main__ once per test, each test on its own
    stdin/stdout memfds, and report each test's exit status on fd 3 (the output stays in the memfd)."""
    send, dup2, reset_stdio = write_message, os.dup2, fresh_stdio  # bound before the program can patch them
    stop_early = bool(job.get("stop_at_first_failure"))
    code = _compile_program(job)
    if code is None:
        return
    base = apps_namespace() if job.get("apps_imports") else {"__builtins__": __builtins__}
    for k, index in enumerate(job["run"]):
        dup2(_STDIO_BASE + 2 * k, 0)
        dup2(_STDIO_BASE + 2 * k + 1, 1)
        reset_stdio(stderr=False)
        status, error = 0, None
        try:
            exec(code, {**base, "__name__": "__main__"})  # noqa: S102 - running the program is the sandbox's job
        except SystemExit as exc:
            status = 0 if exc.code is None else (exc.code if isinstance(exc.code, int) and 0 <= exc.code < 256 else 1)
            if status:
                error = f"SystemExit: {exc.code}"[:300]
        except BaseException as exc:  # noqa: BLE001 - the program may raise anything
            status, error = 1, f"{type(exc).__name__}: {_trim(exc)}"
        try:
            sys.stdout.flush()
        except BaseException as exc:  # noqa: BLE001 - a closed or full stdout is the program's problem
            status, error = status or 1, error or f"{type(exc).__name__}: {_trim(exc)}"
        send(_RESULT_FD, {"k": "done", "i": index, "exit": status, "error": error})
        if status and stop_early:
            return


def _trim(exc: BaseException, limit: int = 300) -> str:
    try:
        text = str(exc)
    except BaseException:  # noqa: BLE001 - __str__ is the program's code
        text = "?"
    return text if len(text) <= limit else text[:limit] + "..."


def recv_fds_all(sock: socket.socket) -> tuple[dict, list[int]]:
    """One request and its fds, which may span several messages (at most 253 fds per message)."""
    message, fds, _, _ = socket.recv_fds(sock, 1 << 12, 253)
    if not message:
        return {}, fds
    request = json.loads(message)
    while len(fds) < request.get("nfds", 0):
        _, more, _, _ = socket.recv_fds(sock, 1 << 12, 253)
        if not more:
            break
        fds += more
    return request, fds


def program_process(ctx: dict, handoff_fd: int) -> None:
    """The cloned child: PID 1 of fresh PID, mount and IPC namespaces (as root; a fresh network namespace too
    with `network="per_program"`). Prepares its scratch
    space while it waits, as a spare, for its one job; then takes the job's fds from the supervisor,
    sets its own limits, signals ready and runs the program's tests of this run."""
    exit_ = os._exit
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if ctx["namespaces"]:
            fresh_scratch(ctx["tmp_size_mb"], ctx["scratch_keeps"], ctx["scratch_mounts"])
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        handoff = socket.socket(fileno=handoff_fd)
        request, fds = recv_fds_all(handoff)
        if not request:  # the supervisor dropped this spare
            exit_(0)
        handoff.close()
        job_fd, ready, res, err, outs = fds[0], fds[1], fds[2], fds[3], fds[4:]
        job = json.loads(read_all(job_fd, os.fstat(job_fd).st_size))
        os.close(job_fd)
        stdin_mode = job["mode"] == "stdin"
        if ctx["namespaces"]:
            workdir = "/tmp"
        else:
            workdir = tempfile.mkdtemp(dir=ctx["base"])
            if ctx["uid"] is not None:
                os_chown(workdir, ctx["uid"], ctx["uid"])
        layout = {0: os.open(os.devnull, os.O_RDONLY), 1: err, 2: err, _RESULT_FD: res, _READY_FD: ready}
        if stdin_mode:
            for k, index in enumerate(job["run"]):
                layout[_STDIO_BASE + 2 * k] = memfd("in", job["inputs"][index].encode("utf-8"))
                layout[_STDIO_BASE + 2 * k + 1] = outs[k]
        _enter_program(ctx, job, workdir, layout)
        fresh_stdio()
        os.write(_READY_FD, b"R")  # from here on, everything this process does is the program's
        os.close(_READY_FD)
    except BaseException:  # noqa: BLE001 - the harness failed before any untrusted code ran
        exit_(HARNESS_FAILED)
    try:
        (_child_stdin if stdin_mode else _child_calls)(job)
        sys.stdout.flush()
    finally:
        exit_(0)
