"""The sandbox worker: a clean, pre-started process that forks one child per untrusted program.

Started by `evaluation.code_executor` as `python -I sandbox_worker.py IN_FD OUT_FD` (standard
library only). Runs on Linux.

Trust boundary. This worker never receives expected outputs: it is sent the program, the test
*inputs* (stdin texts, call arguments, the left side of MBPP asserts) and limits, and it sends back
what the program produced (stdout bytes, return values encoded as tagged JSON, errors, timings).
The verdict is computed in the trusted parent. A child forked from this worker therefore holds no
secret in its memory, and whatever a program forges (fake result messages, patched builtins,
an `__eq__` that always answers True, success markers on stdout) is just more output that the
parent compares against values the program never saw.

Isolation per program (the child):
- its own session and process group; on a deadline the whole group is SIGKILLed, and when the
  worker runs as root, every process of the program's dedicated uid is killed too (this catches
  children that called setsid or double-forked), then orphans are reaped (the worker is a
  child subreaper);
- rlimits: address space, CPU time, file size, process count, open files, no core dumps;
- a fresh working directory, removed afterwards; a scrubbed environment; stdin from a memfd;
- as root: a dedicated unprivileged uid/gid (so process limits and file permissions hold), and
  the worker itself lives in private network and mount namespaces: no network interface but a
  downed loopback, private tmpfs on /tmp, /var/tmp and /dev/shm, and the configured secret paths
  (home folders, the project, the task files) covered by empty tmpfs; the Python installation is
  re-exposed read-only so imports still work;
- destructive os/shutil/subprocess functions set to None inside the program (defense in depth,
  not the wall: ctypes can still reach libc, which is why the limits above exist).
Not covered: kernel exploits, CPU side channels, reading other processes' command lines in /proc.
Without root the namespaces and uid switch are skipped and `isolation` reports "basic".
"""

from __future__ import annotations

import base64
import ctypes
import fcntl
import gc
import io
import json
import math
import os
import resource
import selectors
import signal
import struct
import sys
import tempfile
import time

# The worker disables these in itself (children inherit the disabled state for free) and keeps
# private references for its own use.
_fork, _kill, _killpg, _setsid = os.fork, os.kill, os.killpg, os.setsid
_setuid, _setgid, _chown, _chmod, _unlink, _rmdir = os.setuid, os.setgid, os.chown, os.chmod, os.unlink, os.rmdir

# --------------------------------------------------------------------------------------------
# Framing: 4-byte big-endian length + UTF-8 JSON. Shared with the parent (code_executor).
# --------------------------------------------------------------------------------------------

_HEADER = struct.Struct(">I")
MAX_MESSAGE = 256 * 1024 * 1024


