"""The sandbox worker: the untrusted side's host, a pre-started process that runs programs.

Started by `sandbox.pool` as `python -I worker.py IN_FD OUT_FD` (standard
library only; the wire format is `sandbox.protocol`, the one module both sides import). Linux only.

Trust boundary. The worker never receives expected outputs: it is sent the program, the test
*inputs* (stdin texts, call arguments, the expressions of MBPP asserts) and limits, and it sends
back what the program produced (stdout bytes, return values encoded as tagged JSON, errors) and
what the supervisor measured (times, exit statuses, kills). The verdict is made in the judging
process (`sandbox.judge`).

Processes (only the last one runs untrusted code):

    supervisor (talks to the parent, holds jobs and results, times every run, never forks a program)
      -> zygote (forked before the first job: its memory never holds a job or a result; it only
         clones, reaps, and, as root, lives in a minimal read-only root file system)
           -> program process, one per run (cloned ahead as a spare; as root, PID 1 of its own PID,
              mount and IPC namespaces; takes its one job, joins the memory cgroup's limits, drops
              to the sandbox uid, closes every inherited fd, writes the ready byte, runs tests)

A run is all tests of a program in one process; a test left without a report within its
`test_timeout` re-runs alone in a fresh process (see `Supervisor`).

Isolation per program process:
- the run's clock starts at the ready byte the harness writes before any untrusted code; nothing
  the program sends can move it;
- as root: a PID namespace (killing its PID 1 ends every process of it), an IPC namespace, fresh
  tmpfs scratch on /tmp (with /var/tmp and /dev/shm), dropped with the namespace and never walked
  by root, a minimal root file system (the interpreter, its libraries and /etc read-only, a few
  device nodes, nothing else: no home folders, no project, no task files, no host sockets, no
  writable host folder), no network (the supervisor's private network namespace), a dedicated
  uid, and a memory cgroup that bounds the whole process tree (memfds, tmpfs files and forked
  children included) where the host offers one;
- rlimits: address space, CPU time, file size, process count, open files, no core dumps;
- only its stdio, its result channel (fd 3) and, in stdin mode, its tests' memfds are open;
- destructive os/shutil/subprocess functions set to None (defense in depth, not the wall).
Without root the namespaces, uid and cgroup are skipped ("basic" isolation): programs still get
their own processes and a fresh working directory, cleaned as the same unprivileged user.
Not covered: kernel exploits and CPU side channels.
"""

from __future__ import annotations

import ctypes
import fcntl
import gc
import io
import json
import math
import os
import resource
import select
import signal
import socket
import sys
import tempfile
import time
from typing import Any

if __package__:  # imported as sandbox.worker (tests)
    from sandbox.protocol import FrameBuffer, encode_value, read_message, write_message
else:  # run as a script by the pool: `python -I` puts neither the project nor this folder on sys.path
    sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
    from protocol import FrameBuffer, encode_value, read_message, write_message  # type: ignore[no-redef]

    del sys.path[0]

# The worker disables these in itself (children inherit the disabled state for free) and keeps
# private references for its own use.
_fork, _kill, _killpg, _setsid = os.fork, os.kill, os.killpg, os.setsid
_setuid, _setgid, _chown, _chmod, _unlink, _rmdir = os.setuid, os.setgid, os.chown, os.chmod, os.unlink, os.rmdir

# --------------------------------------------------------------------------------------------
# System calls and constants
# --------------------------------------------------------------------------------------------

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x08000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG = 36, 1
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _umount(target: str) -> None:
    _check(_libc.umount2(target.encode(), MNT_DETACH), f"umount {target}")


def _unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def _pivot_root(new_root: str) -> None:
    import platform

    number = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}.get(platform.machine(), 155)
    os.chdir(new_root)
    _check(0 if _libc.syscall(number, b".", b".") == 0 else -1, "pivot_root")
    _umount(".")  # the old root, stacked on top of the new one by pivot_root(".", ".")
    os.chdir("/")


def _prctl(option: int, value: int) -> None:
    _libc.prctl(option, value, 0, 0, 0)


