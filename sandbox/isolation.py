"""The sandbox worker's operating-system layer (standard library only; see `sandbox.worker` for the design).

System calls the standard library lacks (mount, pivot_root, unshare, prctl, memfd), the isolation built
once per worker as root (the memory cgroup, the private network namespace, the minimal read-only root
file system, fresh tmpfs scratch per program), `remove_tree` for what a program left in basic mode, and
the state every process starts from (`prepare_template`: scrubbed environment, fresh standard streams,
destructive functions disabled), prepared once in the supervisor before the zygote forks.
"""

from __future__ import annotations

import ctypes
import errno
import io
import os
import resource
import signal
import sys

# The worker disables these in itself (children inherit the disabled state for free) and keeps
# references for its own use, bound before that (os_*: the os function itself).
os_fork, os_kill, os_setsid = os.fork, os.kill, os.setsid
os_setuid, os_setgid, os_chown, os_chmod, os_unlink, os_rmdir = (
    os.setuid,
    os.setgid,
    os.chown,
    os.chmod,
    os.unlink,
    os.rmdir,
)

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


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _umount(target: str) -> None:
    _check(_libc.umount2(target.encode(), MNT_DETACH), f"umount {target}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def _pivot_root(new_root: str) -> None:
    import platform

    number = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}.get(platform.machine(), 155)
    os.chdir(new_root)
    _check(0 if _libc.syscall(number, b".", b".") == 0 else -1, "pivot_root")
    _umount(".")  # the old root, stacked on top of the new one by pivot_root(".", ".")
    os.chdir("/")


def prctl(option: int, value: int) -> None:
    _libc.prctl(option, value, 0, 0, 0)


# The kernel keyrings (add_key, request_key, keyctl) are per uid, not per namespace: every program
# of a worker shares its uid's user keyring, which outlives them, so a key one program stores the
# next could read (and in basic mode they are the user's own keys). Programs never need them: a
# seccomp filter set before the program runs makes these calls fail with EPERM. The same filter
# refuses sockets of every family but AF_UNIX (programs have no network; an inet socket could only
# bind ports or move the network namespace's counters, state a next program could read): the only
# state a program can leave in its worker's network namespace is then a unix socket, which the
# supervisor sees in the namespace's /proc/net/unix (`Supervisor._network_left_clean`). Numbers per
# architecture; any other architecture's calls (the 32-bit and x32 ABIs) are refused outright.
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_KEYRING_SYSCALLS = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}
_SOCKET_SYSCALLS = {"x86_64": (41, 53), "aarch64": (198, 199)}  # socket, socketpair
KEYRING_FILTER_MACHINES = frozenset(_KEYRING_SYSCALLS)
AF_UNIX = 1
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def keyring_filter(machine: str) -> list[tuple[int, int, int, int]]:
    """The classic-BPF seccomp program (code, jt, jf, k) that refuses the keyring calls and sockets of
    any family but AF_UNIX (pure)."""
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EPERM  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    calls, sockets = _KEYRING_SYSCALLS[machine], _SOCKET_SYSCALLS[machine]
    k = len(calls)
    program = [(ld_abs, 0, 0, 4), (jeq, 1, 0, _AUDIT_ARCH[machine]), (ret, 0, 0, deny), (ld_abs, 0, 0, 0)]
    # positions: 4 the x32 test, 5.. the keyring calls, 5+k and 6+k the socket calls, 7+k allow,
    # 8+k the family check (9+k), 10+k allow, 11+k deny
    program.append((jge, 6 + k, 0, 0x40000000))  # x32 numbers: to the deny
    program += [(jeq, 11 + k - (5 + j + 1), 0, nr) for j, nr in enumerate(calls)]  # a match: to the deny
    program += [(jeq, 2, 0, sockets[0]), (jeq, 1, 0, sockets[1]), (ret, 0, 0, allow)]
    program += [(ld_abs, 0, 0, 16), (jeq, 0, 1, AF_UNIX)]  # args[0], its low word (little-endian): the family
    return program + [(ret, 0, 0, allow), (ret, 0, 0, deny)]