def write_message(fd: int, obj: object) -> None:
    data = json.dumps(obj, allow_nan=True).encode("utf-8")
    payload = _HEADER.pack(len(data)) + data
    view = memoryview(payload)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks, remaining = [], n
    while remaining:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_message(fd: int) -> object | None:
    header = _read_exact(fd, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_MESSAGE:
        raise ValueError(f"message of {size} bytes exceeds the limit")
    body = _read_exact(fd, size)
    return None if body is None else json.loads(body)


class FrameBuffer:
    """Incremental decoder for framed messages arriving in arbitrary chunks (untrusted sender)."""

    def __init__(self, limit: int) -> None:
        self.buffer = bytearray()
        self.limit = limit
        self.total = 0

    def feed(self, chunk: bytes) -> list[object]:
        self.total += len(chunk)
        if self.total > self.limit:
            raise OverflowError("result channel exceeded its byte limit")
        self.buffer += chunk
        out = []
        while len(self.buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self.buffer)
            if len(self.buffer) < _HEADER.size + size:
                break
            body = bytes(self.buffer[_HEADER.size:_HEADER.size + size])
            del self.buffer[:_HEADER.size + size]
            try:
                out.append(json.loads(body))
            except (ValueError, UnicodeDecodeError):
                out.append({"k": "garbage"})
        return out


# --------------------------------------------------------------------------------------------
# Value encoding (runs in the untrusted child; decoding runs in the trusted parent)
# --------------------------------------------------------------------------------------------
# Plain JSON for None/bool/int/float/str/list; everything else tagged with "__t". Only exact
# builtin types are encoded as themselves; subclasses are converted through their base type
# (a Counter becomes a dict, a numpy scalar a number), and anything else becomes an opaque
# record that never equals an expected value.

_MAX_DEPTH = 200


def encode_value(value: object, depth: int = 0) -> object:
    if depth > _MAX_DEPTH:
        raise ValueError("value nested too deeply to compare")
    t = type(value)
    if value is None or t is bool or t is str:
        return value
    if t is int:
        return value
    if t is float:
        return value if math.isfinite(value) else {"__t": "float", "v": repr(value)}
    if t is list:
        return [encode_value(v, depth + 1) for v in value]
    if t is tuple:
        return {"__t": "tuple", "v": [encode_value(v, depth + 1) for v in value]}
    if t is dict:
        return {"__t": "dict", "v": [[encode_value(k, depth + 1), encode_value(v, depth + 1)] for k, v in value.items()]}
    if t is set or t is frozenset:
        return {"__t": t.__name__, "v": [encode_value(v, depth + 1) for v in value]}
    if t is bytes:
        return {"__t": "bytes", "v": base64.b64encode(value).decode("ascii")}
    if t is complex:
        return {"__t": "complex", "v": [value.real, value.imag]}
    module = getattr(t, "__module__", "")
    if module == "numpy" and hasattr(value, "tolist"):  # numpy scalars and arrays
        return encode_value(value.tolist(), depth + 1)
    for base in (bool, int, float, str, tuple, list, dict, frozenset, set, bytes):
        if isinstance(value, base):  # subclass: convert through the base type's constructor
            return encode_value(base(value), depth + 1)
    return {"__t": "object", "type": f"{module}.{getattr(t, '__qualname__', '?')}"}


class Opaque:
    """Decoded stand-in for a value that is not plain data: equal to nothing, falsy."""

    __slots__ = ("type_name",)

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

    def __eq__(self, other: object) -> bool:
        return False

    def __hash__(self) -> int:
        return id(self)

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<{self.type_name} object>"


def decode_value(data: object) -> object:
    """Inverse of encode_value, in the trusted parent: builds plain Python data only."""
    if isinstance(data, list):
        return [decode_value(v) for v in data]
    if not isinstance(data, dict):
        return data
    tag, v = data.get("__t"), data.get("v")
    if tag == "tuple":
        return tuple(decode_value(x) for x in v)
    if tag == "dict":
        return {_hashable(decode_value(k)): decode_value(x) for k, x in v}
    if tag in ("set", "frozenset"):
        items = frozenset(_hashable(decode_value(x)) for x in v)
        return items if tag == "frozenset" else set(items)
    if tag == "float":
        return float(v)
    if tag == "bytes":
        return base64.b64decode(v)
    if tag == "complex":
        return complex(v[0], v[1])
    return Opaque(str(data.get("type", "object")))


def _hashable(value: object) -> object:
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value


# --------------------------------------------------------------------------------------------
# Isolation of the worker (root only) and of each child
# --------------------------------------------------------------------------------------------

CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG = 36, 1
_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def isolate_worker(hide: list[str], keep: list[str], tmp_size_mb: int) -> dict:
    """Enter private mount + network namespaces and build the filesystem view children see."""
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWNET), "unshare")
    _mount("none", "/", None, MS_REC | MS_PRIVATE, None)
    os.chdir("/")
    keep_real = sorted({os.path.realpath(k) for k in keep if os.path.isdir(k)})
    scratch = [p for p in ("/tmp", "/var/tmp", "/dev/shm") if os.path.isdir(p)]  # private, writable, emptied
    hide_real = sorted({os.path.realpath(h) for h in [*hide, *scratch] if os.path.exists(h)})
    # a hidden path inside another hidden path is already covered
    hide_real = [h for h in hide_real if not any(o != h and _under(h, o) for o in hide_real)]
    # Open what must stay visible before covering it: the project (and its virtualenv) may live
    # anywhere, /tmp included, and is re-exposed read-only inside the covering tmpfs.
    keep_fds = {k: os.open(k, os.O_PATH | os.O_DIRECTORY) for k in keep_real if any(_under(k, h) for h in hide_real)}
    hidden = []
    for path in hide_real:
        if path in scratch:
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={tmp_size_mb}m")
        elif os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=1m")
        else:
            _mount("/dev/null", path, None, MS_BIND, None)
        hidden.append(path)
    for path, fd in keep_fds.items():
        os.makedirs(path, mode=0o755, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, None)
        _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_REC, None)
        os.close(fd)
    return {"hidden": hidden, "kept": sorted(keep_fds)}


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