def _close_from(first: int) -> None:
    """Close every fd >= first: close_range(2) where the kernel has it, else one by one."""
    if _libc.syscall(436, ctypes.c_uint(first), ctypes.c_uint(0xFFFFFFFF), ctypes.c_uint(0)) != 0:
        os.closerange(first, resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _memfd(name: str, data: bytes = b"") -> int:
    fd = os.memfd_create(name)
    if data:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _read_all(fd: int, cap: int) -> bytes:
    """Up to `cap` bytes of a memfd from its start."""
    chunks, offset = [], 0
    while offset < cap:
        chunk = os.pread(fd, min(cap - offset, 1 << 22), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


# --------------------------------------------------------------------------------------------
# Isolation built once per worker (root only)
# --------------------------------------------------------------------------------------------

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
DEVICES = ("null", "zero", "full", "random", "urandom")
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")


class Cgroup:
    """A memory cgroup for one worker's test processes (v2, or v1's memory controller)."""

    def __init__(self) -> None:
        self.path, self.version = self._create()
        self.procs_fd: int | None = None
        self.limit = -1

    @staticmethod
    def _create() -> tuple[str, int]:
        with open("/proc/self/cgroup") as handle:
            lines = handle.read().splitlines()
        v2_root = "/sys/fs/cgroup"
        candidates = []
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if controllers == "" and os.path.exists(f"{v2_root}/cgroup.controllers"):
                try:
                    with open(f"{v2_root}{path}/cgroup.controllers") as handle:
                        if "memory" in handle.read().split():
                            candidates.append((f"{v2_root}{path}", 2))
                except OSError:
                    pass
            elif "memory" in controllers.split(","):
                candidates.append((f"{v2_root}/memory{path}", 1))
        for base, version in candidates:
            Cgroup._remove_stale(base)
            path = f"{base.rstrip('/')}/tgrpo-sandbox-{os.getpid()}"
            try:
                os.mkdir(path)
            except FileExistsError:
                pass
            except OSError:
                continue
            return path, version
        raise OSError("no writable memory cgroup")

    @staticmethod
    def _remove_stale(base: str) -> None:
        """Empty cgroups of workers that were killed before they could remove theirs."""
        try:
            names = os.listdir(base)
        except OSError:
            return
        for name in names:
            owner = name.removeprefix("tgrpo-sandbox-")
            if owner != name and owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
                try:
                    _rmdir(f"{base}/{name}")  # fails (and stays) while a process is still inside
                except OSError:
                    pass

    def _write(self, name: str, value: str) -> bool:
        try:
            with open(f"{self.path}/{name}", "w") as handle:
                handle.write(value)
            return True
        except OSError:
            return False

    def set_limit(self, limit_bytes: int) -> None:
        if limit_bytes == self.limit:
            return
        if self.version == 2:
            self._write("memory.max", str(limit_bytes))
            self._write("memory.swap.max", "0")
        else:  # memsw (memory + swap) must stay >= the memory limit while both change
            if not self._write("memory.limit_in_bytes", str(limit_bytes)):
                self._write("memory.memsw.limit_in_bytes", str(limit_bytes))
                self._write("memory.limit_in_bytes", str(limit_bytes))
            self._write("memory.memsw.limit_in_bytes", str(limit_bytes))
        self.limit = limit_bytes

    def oom_kills(self) -> int:
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            with open(f"{self.path}/{name}") as handle:
                for line in handle:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def remove(self) -> None:
        try:
            _rmdir(self.path)
        except OSError:
            pass


def isolate_worker() -> None:
    """The supervisor's own isolation: a private network namespace (inherited by every program)."""
    _unshare(CLONE_NEWNET)


def build_root(hide: list[str], keep: list[str], holder: dict) -> dict:
    """In the zygote: enter a private mount namespace and pivot into a minimal root file system.

    The new root is a tmpfs holding read-only bind mounts of the system folders, the Python
    installation (`keep`), a few device nodes and empty mount points for scratch space and /proc.
    Whatever is not listed does not exist for a program. `hide` paths that fall inside an exposed
    folder are covered. Keep folders under a scratch folder (a project cloned into /tmp) are
    re-exposed after every scratch mount from the fds left in `holder`.
    """
    _unshare(CLONE_NEWNS)
    _mount("none", "/", None, MS_REC | MS_PRIVATE, None)
    keep_real = sorted({os.path.realpath(k) for k in keep if os.path.isdir(k)})
    links, sources = {}, {}
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            links[path] = os.readlink(path)
        elif os.path.isdir(path):
            sources[path] = os.open(path, os.O_PATH | os.O_DIRECTORY)
    for path in keep_real:
        if not any(_under(path, s) for s in sources):
            sources[path] = os.open(path, os.O_PATH | os.O_DIRECTORY)
    devices = {name: os.open(f"/dev/{name}", os.O_PATH) for name in DEVICES if os.path.exists(f"/dev/{name}")}
    root = "/tmp"  # any folder: the tmpfs is private to this mount namespace and becomes "/"
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=4m")
    # One tmpfs per program serves all three scratch folders (/var/tmp and /dev/shm link to /tmp:
    # one mount instead of three), unless the Python installation itself lives below one of them.
    separate = any(_under(k, s) for k in keep_real for s in SCRATCH[1:])
    holder["scratch_mounts"] = list(SCRATCH) if separate else ["/tmp"]
    for path in ("/proc", "/dev", "/var", *holder["scratch_mounts"]):
        os.makedirs(root + path, mode=0o755, exist_ok=True)
    if not separate:
        for path in SCRATCH[1:]:
            os.symlink("/tmp", root + path)
    for path, target in links.items():
        os.symlink(target, root + path)
    for path in keep:  # a virtualenv reached through a symlink (sys.path names the link, not its target)
        current = ""
        for part in os.path.abspath(path).split("/")[1:]:
            current += "/" + part
            if os.path.islink(current) and not os.path.lexists(root + current):
                os.makedirs(root + os.path.dirname(current), mode=0o755, exist_ok=True)
                os.symlink(os.readlink(current), root + current)
    for path in sorted(sources):
        os.makedirs(root + path, mode=0o755, exist_ok=True)
        _mount(f"/proc/self/fd/{sources[path]}", root + path, None, MS_BIND | MS_REC, None)
        _mount(None, root + path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
        os.close(sources[path])
    for name, fd in devices.items():
        with open(f"{root}/dev/{name}", "w"):
            pass
        _mount(f"/proc/self/fd/{fd}", f"{root}/dev/{name}", None, MS_BIND, None)
        os.close(fd)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"{root}/dev/{name}")
    covered = []
    for path in sorted({os.path.realpath(h) for h in hide}):
        inside = any(_under(path, s) and path != s for s in sources) and not any(_under(k, path) for k in keep_real)
        if inside and os.path.lexists(root + path):
            if os.path.isdir(root + path):
                _mount("tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "mode=755,size=4k")
            else:
                _mount(f"{root}/dev/null", root + path, None, MS_BIND, None)
            covered.append(path)
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)  # replaced per program
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
    _pivot_root(root)
    holder["scratch_keeps"] = {
        k: os.open(k, os.O_PATH | os.O_DIRECTORY) for k in sources if any(_under(k, s) for s in SCRATCH)
    }
    return {"exposed": sorted(sources), "hidden": covered}


def _fresh_scratch(tmp_size_mb: int, scratch_keeps: dict[str, int], mounts: list[str]) -> None:
    """New, empty tmpfs on the scratch folders (root, in the program's own mount namespace). Nobody
    ever walks them: they vanish with the namespace when the program's last process is gone.

    Keep folders below a scratch folder (a checkout in /tmp) are opened again here, before the
    tmpfs covers them: a bind mount whose source fd was opened in another mount namespace (the
    zygote's `scratch_keeps`) fails with EINVAL."""
    keeps = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in scratch_keeps}
    for path in mounts:
        _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={tmp_size_mb}m")
    for path, fd in keeps.items():
        os.makedirs(path, mode=0o755, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, None)
        _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
        os.close(fd)


def remove_tree(path: str) -> None:
    """rm -rf without following symlinks and without recursion (a deep tree cannot overflow the
    stack): directories are opened relative to their parent with O_NOFOLLOW. Used only in basic
    isolation, by a process of the program's own uid. Never raises."""
    try:
        parent = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    name = os.path.basename(path)
    stack: list[tuple[int, str, int | None]] = [
        (parent, name, None)
    ]  # (dir fd of the parent, entry name, fd of the entry once opened)
    try:
        while stack:
            parent_fd, entry, fd = stack[-1]
            if fd is None:
                try:
                    fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
                except OSError:
                    try:
                        _unlink(entry, dir_fd=parent_fd)
                    except OSError:
                        pass
                    stack.pop()
                    continue
                stack[-1] = (parent_fd, entry, fd)
            subdir = None
            for item in os.scandir(fd):
                if item.is_dir(follow_symlinks=False):
                    subdir = item.name
                    break
                try:
                    _unlink(item.name, dir_fd=fd)
                except OSError:
                    pass
            if subdir is not None and len(stack) < 100_000:
                stack.append((fd, subdir, None))
                continue
            os.close(fd)
            stack.pop()
            try:
                _rmdir(entry, dir_fd=parent_fd)
            except OSError:
                pass
    finally:
        for _, _, fd in stack:
            if fd is not None:
                os.close(fd)
        os.close(parent)


# --------------------------------------------------------------------------------------------
# The state every process starts from (prepared once in the supervisor, before the zygote forks)
# --------------------------------------------------------------------------------------------


_DISABLED = {
    "os": (
        "kill",
        "killpg",
        "system",
        "remove",
        "removedirs",
        "rmdir",
        "fchdir",
        "setuid",
        "fork",
        "forkpty",
        "rename",
        "renames",
        "truncate",
        "replace",
        "unlink",
        "fchmod",
        "fchown",
        "chmod",
        "chown",
        "chroot",
        "lchown",
        "execv",
        "execve",
        "execvp",
        "execvpe",
        "execl",
        "execle",
        "execlp",
        "execlpe",
        "spawnv",
        "spawnve",
        "spawnvp",
        "spawnvpe",
        "posix_spawn",
        "posix_spawnp",
        "setsid",
        "setpgid",
    ),
    "shutil": ("rmtree", "move", "chown"),
    "subprocess": ("Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput"),
}


def _reliability_guard() -> None:
    """Disable destructive functions inside the program (defense in depth only)."""
    import shutil
    import subprocess

    modules = {"os": os, "shutil": shutil, "subprocess": subprocess}
    for module_name, names in _DISABLED.items():
        for name in names:
            if hasattr(modules[module_name], name):
                setattr(modules[module_name], name, None)
    import builtins

    builtins.help = None  # type: ignore[assignment]
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None  # type: ignore[assignment]


def _fresh_stdio(stderr: bool = True) -> None:
    """New sys.std* objects on fds 0-2 (inherited objects may hold buffered bytes of another owner)."""
    sys.stdin = io.TextIOWrapper(
        io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8", errors="replace"
    )
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8", errors="replace"
    )
    if stderr:
        sys.stderr = io.TextIOWrapper(
            io.BufferedWriter(io.FileIO(2, "w", closefd=False)), encoding="utf-8", errors="replace", line_buffering=True
        )
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc,assignment]


