"""One writer per output folder: an exclusive `flock` on `<folder>/.tgrpo-run.lock`, held while a run writes there.

Two trainings started into one folder would interleave `metrics.jsonl` and overwrite each other's checkpoints,
and both would exit 0. The first run takes the lock and writes who it is (pid, host, start time, command line)
into the lock file; a second run finds the lock held and is refused in one line that names the first. The
kernel drops a `flock` when its process dies, so a killed run never leaves a stale lock behind. Standard
library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_NAME = ".tgrpo-run.lock"


class FolderBusyError(RuntimeError):
    """Another live process holds the folder's run lock; the message names it."""


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return "another process"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("started", 0)))
    return f"pid {info.get('pid', '?')} on {info.get('host', '?')}, started {started}: {info.get('command', '?')}"


def refuse_if_busy(folder: str | Path) -> None:
    """FolderBusyError when another process holds `folder`'s run lock; creates and writes nothing.

    A run checks this before it reads the folder: the checkpoints a live run is writing are not an earlier run.
    """
    path = Path(folder) / LOCK_NAME
    try:
        handle = path.open("r", encoding="utf-8")
    except OSError:
        return  # no lock file: nobody has run here
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FolderBusyError(_busy_message(Path(folder), path)) from None


def _busy_message(folder: Path, path: Path) -> str:
    return (
        f"{folder} is in use by another run ({_holder(path)}); wait for it to end, or write this run to "
        "another folder (--output_dir)."
    )


@contextlib.contextmanager
def folder_lock(folder: str | Path) -> Iterator[Path]:
    """Hold `folder`'s run lock for the block (creating the folder); FolderBusyError when another process has it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    handle = path.open("a+", encoding="utf-8")
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FolderBusyError(_busy_message(folder, path)) from None
        handle.seek(0)
        handle.truncate()
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.time(),
            "command": " ".join(sys.argv),
        }
        handle.write(json.dumps(record))
        handle.flush()
        yield path
    finally:
        handle.close()  # closing the descriptor releases the lock