_BASE_ADDRESS_SPACE = 0  # the worker's own address space after preloading; set in main()


def _address_space_now() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


_DISABLED = {
    "os": ("kill", "killpg", "system", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork",
           "forkpty", "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown", "chmod", "chown",
           "chroot", "lchown", "execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe",
           "spawnv", "spawnve", "spawnvp", "spawnvpe", "posix_spawn", "posix_spawnp", "setsid", "setpgid"),
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

    builtins.help = None
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None  # type: ignore[assignment]


_STDIO_BASE = 10  # in a stdin-mode child, test i reads fd 10 + 2i (a memfd) and writes fd 11 + 2i


def _move_fds(fds: dict[int, int]) -> int:
    """dup2 sources onto targets safely (a source may sit on another target's number); close the rest."""
    high = max(fds) + 1
    lifted = {target: fcntl.fcntl(source, fcntl.F_DUPFD, high) for target, source in fds.items()}
    for target, source in lifted.items():
        os.dup2(source, target)
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    os.closerange(high, max(soft, high + 1))
    return high


def _fresh_stdio(stderr: bool = True) -> None:
    """New sys.std* objects on fds 0-2 (inherited objects may hold buffered bytes of another owner)."""
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8", errors="replace")
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8", errors="replace")
    if stderr:
        sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), encoding="utf-8",
                                      errors="replace", line_buffering=True)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr


def _enter_child(job: dict, workdir: str, fds: dict[int, int]) -> None:
    """In the forked child: wire fds, set limits, drop privileges. The environment, standard
    streams, signal dispositions and disabled functions were prepared once in the worker."""
    _setsid()
    high = _move_fds(fds)
    limits = job["limits"]
    cpu = int(math.ceil(limits["total_timeout"])) + 1
    address_space = _BASE_ADDRESS_SPACE + limits["memory_mb"] * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_size_mb"] * 1024 * 1024,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (high + 128,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    uid = job["uid"]
    if uid is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"],) * 2)
        os.setgroups([])
        _setgid(uid)
        _setuid(uid)
    else:  # without a dedicated uid the count includes the user's other processes
        n = _process_count(os.getuid()) + limits["max_processes"]
        resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
    os.chdir(workdir)