def prepare_template(workdir: str) -> None:
    """A scrubbed environment, fresh standard streams, default signal dispositions, a high recursion
    limit, and destructive functions disabled. The worker itself uses the private references above."""
    os.environ.clear()
    os.environ.update(
        {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": workdir,
            "TMPDIR": workdir,
            "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8",
            "OPENBLAS_NUM_THREADS": "1",
        }
    )
    _fresh_stdio()
    sys.setrecursionlimit(10000)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _reliability_guard()


_BASE_ADDRESS_SPACE = 0  # the worker's own address space after preloading; set in main()


def _address_space_now() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


# --------------------------------------------------------------------------------------------
# The program process: harness prefix (trusted) and program body (untrusted)
# --------------------------------------------------------------------------------------------

_HARNESS_FAILED = 125  # exit code of a program process whose harness prefix failed (before the ready byte)
_RESULT_FD, _READY_FD, _STDIO_BASE = 3, 4, 10  # stdin mode: k-th test of the run reads fd 10 + 2k, writes 11 + 2k


def _enter_program(ctx: dict, job: dict, workdir: str, fds: dict[int, int]) -> None:
    """Before any untrusted code: fds, limits, uid, working directory."""
    if ctx["cgroup"]:  # born in the worker's memory cgroup: the program is the one the OOM killer takes
        with open("/proc/self/oom_score_adj", "w") as handle:
            handle.write("1000")
    lifted = {target: fcntl.fcntl(source, fcntl.F_DUPFD, max(fds) + 1) for target, source in fds.items()}
    for target, source in lifted.items():
        os.dup2(source, target)
    _close_from(max(fds) + 1)  # nothing inherited survives: no pipe to the supervisor, no other job's fd
    limits = job["limits"]
    memory = limits["memory_mb"] * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (_BASE_ADDRESS_SPACE + memory,) * 2)
    cpu = int(math.ceil(limits["total_timeout"])) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_size_mb"] * 1024 * 1024,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(fds) + 128,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    uid = ctx["uid"]
    if uid is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"],) * 2)
        os.setgroups([])
        _setgid(uid)
        _setuid(uid)
    else:  # without a dedicated uid the count includes the user's other processes
        n = _process_count(os.getuid()) + limits["max_processes"]
        resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
    _setsid()
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after the uid change, which clears it
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


