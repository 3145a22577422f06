"""The config the supervisor last accepted, as its workers load it: the file's text, led by a
comment naming its generation, so a worker's generation is that of the text it read."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile

_HEADER = "# router config snapshot, generation {generation} (the supervisor's; do not edit)\n"
_GENERATION = re.compile(r"# router config snapshot, generation (\d+) ")


def write(path: str, text: str, generation: int) -> None:
    """Replace the snapshot at `path` in one step: a reader sees the old text or the new."""
    directory, name = os.path.split(path)
    fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(_HEADER.format(generation=generation))
            out.write(text)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def generation(text: str) -> int | None:
    """The generation a snapshot's text names; None for any other config text."""
    match = _GENERATION.match(text)
    return int(match[1]) if match else None