def deny_keyrings() -> None:
    """Install `keyring_filter` on this process and everything it starts (inherited, irrevocable)."""
    import platform

    if platform.machine() not in KEYRING_FILTER_MACHINES:  # no numbers for it: run without (the pool warns)
        return
    program = keyring_filter(platform.machine())
    filters = (_SockFilter * len(program))(*(_SockFilter(*op) for op in program))
    fprog = _SockFprog(len(program), filters)
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def close_from(first: int) -> None:
    """Close every fd >= first: close_range(2) where the kernel has it, else one by one."""
    if _libc.syscall(436, ctypes.c_uint(first), ctypes.c_uint(0xFFFFFFFF), ctypes.c_uint(0)) != 0:
        os.closerange(first, resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def memfd(name: str, data: bytes = b"") -> int:
    fd = os.memfd_create(name)
    if data:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    return fd


def read_all(fd: int, cap: int) -> bytes:
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
                    os_rmdir(f"{base}/{name}")  # fails (and stays) while a process is still inside
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
            os_rmdir(self.path)
        except OSError:
            pass


class CpuGroup:
    """A CPU cgroup for one worker's programs: its weight equals every other worker's, so one program's
    busy children get its worker's share of the CPUs, not the machine's (cgroup v2's `cpu` controller,
    or v1's `cpu` plus `cpuacct`). Its usage counter is what a test's time is charged against
    (`sandbox.supervisor`): the program's CPU time, which a neighbour's load does not inflate."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.usage_path = ""
        with open("/proc/self/cgroup") as handle:
            lines = handle.read().splitlines()
        hierarchies = {}  # controller -> cgroup folder of this process
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if controllers == "":
                if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
                    hierarchies["unified"] = f"/sys/fs/cgroup{path}"
                continue
            for controller in controllers.split(","):
                mount = f"/sys/fs/cgroup/{controllers}"
                if os.path.isdir(mount):
                    hierarchies[controller] = f"{mount}{path}"
        name = f"tgrpo-sandbox-{os.getpid()}"
        if "cpu" in hierarchies and "cpuacct" in hierarchies:  # v1
            for base in dict.fromkeys((hierarchies["cpu"], hierarchies["cpuacct"])):
                self.paths.append(self._make(base, name))
            self.usage_path = f"{self.paths[-1]}/cpuacct.usage"
            self.scale = 1  # nanoseconds
        elif "unified" in hierarchies:  # v2: the cpu controller must be enabled for the children of the parent
            base = hierarchies["unified"]
            with open(f"{base}/cgroup.controllers") as handle:
                if "cpu" not in handle.read().split():
                    raise OSError("no cpu controller")
            try:
                with open(f"{base}/cgroup.subtree_control", "w") as handle:
                    handle.write("+cpu")
            except OSError:
                pass
            self.paths.append(self._make(base, name))
            self.usage_path = f"{self.paths[-1]}/cpu.stat"
            self.scale = 1000  # usage_usec
        else:
            raise OSError("no cpu cgroup")
        self.usage_ns()  # readable, or OSError now

    @staticmethod
    def _make(base: str, name: str) -> str:
        Cgroup._remove_stale(base)
        path = f"{base.rstrip('/')}/{name}"
        try:
            os.mkdir(path)
        except FileExistsError:
            pass
        return path

    def usage_ns(self) -> int:
        """CPU time used by every process ever in the group, in nanoseconds."""
        with open(self.usage_path, "rb") as handle:
            data = handle.read()
        if self.scale == 1:
            return int(data)
        for line in data.splitlines():
            key, _, value = line.partition(b" ")
            if key == b"usage_usec":
                return int(value) * 1000
        raise OSError("no usage_usec in cpu.stat")

    def procs_paths(self) -> list[str]:
        return [f"{path}/cgroup.procs" for path in self.paths]

    def remove(self) -> None:
        for path in self.paths:
            try:
                os_rmdir(path)
            except OSError:
                pass


def isolate_worker() -> None:
    """The supervisor's own isolation: a private network namespace (inherited by every program)."""
    unshare(CLONE_NEWNET)


def build_root(hide: list[str], keep: list[str], holder: dict) -> dict:
    """In the zygote: enter a private mount namespace and pivot into a minimal root file system.

    The new root is a tmpfs holding read-only bind mounts of the system folders, the Python
    installation (`keep`), a few device nodes and empty mount points for scratch space and /proc.
    Whatever is not listed does not exist for a program. `hide` paths that fall inside an exposed
    folder are covered. Keep folders under a scratch folder (a project cloned into /tmp) are
    re-exposed after every scratch mount from the fds left in `holder`.
    """
    unshare(CLONE_NEWNS)
    mount("none", "/", None, MS_REC | MS_PRIVATE, None)
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
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=4m")
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
        mount(f"/proc/self/fd/{sources[path]}", root + path, None, MS_BIND | MS_REC, None)
        mount(None, root + path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
        os.close(sources[path])
    for name, fd in devices.items():
        with open(f"{root}/dev/{name}", "w"):
            pass
        mount(f"/proc/self/fd/{fd}", f"{root}/dev/{name}", None, MS_BIND, None)
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
                mount("tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "mode=755,size=4k")
            else:
                mount(f"{root}/dev/null", root + path, None, MS_BIND, None)
            covered.append(path)
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)  # replaced per program
    mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
    _pivot_root(root)
    holder["scratch_keeps"] = {
        k: os.open(k, os.O_PATH | os.O_DIRECTORY) for k in sources if any(_under(k, s) for s in SCRATCH)
    }
    return {"exposed": sorted(sources), "hidden": covered}


def fresh_scratch(tmp_size_mb: int, scratch_keeps: dict[str, int], mounts: list[str]) -> None:
    """New, empty tmpfs on the scratch folders (root, in the program's own mount namespace). Nobody
    ever walks them: they vanish with the namespace when the program's last process is gone.

    Keep folders below a scratch folder (a checkout in /tmp) are opened again here, before the
    tmpfs covers them: a bind mount whose source fd was opened in another mount namespace (the
    zygote's `scratch_keeps`) fails with EINVAL."""
    keeps = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in scratch_keeps}
    for path in mounts:
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={tmp_size_mb}m")
    for path, fd in keeps.items():
        os.makedirs(path, mode=0o755, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, None)
        mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
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
                        os_unlink(entry, dir_fd=parent_fd)
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
                    os_unlink(item.name, dir_fd=fd)
                except OSError:
                    pass
            if subdir is not None and len(stack) < 100_000:
                stack.append((fd, subdir, None))
                continue
            os.close(fd)
            stack.pop()
            try:
                os_rmdir(entry, dir_fd=parent_fd)
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


def fresh_stdio(stderr: bool = True) -> None:
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
    """A scrubbed environment, fresh standard streams, default SIGPIPE, a high recursion
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
    fresh_stdio()
    sys.setrecursionlimit(10000)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    # SIGINT stays ignored here (a terminal's Ctrl-C is the parent's to handle); each program process
    # restores Python's default handler for itself
    _reliability_guard()


def address_space_now() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0