PRELUDE = (
    "import sys, os, math, re, string, heapq, bisect, itertools, functools, collections, operator, random\n"
    "from typing import *\n"
    "from collections import *\n"
    "from itertools import *\n"
    "from functools import *\n"
    "from math import *\n"
    "from heapq import *\n"
    "from bisect import *\n"
)


def _child_calls(job: dict) -> None:
    """Program body for assert/call tests: set up once, then report one value per test on fd 3."""
    send = write_message  # bound before the program runs and can rebind module globals
    namespace: dict = {"__name__": "__solution__", "__builtins__": __builtins__}
    try:
        exec(compile(PRELUDE if job.get("prelude") else "", "<prelude>", "exec"), namespace)  # noqa: S102 - running the program is the sandbox's job
        code = compile(job["code"], "<solution>", "exec")
    except SyntaxError as exc:
        send(
            _RESULT_FD,
            {"k": "setup_err", "type": "SyntaxError", "msg": f"line {exc.lineno}: {exc.msg}", "phase": "compile"},
        )
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
            send(_RESULT_FD, {"k": "val", "i": index, "v": encode_value(value)})
        except BaseException as exc:  # noqa: BLE001
            send(_RESULT_FD, {"k": "err", "i": index, "type": type(exc).__name__, "msg": _trim(exc)})


