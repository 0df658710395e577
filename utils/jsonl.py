"""JSON Lines files: one reading policy, one appending writer, one atomic write (of files and of folders).
Standard library only.

Every JSONL file the project reads or writes goes through this module (task files, teacher traces,
the phase-4 completion cache, per-sample results, training metrics), and so does every write that
must appear whole or not at all: JSON files, and the folders of models, adapters and checkpoints.

The torn-line policy, the same for every reader:

- A **torn last line** is what a process killed in the middle of a write leaves: the file's final
  line, not terminated by a newline, that does not parse. The tolerant reader
  (``tolerate_torn_tail=True``, for files this project appends to) skips it, and `JsonlAppender`
  cuts it off before appending so the next record starts on a line of its own. A final line that
  parses but lacks its newline is a complete record: it is kept (and the newline is added before
  appending).
- A **bad middle line** (or a bad last line that *is* newline-terminated) is damage that no crash of
  ours produces (an edit, a concatenation, a disk fault): every reader raises `DataFormatError`
  naming file and line, and nothing is skipped, truncated or regenerated behind the user's back.
- Blank lines are ignored; a line that is valid JSON but not an object is an error too.

Writers: `JsonlAppender` (append with an exclusive ``flock`` — one writer per file — and a flush per
record, so a kill loses only the record being written) and `write_atomic` / `write_jsonl_atomic` /
`write_json_atomic` / `write_files_atomic` (temporary file in the same folder, fsync, rename: a crash
leaves the old file or the new one, never half of one).

Folders (a model materialized from its GGUF, a LoRA adapter, a checkpoint, a merged model) are written
under a temporary name beside their final one and then moved into place by one of two steps, because a
folder cannot be renamed over a non-empty one:
- `replace_folder`: the new folder takes the place of the old one. On Linux the two are exchanged by
  one ``renameat2(RENAME_EXCHANGE)``, so a reader or a crash finds the old folder or the new one at
  every instant, never none (moving the old one aside first would leave the name empty in between);
  where the file system cannot exchange, that two-rename fallback is used.
- `publish_folder`: the first writer wins (a cache that several processes may fill at once): the folder
  is renamed into place only if nothing is there, otherwise the caller's copy is deleted.
Both fsync the folder's files first, so the rename never publishes data still only in the page cache.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, TypeVar

T = TypeVar("T")


class DataFormatError(ValueError):
    """Bad input data; the message names the file (and line) and what to do."""


class FileBusyError(RuntimeError):
    """Another process holds the file's append lock."""


def _parse_line(path: Path, line_no: int, text: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataFormatError(
            f"{path}:{line_no}: malformed JSON ({exc.msg} at column {exc.colno}). "
            "Each line must be one JSON object; fix or remove that line."
        ) from None
    if not isinstance(obj, dict):
        raise DataFormatError(f"{path}:{line_no}: expected a JSON object, got {type(obj).__name__}.")
    return obj


def _scan(handle: IO[bytes], path: Path, tolerate_torn_tail: bool) -> Iterator[tuple[int, int, dict[str, Any] | None]]:
    """(line number, byte offset after the line, object or None for a torn tail) for each non-blank line."""
    offset = 0
    for line_no, raw in enumerate(handle, start=1):
        offset += len(raw)
        text = raw.decode("utf-8", errors="replace")
        if not text.strip():
            continue
        if not raw.endswith(b"\n") and tolerate_torn_tail:  # only the final line can lack its newline
            try:
                yield line_no, offset, _parse_line(path, line_no, text)
            except DataFormatError:
                yield line_no, offset - len(raw), None  # torn: its bytes do not count as kept
            return
        yield line_no, offset, _parse_line(path, line_no, text)


def iter_jsonl(path: str | Path, tolerate_torn_tail: bool = False) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line_number, object) for each record. Strict by default; see the module's policy."""
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"{path}: file not found.")
    with path.open("rb") as handle:
        for line_no, _end, obj in _scan(handle, path, tolerate_torn_tail):
            if obj is not None:
                yield line_no, obj


def iter_records(path: str | Path, from_row: Callable[[dict[str, Any]], T], not_one: str) -> Iterator[T]:
    """Each line of a record file as its typed record (`from_row`), a torn last line skipped; a line that is not
    one is a DataFormatError naming the file and line, then `not_one` (what it is not, and what to do)."""
    for line_no, row in iter_jsonl(path, tolerate_torn_tail=True):
        try:
            record = from_row(row)
        except (KeyError, TypeError, ValueError):
            raise DataFormatError(f"{path}:{line_no}: {not_one}") from None
        yield record


def read_jsonl(path: str | Path, tolerate_torn_tail: bool = False) -> list[dict[str, Any]]:
    """All records of a JSONL file (see `iter_jsonl`)."""
    return [obj for _, obj in iter_jsonl(path, tolerate_torn_tail)]


