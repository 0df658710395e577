"""Watching a folder through every file-system step a piece of code takes (Python audit events), to check
what a reader or a crash at any of those instants would find."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

# events that change the file system (or open a file, which may create or truncate it)
_STEPS = {"open", "os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "shutil.rmtree"}
_active: list[Callable[[str, tuple], None]] = []  # an audit hook cannot be removed: it dispatches to these


def _dispatch(event: str, args: tuple) -> None:
    if _active and event in _STEPS:
        for check in list(_active):
            check(event, args)


sys.addaudithook(_dispatch)


@contextmanager
def broken_states(folder: Path, whole: Callable[[Path], bool]) -> Iterator[list[str]]:
    """Yield a list that collects, for each file-system step taken inside the block at which `whole(folder)`
    is false, the step (event and its first argument): what a reader or a crash at that instant would meet."""
    seen: list[str] = []

    def check(event: str, args: tuple) -> None:
        if not whole(folder):
            seen.append(f"{event} {args[0] if args else ''}")

    _active.append(check)
    try:
        yield seen
    finally:
        _active.remove(check)
