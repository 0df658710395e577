"""The sandbox worker: the untrusted side's host, a pre-started process that runs programs.

Started by `sandbox.pool` as `python -I worker.py IN_FD OUT_FD` (standard
library only; the wire format is `sandbox.protocol`, the one module both sides import). Linux only.
This module is the entry point (`main`: set up isolation, fork the zygote, serve jobs); the pieces are
`sandbox.supervisor` (jobs and clocks), `sandbox.zygote` (clones program processes, reaps, sweeps),
`sandbox.harness` (the program process: harness prefix, then the program) and `sandbox.isolation`
(system calls, the root file system, the cgroup, the state every process starts from). None of them is
imported by the judging process.

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
  writable host folder), no network (unix sockets only, in the zygote's network namespace, which is replaced whenever a
  program leaves a socket in it), a dedicated
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

import gc
import json
import os
import platform
import resource
import signal
import socket
import sys
import tempfile

if not __package__:  # run as a script by the pool (`python -I`: neither the project nor this folder is on
    # sys.path): load this folder as the `sandbox` package, so the modules below import each other by name
    import importlib.util

    _here = os.path.dirname(os.path.realpath(__file__))
    _spec = importlib.util.spec_from_file_location(
        "sandbox", os.path.join(_here, "__init__.py"), submodule_search_locations=[_here]
    )
    assert _spec is not None and _spec.loader is not None
    sys.modules["sandbox"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["sandbox"])

# the package is loaded (above, or by the importer): the worker's own modules
from sandbox.isolation import (
    CLONE_NEWNET,
    KEYRING_FILTER_MACHINES,
    PR_SET_PDEATHSIG,
    SCRATCH,
    Cgroup,
    CpuGroup,
    address_space_now,
    build_root,
    isolate_worker,
    os_chmod,
    os_fork,
    prctl,
    prepare_template,
    remove_tree,
    unshare,
)
from sandbox.protocol import read_message, write_message
from sandbox.supervisor import ParentClosed, Supervisor
from sandbox.zygote import join_cgroup, run_zygote


def main(argv: list[str]) -> int:
    # A terminal's Ctrl-C reaches every process in its foreground group, this worker and its zygote too. The
    # parent decides what it means: it closes the job pipe (or dies, and PDEATHSIG follows). Programs reset it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    in_fd, out_fd = int(argv[1]), int(argv[2])
    init = read_message(in_fd)
    if not isinstance(init, dict):
        return 1
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # die with the parent
    info: dict = {"isolation": "basic", "uid": None}
    root = os.geteuid() == 0
    cgroup, namespaces = None, False
    cpu: CpuGroup | None = None
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
        if init.get("cpu_cgroup", True):
            try:
                cpu = CpuGroup()
                info["cpu_cgroup"] = cpu.paths[0]
            except (OSError, ValueError) as exc:
                info["cpu_cgroup"] = None
                info["cpu_cgroup_error"] = str(exc)
    if root:
        info["uid"] = init.get("uid_base", 200000) + os.getpid()
    # Import what solutions commonly use once here, so each program process starts warm.
    for name in init.get("preload", []):
        try:
            __import__(name)
        except ImportError:
            pass
    base = None if namespaces else tempfile.mkdtemp(prefix="tgrpo-sandbox-")
    if base is not None and info["uid"] is not None:
        os_chmod(base, 0o711)
    prepare_template(base if base is not None else "/tmp")
    ctx = {
        "base_address_space": address_space_now() + 64 * 1024 * 1024,  # headroom for the child's own setup
        "namespaces": namespaces,
        "uid": info["uid"],
        "tmp_size_mb": init.get("tmp_size_mb", 512),
        "scratch_keeps": {},
        "scratch_mounts": list(SCRATCH),
        "cgroup_fd": None,
        "cgroup": cgroup is not None,
        # without the filter that confines programs to unix sockets, only a fresh namespace per program
        # keeps one program's network state from the next
        "network": init.get("network", "renewed") if platform.machine() in KEYRING_FILTER_MACHINES else "per_program",
        "base": base,
    }
    if cgroup is not None:
        ctx["cgroup_fd"] = os.open(f"{cgroup.path}/cgroup.procs", os.O_WRONLY)
    # the zygote joins the CPU cgroup(s) too: every program is born inside, charged to its worker
    ctx["cpu_fds"] = [os.open(path, os.O_WRONLY) for path in cpu.procs_paths()] if cpu is not None else []
    # Move every object created so far out of the garbage collector's sight: a collection in a
    # forked child would otherwise touch (and copy) every page of the worker's heap.
    gc.collect()
    gc.freeze()
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    zygote = os_fork()
    if zygote == 0:  # before any job: the zygote's memory holds the init message only
        mine.close()
        for fd in (in_fd, out_fd):
            os.close(fd)
        try:
            if ctx["cgroup_fd"] is not None or ctx["cpu_fds"]:
                join_cgroup(ctx)
            if namespaces:
                # a network namespace of the zygote's own: only programs' sockets can ever be in it
                # (the supervisor's are in the worker's), so the supervisor sees any a program leaves
                unshare(CLONE_NEWNET)
                info.update(build_root(init.get("hide", []), init.get("keep", []), ctx))
            theirs.send(json.dumps({"ok": True, **info}).encode())
        except BaseException as exc:  # noqa: BLE001
            theirs.send(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}).encode())
            os._exit(1)
        run_zygote(ctx, theirs)
        os._exit(0)
    theirs.close()
    for fd in [ctx["cgroup_fd"], *ctx["cpu_fds"]]:
        if fd is not None:
            os.close(fd)
    hello = json.loads(mine.recv(1 << 16) or b'{"ok": false, "error": "zygote exited"}')
    if not hello.get("ok"):
        write_message(out_fd, {"k": "failed", "error": hello.get("error")})
        return 1
    info.update({k: v for k, v in hello.items() if k != "ok"})
    info["isolation"] = "namespaces" if namespaces else "basic"
    info["helper_pids"] = [zygote]
    write_message(out_fd, {"k": "ready", **info})
    supervisor = Supervisor(mine, cgroup, base, in_fd, cpu)
    # after each run the supervisor checks the zygote's network namespace and has it replaced when a
    # program left a socket there (see Supervisor._keep_network_clean)
    supervisor.watch_network = zygote if namespaces and ctx["network"] == "renewed" else None
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
        if cpu is not None:
            cpu.remove()
        if base is not None:
            remove_tree(base)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