def _child_stdin(job: dict) -> None:
    """Program body for stdin tests: run the program as __main__ once per test, each test on its own
    stdin/stdout memfds, and report each test's exit status on fd 3 (the output stays in the memfd)."""
    send, dup2, fresh_stdio = write_message, os.dup2, _fresh_stdio  # bound before the program can patch them
    try:
        code = compile(job["code"], "<solution>", "exec")
    except SyntaxError as exc:
        send(
            _RESULT_FD,
            {"k": "setup_err", "type": "SyntaxError", "msg": f"line {exc.lineno}: {exc.msg}", "phase": "compile"},
        )
        return
    for k, index in enumerate(job["run"]):
        dup2(_STDIO_BASE + 2 * k, 0)
        dup2(_STDIO_BASE + 2 * k + 1, 1)
        fresh_stdio(stderr=False)
        status, error = 0, None
        try:
            exec(code, {"__name__": "__main__", "__builtins__": __builtins__})  # noqa: S102 - running the program is the sandbox's job
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


def _trim(exc: BaseException, limit: int = 300) -> str:
    try:
        text = str(exc)
    except BaseException:  # noqa: BLE001 - __str__ is the program's code
        text = "?"
    return text if len(text) <= limit else text[:limit] + "..."


def _recv_fds_all(sock: socket.socket) -> tuple[dict, list[int]]:
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


def _program_process(ctx: dict, handoff_fd: int) -> None:
    """The cloned child: PID 1 of fresh PID, mount and IPC namespaces (as root). Prepares its scratch
    space while it waits, as a spare, for its one job; then takes the job's fds from the supervisor,
    sets its own limits, signals ready and runs the program's tests of this run."""
    exit_ = os._exit
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if ctx["namespaces"]:
            _fresh_scratch(ctx["tmp_size_mb"], ctx["scratch_keeps"], ctx["scratch_mounts"])
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        handoff = socket.socket(fileno=handoff_fd)
        request, fds = _recv_fds_all(handoff)
        if not request:  # the supervisor dropped this spare
            exit_(0)
        handoff.close()
        job_fd, ready, res, err, outs = fds[0], fds[1], fds[2], fds[3], fds[4:]
        job = json.loads(_read_all(job_fd, os.fstat(job_fd).st_size))
        os.close(job_fd)
        stdin_mode = job["mode"] == "stdin"
        if ctx["namespaces"]:
            workdir = "/tmp"
        else:
            workdir = tempfile.mkdtemp(dir=ctx["base"])
            if ctx["uid"] is not None:
                _chown(workdir, ctx["uid"], ctx["uid"])
        layout = {0: os.open(os.devnull, os.O_RDONLY), 1: err, 2: err, _RESULT_FD: res, _READY_FD: ready}
        if stdin_mode:
            for k, index in enumerate(job["run"]):
                layout[_STDIO_BASE + 2 * k] = _memfd("in", job["inputs"][index].encode("utf-8"))
                layout[_STDIO_BASE + 2 * k + 1] = outs[k]
        _enter_program(ctx, job, workdir, layout)
        _fresh_stdio()
        os.write(_READY_FD, b"R")  # from here on, everything this process does is the program's
        os.close(_READY_FD)
    except BaseException:  # noqa: BLE001 - the harness failed before any untrusted code ran
        exit_(_HARNESS_FAILED)
    try:
        (_child_stdin if stdin_mode else _child_calls)(job)
        sys.stdout.flush()
    finally:
        exit_(0)


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


