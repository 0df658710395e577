"""A full disk as one clear error: which folder, and what is still intact."""

from __future__ import annotations

import errno


class DiskFullError(OSError):
    """No space left while writing an output; the message names the folder and what is intact."""


def out_of_space(error: BaseException) -> bool:
    """Whether `error` is a full disk, however the writer reports it: an OSError with ENOSPC or EDQUOT from
    Python's writes, RuntimeError "unexpected pos" from torch.save's zip writer, a plain Exception "No space
    left on device (os error 28)" from the tokenizers library's Rust writer."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(error)
    return any(part in text for part in ("No space left", "os error 28", "unexpected pos"))