def prepare_template(workdir: str) -> None:
    """Make the worker's own state what every child should start from (done once, not per fork):
    a scrubbed environment, fresh standard streams, default signal dispositions, a high recursion
    limit, and destructive functions disabled. The worker itself uses the private references above."""
    os.environ.clear()
    os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir,
                       "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8", "OPENBLAS_NUM_THREADS": "1"})
    _fresh_stdio()
    sys.setrecursionlimit(10000)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _reliability_guard()


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
    """Child body for assert/call tests: set up once, then report one value per test on fd 3."""
    send = write_message  # bound before the program runs and can rebind module globals
    out_fd = 3
    namespace: dict = {"__name__": "__solution__", "__builtins__": __builtins__}
    try:
        exec(compile(PRELUDE if job.get("prelude") else "", "<prelude>", "exec"), namespace)
        code = compile(job["code"], "<solution>", "exec")
    except SyntaxError as exc:
        send(out_fd, {"k": "setup_err", "type": "SyntaxError", "msg": f"line {exc.lineno}: {exc.msg}", "phase": "compile"})
        return
    for phase, source in (("imports", job.get("imports", "")), ("program", None), ("setup", job.get("setup", ""))):
        try:
            exec(code if source is None else compile(source, f"<{phase}>", "exec"), namespace)
        except BaseException as exc:  # noqa: BLE001 - the program may raise anything, SystemExit included
            send(out_fd, {"k": "setup_err", "type": type(exc).__name__, "msg": _trim(exc), "phase": phase})
            return
    send(out_fd, {"k": "setup_ok"})
    fn_name = job.get("fn_name")
    for index in job["run"]:  # a test starts when the previous one reported (or at setup_ok)
        test = job["tests"][index]
        try:
            if test["kind"] == "expr":
                value = eval(compile(test["src"], "<test>", "eval"), namespace)
            elif test["kind"] == "exec":
                exec(compile(test["src"], "<test>", "exec"), namespace)
                value = True
            else:  # call: a plain function, or a method of a fresh Solution()
                target = namespace.get(fn_name)
                if "Solution" in namespace and isinstance(namespace["Solution"], type):
                    target = getattr(namespace["Solution"](), fn_name)
                if target is None:
                    raise NameError(f"name '{fn_name}' is not defined")
                value = target(*json.loads(test["args"]))
            send(out_fd, {"k": "val", "i": index, "v": encode_value(value)})
        except BaseException as exc:  # noqa: BLE001
            send(out_fd, {"k": "err", "i": index, "type": type(exc).__name__, "msg": _trim(exc)})


def _child_stdin(job: dict) -> None:
    """Child body for stdin tests: run the program as __main__ once per test, each test on its own
    stdin/stdout memfds, and report each test's exit status on fd 3 (the output stays in the memfd)."""
    send, dup2, fresh_stdio = write_message, os.dup2, _fresh_stdio  # bound before the program can patch them
    out_fd = 3
    try:
        code = compile(job["code"], "<solution>", "exec")
    except SyntaxError as exc:
        send(out_fd, {"k": "setup_err", "type": "SyntaxError", "msg": f"line {exc.lineno}: {exc.msg}", "phase": "compile"})
        return
    send(out_fd, {"k": "setup_ok"})
    for index in job["run"]:
        dup2(_STDIO_BASE + 2 * index, 0)
        dup2(_STDIO_BASE + 2 * index + 1, 1)
        fresh_stdio(stderr=False)
        status, error = 0, None
        try:
            exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if status:
                error = f"SystemExit: {exc.code}"
        except BaseException as exc:  # noqa: BLE001 - the program may raise anything
            status, error = 1, f"{type(exc).__name__}: {_trim(exc)}"
        try:
            sys.stdout.flush()
        except BaseException as exc:  # noqa: BLE001 - a closed or full stdout is the program's problem
            status, error = status or 1, error or f"{type(exc).__name__}: {_trim(exc)}"
        send(out_fd, {"k": "done", "i": index, "exit": status, "error": error})


def _trim(exc: BaseException, limit: int = 300) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + "..."


# --------------------------------------------------------------------------------------------
# Supervision (in the worker)
# --------------------------------------------------------------------------------------------


def _kill_all(pid: int, uid: int | None) -> None:
    """Kill the child's process group and, with a dedicated uid, every process of that uid."""
    try:
        _killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if uid is not None:
        helper = _fork()
        if helper == 0:
            try:
                _setgid(uid)
                _setuid(uid)
                _kill(-1, signal.SIGKILL)  # every process this uid may signal, except itself
            finally:
                os._exit(0)
        os.waitpid(helper, 0)


def _children() -> list[int]:
    """Direct children of this worker (orphaned descendants land here: we are a subreaper)."""
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