def _join_cgroup(ctx: dict) -> None:
    """The zygote joins the memory cgroup once: every process it clones is born inside it (moving
    each program process in would cost a cgroup migration, milliseconds, per program). Its own
    pages stay charged where they were; program processes raise their OOM score to the maximum, so
    the OOM killer takes them first (lowering the zygote's score needs CAP_SYS_RESOURCE)."""
    os.write(ctx["cgroup_fd"], b"%d" % os.getpid())
    os.close(ctx["cgroup_fd"])


def _zygote(ctx: dict, sock: socket.socket) -> None:
    """Serve the supervisor's requests (clone a spare, sweep) and reap ended children, all from one
    loop. SIGCHLD only wakes the loop (its C-level handler writes a byte to a pipe the loop selects
    on); reaping and the exit notes happen here, never inside a signal handler, so nothing is sent
    to the supervisor from a handler that interrupted another send.

    An ended program can still be seen as a zombie for a while, measured under load (2 cores, load
    11-16): the zygote, runnable with SIGCHLD pending, waits for a CPU (the batteries run at nice 19),
    or the program's main thread has exited while another of its threads is still exiting, and the
    kernel notifies the parent (and lets it reap) only when the last thread is gone. Neither is a
    lost wake-up, and polling cannot shorten either."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)  # basic isolation: orphans of a program land here, to be swept
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # the wake-up byte is the signal
    flags = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC if ctx["namespaces"] else 0
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
            request, fds = _recv_fds_all(sock)
        except InterruptedError:
            continue
        except OSError:  # the supervisor is gone
            _zygote_exit()
        if not request:
            _zygote_exit()
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
                _program_process(ctx, fds[0])
                os._exit(_HARNESS_FAILED)
            # the child cannot be reaped (and its pid reused) before this: only this loop reaps
            pidfd = os.pidfd_open(pid)
        except OSError as exc:
            sock.send(json.dumps({"k": "pid", "pid": None, "error": str(exc)}).encode())
        finally:
            if pid != 0:
                for fd in fds:
                    os.close(fd)
        if pidfd is not None:
            socket.send_fds(sock, [json.dumps({"k": "pid", "pid": pid}).encode()], [pidfd])
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
                _kill(kid, signal.SIGKILL)
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
        helper = _fork()
        if helper == 0:
            try:
                _setgid(ctx["uid"])
                _setuid(ctx["uid"])
                _kill(-1, signal.SIGKILL)  # every process this uid may signal, except itself
            finally:
                os._exit(0)
        _wait_child(helper)
    for _ in range(1000):
        kids = _children()
        if not kids:
            break
        for kid in kids:
            try:
                _kill(kid, signal.SIGKILL)
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
        helper = _fork()
        if helper == 0:
            try:
                _setgid(ctx["uid"])
                _setuid(ctx["uid"])
                remove_tree(path)
            finally:
                os._exit(0)
        _wait_child(helper)
        try:
            _rmdir(path)
        except OSError:
            pass


def _wait_child(pid: int) -> None:
    """waitpid that tolerates the child having been reaped already."""
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


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

    def __init__(self, zygote_sock: socket.socket, cgroup: Cgroup | None, base: str | None, parent_fd: int) -> None:
        self.zygote, self.cgroup, self.base, self.parent_fd = zygote_sock, cgroup, base, parent_fd
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
        job_fd = _memfd("job", json.dumps(dict(job, run=indices)).encode("utf-8"))
        ready_r, ready_w = os.pipe()
        res_r, res_w = os.pipe()
        err = _memfd("err")
        outs = [_memfd(f"out{i}") for i in indices] if stdin_mode else []
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
            if not ready:
                end["harness"] = True
            deadline = min(start + limits["test_timeout"], program_deadline)
            frames = FrameBuffer(4 * cap)
            os.set_blocking(res_r, False)
            previous = start
            exited = not ready
            while ready and not exited and len(reports) < len(indices):
                left = deadline - time.monotonic()
                if left <= 0:
                    end["killed"] = "timeout"
                    break
                for fd in _wait_readable([res_r, pidfd, self.parent_fd], left):
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
                        if self._accept(message, indices, reports, now - previous):
                            previous = now
            killed = self._kill(pidfd)
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
                            self._accept(message, indices, reports, time.monotonic() - previous)
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
            if end.get("harness") and end["exit"] == _HARNESS_FAILED:
                raise HarnessError("the sandbox could not set up the program's process")
            if end.get("harness"):
                raise HarnessError(f"the program's process ended before the harness was ready ({status})")
            if stdin_mode:
                for k, index in enumerate(indices):
                    data = _read_all(outs[k], cap + 1)
                    reports.setdefault(index, {})["stdout"] = data
        finally:
            if not killed:  # whatever went wrong above, nothing of the program outlives this run
                self._kill(pidfd)
                _wait_readable([pidfd], 10.0)
            for fd in (ready_r, res_r, err, pidfd, *outs):
                os.close(fd)
        return reports, end

    @staticmethod
    def _kill(pidfd: int) -> bool:
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
    def _accept(message: object, indices: list[int], reports: dict, elapsed: float) -> bool:
        if not isinstance(message, dict):
            return False
        kind, index = message.get("k"), message.get("i")
        if kind == "setup_err":  # the program failed before its first test: every test of the run fails so
            for i in indices:
                reports.setdefault(
                    i,
                    {
                        "k": "setup_err",
                        "type": message.get("type"),
                        "msg": message.get("msg"),
                        "phase": message.get("phase"),
                        "time": elapsed,
                    },
                )
            return True
        if kind in ("val", "err", "done") and type(index) is int and index in indices and index not in reports:
            reports[index] = dict(message, time=elapsed)
            return True
        return False

    # ---------------------------------------------------------------- a whole job

    def run_job(self, job: dict) -> dict:
        limits = job["limits"]
        start = time.monotonic()
        program_deadline = start + limits["total_timeout"]
        n = len(job["inputs"]) if job["mode"] == "stdin" else len(job["tests"])
        if self.cgroup is not None:  # the program's whole process tree (its memfds and tmpfs files included)
            self.cgroup.set_limit((limits["memory_mb"] + 64) * 1024 * 1024)
        tests: dict[int, dict] = {}
        budget = [64 << 20]  # bytes of values and outputs one reply may carry
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
            for index in run:
                if index in reports and (reports[index].get("k") or not together):
                    tests[index] = self._record(job, reports[index], end, budget)
                elif not together or len(run) == 1:
                    tests[index] = self._record(job, reports.get(index, {}), end, budget)
            pending = [i for i in pending if i not in tests]
            together = False
        return {
            "id": job.get("id"),
            "tests": [tests[i] for i in range(n)],
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
        if kind == "setup_err" or kind == "err":
            return dict(
                record,
                status="error",
                type=str(report.get("type"))[:100],
                error=str(report.get("msg"))[:500],
                phase=str(report.get("phase") or "test")[:20],
            )
        if kind == "done":
            if len(stdout) > cap:
                return dict(record, status="output_limit", error="output limit exceeded")
            budget[0] -= len(stdout)
            if budget[0] < 0:
                return dict(record, status="output_limit", error="the program's outputs exceed the reply budget")
            exit_code = report.get("exit")
            error = report.get("error")
            return dict(
                record,
                status="done",
                exit_code=exit_code if type(exit_code) is int else 1,
                stdout=stdout.decode("utf-8", errors="replace"),
                error=str(error)[:500] if error else None,
            )
        size = len(json.dumps(report.get("v")))
        budget[0] -= size
        if budget[0] < 0 or size > 4 * cap:
            return dict(record, status="output_limit", error="the program's outputs exceed the reply budget")
        return dict(record, status="ok", value=report.get("v"))


def main(argv: list[str]) -> int:
    in_fd, out_fd = int(argv[1]), int(argv[2])
    init = read_message(in_fd)
    if not isinstance(init, dict):
        return 1
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # die with the parent
    info: dict = {"isolation": "basic", "uid": None}
    root = os.geteuid() == 0
    cgroup, namespaces = None, False
    if root and init.get("isolate", True):
        try:
            isolate_worker()
            namespaces = True
        except OSError as exc:
            info["isolation_error"] = str(exc)
        try:
            cgroup = Cgroup()
            info["memory_cgroup"] = cgroup.path
        except OSError as exc:
            info["memory_cgroup"] = None
            info["cgroup_error"] = str(exc)
    if root:
        info["uid"] = init.get("uid_base", 200000) + os.getpid()
    # Import what solutions commonly use once here, so each program process starts warm.
    for name in init.get("preload", []):
        try:
            __import__(name)
        except ImportError:
            pass
    global _BASE_ADDRESS_SPACE
    base = None if namespaces else tempfile.mkdtemp(prefix="tgrpo-sandbox-")
    if base is not None and info["uid"] is not None:
        _chmod(base, 0o711)
    prepare_template(base if base is not None else "/tmp")
    _BASE_ADDRESS_SPACE = _address_space_now() + 64 * 1024 * 1024  # headroom for the child's own setup
    ctx = {
        "namespaces": namespaces,
        "uid": info["uid"],
        "tmp_size_mb": init.get("tmp_size_mb", 512),
        "scratch_keeps": {},
        "scratch_mounts": list(SCRATCH),
        "cgroup_fd": None,
        "cgroup": cgroup is not None,
        "base": base,
    }
    if cgroup is not None:
        ctx["cgroup_fd"] = os.open(f"{cgroup.path}/cgroup.procs", os.O_WRONLY)
    # Move every object created so far out of the garbage collector's sight: a collection in a
    # forked child would otherwise touch (and copy) every page of the worker's heap.
    gc.collect()
    gc.freeze()
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    zygote = _fork()
    if zygote == 0:  # before any job: the zygote's memory holds the init message only
        mine.close()
        for fd in (in_fd, out_fd):
            os.close(fd)
        try:
            if ctx["cgroup_fd"] is not None:
                _join_cgroup(ctx)
            if namespaces:
                info.update(build_root(init.get("hide", []), init.get("keep", []), ctx))
            theirs.send(json.dumps({"ok": True, **info}).encode())
        except BaseException as exc:  # noqa: BLE001
            theirs.send(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}).encode())
            os._exit(1)
        _zygote(ctx, theirs)
        os._exit(0)
    theirs.close()
    if ctx["cgroup_fd"] is not None:
        os.close(ctx["cgroup_fd"])
    hello = json.loads(mine.recv(1 << 16) or b'{"ok": false, "error": "zygote exited"}')
    if not hello.get("ok"):
        write_message(out_fd, {"k": "failed", "error": hello.get("error")})
        return 1
    info.update({k: v for k, v in hello.items() if k != "ok"})
    info["isolation"] = "namespaces" if namespaces else "basic"
    info["helper_pids"] = [zygote]
    write_message(out_fd, {"k": "ready", **info})
    supervisor = Supervisor(mine, cgroup, base, in_fd)
    if base is None:
        supervisor.spawn_spare()
    try:
        while True:
            job = read_message(in_fd)
            if not isinstance(job, dict):  # None: the parent closed the pipe
                return 0
            try:
                result = supervisor.run_job(job)
            except ParentClosed:
                return 0
            except Exception as exc:  # noqa: BLE001 - report a harness failure instead of dying
                result = {"id": job.get("id"), "sandbox_error": f"{type(exc).__name__}: {exc}"}
            del job
            write_message(out_fd, result)
            del result
            if os.waitpid(zygote, os.WNOHANG)[0]:  # a worker without its zygote is useless: let the pool replace it
                return 1
    finally:
        for spare in supervisor.spares:
            spare.close()  # a spare waiting for a job exits on this
        mine.close()
        try:
            os.waitpid(zygote, 0)
        except ChildProcessError:  # already reaped above
            pass
        if cgroup is not None:
            cgroup.remove()
        if base is not None:
            remove_tree(base)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