class JsonlAppender:
    """Append records to a JSONL file under an exclusive lock, repairing a torn last line first.

        with JsonlAppender(path) as out:        # FileBusyError if another process holds it
            for _, record in out.records(): ...  # what is already there (strict: the tail is repaired)
            out.write({...})                     # one line, flushed

    ``defer_truncate=True`` (a "start fresh" run) keeps the old content until `truncate_now()` is
    called, so a run that produces nothing useful leaves the old file as it was.
    """

    def __init__(self, path: str | Path, lock: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle: IO[bytes] = open(self.path, "a+b")  # noqa: SIM115 - closed in close()
        if lock:
            try:
                fcntl.flock(self._handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._handle.close()
                raise FileBusyError(f"{self.path} is being written by another process.") from None
        try:
            self.repaired = self._repair_tail()
        except BaseException:
            self._handle.close()
            raise

    def _repair_tail(self) -> bool:
        """Cut a torn last line (True if one was cut); add the newline a complete last record lacks."""
        self._handle.seek(0)
        good_end = 0
        for _line_no, end, _obj in _scan(self._handle, self.path, tolerate_torn_tail=True):
            good_end = end
        size = self._handle.seek(0, os.SEEK_END)
        torn = False
        if good_end < size:
            self._handle.seek(good_end)
            rest = self._handle.read()
            if rest.strip():  # a torn record, not just trailing blank lines
                torn = True
                self._handle.truncate(good_end)
        self._handle.seek(0, os.SEEK_END)
        if good_end and not torn:
            self._handle.seek(good_end - 1)
            if self._handle.read(1) != b"\n":
                self._handle.seek(0, os.SEEK_END)
                self._handle.write(b"\n")
                self._handle.flush()
        self._handle.seek(0, os.SEEK_END)
        return torn

    def records(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """The records already in the file (after the repair, so the strict reader applies)."""
        return iter_jsonl(self.path)

    def truncate_now(self) -> None:
        self._handle.truncate(0)
        self._handle.seek(0)

    def write(self, record: Mapping[str, Any]) -> None:
        self._handle.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
        self._handle.flush()  # in the OS's hands now: survives a kill of this process

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_files_atomic(files: Mapping[str | Path, bytes]) -> None:
    """Write each file to a temporary name beside it (fsynced), then rename them all in order.

    A crash before the renames changes nothing; the renames themselves are atomic per file, so put
    the file that marks the set complete (a manifest) last.
    """
    temps: list[tuple[Path, Path]] = []
    try:
        for name, payload in files.items():
            final = Path(name)
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
            with tmp.open("wb") as handle:
                handle.write(payload)
                handle.flush()
                os.fsync(handle.fileno())
            temps.append((tmp, final))
        for tmp, final in temps:
            os.replace(tmp, final)
    finally:
        for tmp, _ in temps:
            tmp.unlink(missing_ok=True)


def write_atomic(path: str | Path, payload: bytes | str) -> Path:
    """Replace `path` with `payload` atomically (see `write_files_atomic`)."""
    path = Path(path)
    write_files_atomic({path: payload.encode("utf-8") if isinstance(payload, str) else payload})
    return path


def jsonl_bytes(records: Iterable[Mapping[str, Any]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")


def write_jsonl_atomic(path: str | Path, records: Iterable[Mapping[str, Any]]) -> Path:
    """Replace `path` with these records as JSON lines, atomically."""
    return write_atomic(path, jsonl_bytes(records))


def write_json_atomic(path: str | Path, obj: Any) -> Path:
    """Replace `path` with `obj` as indented JSON, atomically."""
    return write_atomic(path, json.dumps(obj, indent=2) + "\n")


def _fsync_tree(folder: Path) -> None:
    """fsync every file below `folder`, then each folder (so the names are durable too)."""
    for root, _dirs, names in os.walk(folder):
        for name in names:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(root))


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2  # linux/fs.h


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where this system
    or file system cannot (then nothing was changed)."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None) if sys.platform == "linux" else None
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def replace_folder(tmp: str | Path, final: str | Path) -> Path:
    """Put the fully written folder `tmp` at `final`, replacing any folder there; returns `final`.

    The folder counterpart of `write_files_atomic` (see the module's docstring): fsync, then one exchange of
    the two names (the old folder ends under `tmp`'s name and is deleted). Where the file system cannot
    exchange, the old folder is moved aside and put back if the new one cannot take its place.
    On failure `tmp` is deleted and `final` is as it was.
    """
    tmp, final = Path(tmp), Path(final)
    try:
        _fsync_tree(tmp)
        if not final.exists():
            os.rename(tmp, final)
        elif not _exchange(tmp, final):
            aside = final.with_name(f".{final.name}.old{os.getpid()}")
            shutil.rmtree(aside, ignore_errors=True)
            os.rename(final, aside)
            try:
                os.rename(tmp, final)
            except OSError:
                os.rename(aside, final)
                raise
            shutil.rmtree(aside, ignore_errors=True)
        _fsync_dir(final.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the old folder after an exchange; the unused new one on failure
    return final


def publish_folder(tmp: str | Path, final: str | Path) -> bool:
    """Rename the fully written folder `tmp` to `final` unless a non-empty folder is already there (first
    writer wins). True if this call published it; otherwise `tmp` is deleted and the caller decides
    whether what is at `final` is whole."""
    tmp, final = Path(tmp), Path(final)
    _fsync_tree(tmp)
    try:
        os.rename(tmp, final)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    _fsync_dir(final.parent)
    return True