def _reap_all(deadline_s: float = 5.0) -> None:
    """Kill and reap every remaining descendant, including ones that left the process group."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                break
        kids = _children()
        if not kids:
            return
        for kid in kids:
            try:
                _kill(kid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.002)


def _supervise(pid: int, pipes: dict[str, int], deadline_fn, output_cap: int, results: FrameBuffer | None, on_message) -> dict:
    """Read the child's pipes until it exits or a limit is hit. Returns the raw outcome."""
    selector = selectors.DefaultSelector()
    pidfd = os.pidfd_open(pid)
    selector.register(pidfd, selectors.EVENT_READ, "exit")
    for name, fd in pipes.items():
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ, name)
    captured = {name: bytearray() for name in pipes if name != "results"}
    outcome = {"killed": None}

    def consume(name: str, chunk: bytes) -> str | None:
        """Route a chunk to the message decoder or the capped capture; return a limit hit, if any."""
        if name == "results":
            try:
                for message in results.feed(chunk):
                    on_message(message)
            except OverflowError:
                return "output_limit"
            return None
        buffer = captured[name]
        buffer += chunk
        if len(buffer) > output_cap:
            del buffer[output_cap:]
            return "output_limit"
        return None

    exited = False
    try:
        while not exited and not outcome["killed"]:
            remaining = deadline_fn() - time.monotonic()
            if remaining <= 0:
                outcome["killed"] = "timeout"
                break
            for key, _ in selector.select(timeout=remaining):
                if key.data == "exit":
                    exited = True
                    continue
                try:
                    chunk = os.read(key.fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                outcome["killed"] = consume(key.data, chunk)
                if outcome["killed"]:
                    break
        if exited and not outcome["killed"]:  # drain what the child wrote before exiting
            for name, fd in pipes.items():
                while not outcome["killed"]:
                    try:
                        chunk = os.read(fd, 1 << 16)
                    except (BlockingIOError, OSError):
                        break  # empty for now: descendants may hold the pipe open, do not wait for them
                    if not chunk:
                        break
                    outcome["killed"] = consume(name, chunk)
    finally:
        selector.close()
    outcome["captured"] = {k: bytes(v) for k, v in captured.items()}
    outcome["pidfd"] = pidfd
    return outcome


def _finish(pid: int, pidfd: int, uid: int | None) -> tuple[int | None, int | None]:
    """Kill everything left, reap the child; return (exit_code, signal)."""
    try:
        _killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _, status = os.waitpid(pid, 0)
    os.close(pidfd)
    # Every surviving descendant has been re-parented to this worker (a child subreaper), so "no
    # child left" proves nothing of the program survives; only then is the slow path skipped.
    try:
        os.waitpid(-1, os.WNOHANG)
        leftover = True  # some child exists (alive, or a zombie just reaped)
    except ChildProcessError:
        leftover = False
    if leftover:
        _kill_all(pid, uid)
        _reap_all()
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    return os.WEXITSTATUS(status), None


_WORKDIR = "/tmp/run"  # set in main(): one fixed path per worker, emptied after every program


def _make_workdir(uid: int | None) -> str:
    if os.path.lexists(_WORKDIR):
        _remove_tree(_WORKDIR)
    os.mkdir(_WORKDIR, 0o700)
    if uid is not None:
        _chown(_WORKDIR, uid, uid)
    return _WORKDIR


def _remove_tree(path: str) -> None:
    """rm -rf with the worker's private unlink/rmdir (the public ones are disabled)."""
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            try:
                _unlink(os.path.join(root, name))
            except OSError:
                pass
        for name in dirs:
            full = os.path.join(root, name)
            try:
                (_unlink if os.path.islink(full) else _rmdir)(full)
            except OSError:
                pass
    try:
        _rmdir(path)
    except OSError:
        pass


_HARNESS_FAILED = 125  # exit code of a child whose sandbox setup failed (not the program's fault)


def _memfd(name: str, data: bytes = b"") -> int:
    fd = os.memfd_create(name)
    if data:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    return fd


def run_tests(job: dict, deadline: float) -> dict:
    """Run a program's tests in one child, in order; after a test times out or kills the child,
    start a fresh child for the tests after it (each test is bounded, none is skipped)."""
    limits, uid, stdin_mode = job["limits"], job["uid"], job["mode"] == "stdin"
    n = len(job["inputs"]) if stdin_mode else len(job["tests"])
    io_fds: list[tuple[int, int]] = []
    if stdin_mode:  # every test gets its own stdin and stdout memfd, created once
        io_fds = [(_memfd(f"in{i}", text.encode("utf-8")), _memfd(f"out{i}")) for i, text in enumerate(job["inputs"])]
    results: dict[int, dict] = {}
    setup_error = None
    pending = list(range(n))
    output_tail = b""
    try:
        while pending and setup_error is None:
            if time.monotonic() >= deadline:
                for i in pending:
                    results[i] = {"status": "timeout", "error": "program time limit reached before this test ran"}
                break
            workdir = _make_workdir(uid)
            res_r, res_w = os.pipe()
            out_r, out_w = os.pipe()
            null = os.open(os.devnull, os.O_RDONLY)
            fds = {0: null, 1: out_w, 2: out_w, 3: res_w}
            for i in pending if stdin_mode else ():
                fds[_STDIO_BASE + 2 * i], fds[_STDIO_BASE + 2 * i + 1] = io_fds[i]
            state = {"current": None, "test_deadline": time.monotonic() + limits["test_timeout"], "setup_ok": False,
                     "times": {}}
            sub_job = dict(job, run=pending)
            pid = _fork()
            if pid == 0:
                try:
                    _enter_child(job, workdir, fds)
                except BaseException:  # noqa: BLE001 - the harness failed before any untrusted code ran
                    os._exit(_HARNESS_FAILED)
                try:
                    (_child_stdin if stdin_mode else _child_calls)(sub_job)
                    sys.stdout.flush()
                finally:
                    os._exit(0)
            for fd in (res_w, out_w, null):
                os.close(fd)

            def start_next(now: float, state=state, pending=pending) -> None:
                """Tests run in `pending` order: the next one starts when the previous one reports."""
                upcoming = [i for i in pending if i not in results]
                state["current"] = upcoming[0] if upcoming else None
                if upcoming:
                    state["times"][upcoming[0]] = now
                state["test_deadline"] = now + limits["test_timeout"]

            def on_message(message: dict, state=state, start_next=start_next) -> None:
                nonlocal setup_error
                if not isinstance(message, dict):
                    return
                kind, now = message.get("k"), time.monotonic()
                if kind == "setup_ok" and not state["setup_ok"]:
                    state["setup_ok"] = True
                    start_next(now)
                elif kind == "setup_err" and not state["setup_ok"]:
                    setup_error = {"type": str(message.get("type")), "msg": str(message.get("msg"))[:500],
                                   "phase": str(message.get("phase"))}
                elif kind in ("val", "err", "done") and state["current"] is not None and message.get("i") == state["current"]:
                    i = message["i"]
                    record = {"time": now - state["times"].get(i, now)}
                    if kind == "val":
                        record.update(status="ok", value=message.get("v"))
                    elif kind == "err":
                        record.update(status="error", type=str(message.get("type")), error=str(message.get("msg"))[:500])
                    else:
                        exit_code = message.get("exit")
                        record.update(status="done", exit_code=exit_code if isinstance(exit_code, int) else 1,
                                      error=str(message.get("error"))[:500] if message.get("error") else None)
                    results[i] = record
                    start_next(now)

            outcome = _supervise(pid, {"results": res_r, "output": out_r},
                                 lambda state=state: min(deadline, state["test_deadline"]),
                                 limits["output_bytes"], FrameBuffer(limits["output_bytes"] * 4), on_message)
            exit_code, sig = _finish(pid, outcome["pidfd"], uid)
            for fd in (res_r, out_r):
                os.close(fd)
            _remove_tree(workdir)
            output_tail = outcome["captured"]["output"][-1000:]
            if setup_error is not None:
                break
            remaining = [i for i in pending if i not in results]
            if not remaining:
                break
            if not state["setup_ok"] and exit_code == _HARNESS_FAILED:
                raise RuntimeError("the sandbox could not set up the child process")
            if not state["setup_ok"]:
                reason = outcome["killed"] or "exit"
                setup_error = {"type": {"timeout": "Timeout", "output_limit": "OutputLimit"}.get(reason, "ProgramExited"),
                               "msg": _describe_stop(outcome["killed"], exit_code, sig), "phase": "program"}
                break
            # The first test without a result is where the child stopped (timeout, crash, exit...).
            stopped_at = remaining[0]
            started = stopped_at in state["times"]
            results[stopped_at] = {"status": outcome["killed"] or "crashed", "signal": sig,
                                   "exit_code": exit_code if started else None,
                                   "error": _describe_stop(outcome["killed"], exit_code, sig),
                                   "time": time.monotonic() - state["times"].get(stopped_at, time.monotonic())}
            pending = remaining[1:]
        if stdin_mode:  # attach each test's output, read back from its memfd
            cap = limits["output_bytes"]
            for i, record in results.items():
                data = os.pread(io_fds[i][1], cap + 1, 0)
                record["stdout"] = data[:cap].decode("utf-8", errors="replace")
                if len(data) > cap:
                    record["status"] = "output_limit"
    finally:
        for pair in io_fds:
            for fd in pair:
                os.close(fd)
    return {"tests": [results.get(i, {"status": "not_run"}) for i in range(n)], "setup_error": setup_error,
            "output_tail": output_tail.decode("utf-8", errors="replace")}


def _describe_stop(killed: str | None, exit_code: int | None, sig: int | None) -> str:
    if killed == "timeout":
        return "time limit exceeded"
    if killed == "output_limit":
        return "output limit exceeded"
    if sig is not None:
        return f"killed by signal {signal.Signals(sig).name}"
    return f"program exited (code {exit_code}) before returning a result"


def run_job(job: dict) -> dict:
    limits = job["limits"]
    start = time.monotonic()
    deadline = start + limits["total_timeout"]
    result = run_tests(job, deadline)
    result["id"] = job.get("id")
    result["wall_time"] = time.monotonic() - start
    return result


def main(argv: list[str]) -> int:
    in_fd, out_fd = int(argv[1]), int(argv[2])
    init = read_message(in_fd)
    if not isinstance(init, dict):
        return 1
    _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl subreaper")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # a problem with many tests holds 2 memfds per test
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # die with the parent
    info: dict = {"isolation": "basic", "uid": None}
    if os.geteuid() == 0 and init.get("isolate", True):
        try:
            info.update(isolate_worker(init.get("hide", []), init.get("keep", []), init.get("tmp_size_mb", 512)))
            info["isolation"] = "namespaces"
        except OSError as exc:
            info["isolation_error"] = str(exc)
        info["uid"] = init.get("uid_base", 200000) + os.getpid()
    # Import what solutions commonly use once here, so each fork starts warm.
    for name in init.get("preload", []):
        try:
            __import__(name)
        except ImportError:
            pass
    global _BASE_ADDRESS_SPACE, _WORKDIR
    if info["isolation"] != "namespaces":  # /tmp is shared with the host: use a private folder in it
        _WORKDIR = os.path.join(tempfile.mkdtemp(prefix="tgrpo-sandbox-"), "run")
        if info["uid"] is not None:
            _chmod(os.path.dirname(_WORKDIR), 0o755)
    prepare_template(_WORKDIR)
    _BASE_ADDRESS_SPACE = _address_space_now() + 64 * 1024 * 1024  # headroom for the child's own setup
    # Move every object created so far out of the garbage collector's sight: a collection in a
    # forked child would otherwise touch (and copy) every page of the worker's heap.
    gc.collect()
    gc.freeze()
    write_message(out_fd, {"k": "ready", **info})
    uid = info["uid"]
    while True:
        job = read_message(in_fd)
        if job is None:
            return 0
        job["uid"] = uid
        try:
            result = run_job(job)
        except Exception as exc:  # noqa: BLE001 - report a harness failure instead of dying
            result = {"id": job.get("id"), "sandbox_error": f"{type(exc).__name__}: {exc}"}
        write_message(out_fd, result)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
