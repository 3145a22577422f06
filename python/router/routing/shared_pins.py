"""Which region holds each stored response, shared by the workers of one machine.

One file (in the supervisor's private directory) every worker maps: a fixed number of slots,
each a response id's digest, its owner's digest and its region's index in the config (regions
cannot change while workers run), sealed with a checksum. A response id maps to 4 candidate
slots; a note goes to the one already holding it, else an empty one, else over a note of the
same owner, else over the first of the 4 (that note is forgotten): a tenant filling the table
mostly replaces its own notes. No lock: two workers writing one slot at the same
instant leave it torn, and a torn slot fails its checksum and reads as empty, so a reader sees
a note whole or not at all, never a wrong region.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct

# digest of the id (16), digest of the owner (8), region index (2), padding (6), checksum (8).
_BODY = struct.Struct("<16s8sH6x")
_CHECK = struct.Struct("<Q")
SLOT_BYTES = _BODY.size + _CHECK.size
_WAYS = 4


def file_bytes(slots: int) -> int:
    """The table file's size for `slots` notes."""
    return slots * SLOT_BYTES


def create(path: str, slots: int) -> None:
    """Make the zeroed table file (the supervisor, before starting workers)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, file_bytes(slots))
    finally:
        os.close(fd)


def _digest(text: str, size: int) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=size).digest()


def _check(body: bytes) -> int:
    # Never 0, so a zeroed (empty) slot never passes.
    return int.from_bytes(hashlib.blake2b(body, digest_size=8).digest(), "little") | 1


class SharedPins:
    """Response id -> region, over the shared file at `path` (`regions`: names by index)."""

    __slots__ = ("_fd", "_map", "regions", "slots")

    def __init__(self, path: str, regions: list[str]) -> None:
        self._fd = os.open(path, os.O_RDWR)
        size = os.fstat(self._fd).st_size
        self.slots = size // SLOT_BYTES
        self._map = mmap.mmap(self._fd, size)
        self.regions = regions

    def record(self, response_id: str, region: str, owner: str) -> None:
        """Note that `region` holds `response_id`, made by `owner`."""
        try:
            index = self.regions.index(region)
        except ValueError:
            return
        key = _digest(response_id, 16)
        own = _digest(owner, 8)
        body = _BODY.pack(key, own, index)
        target = mine = None
        for offset in self._ways(key):
            found = self._read(offset)
            if found is not None and found[0] == key:
                target = offset
                break
            if target is None and found is None:
                target = offset
            if mine is None and found is not None and found[1] == own:
                mine = offset
        if target is None:
            target = mine if mine is not None else next(iter(self._ways(key)))
        self._map[target : target + SLOT_BYTES] = body + _CHECK.pack(_check(body))

    def home(self, response_id: str, owner: str) -> tuple[str, bool] | None:
        """The region noted for `response_id`, and whether `owner` made it; None if none is."""
        key = _digest(response_id, 16)
        for offset in self._ways(key):
            found = self._read(offset)
            if found is not None and found[0] == key and found[2] < len(self.regions):
                return self.regions[found[2]], found[1] == _digest(owner, 8)
        return None

    def _ways(self, key: bytes) -> list[int]:
        first = int.from_bytes(key[:8], "little") % self.slots
        return [((first + i) % self.slots) * SLOT_BYTES for i in range(_WAYS)]

    def _read(self, offset: int) -> tuple[bytes, bytes, int] | None:
        raw = self._map[offset : offset + SLOT_BYTES]
        body = raw[: _BODY.size]
        (check,) = _CHECK.unpack_from(raw, _BODY.size)
        if check == 0 or check != _check(body):
            return None  # empty, or torn by two writers at once
        key, owner, index = _BODY.unpack(body)
        return key, owner, index

    def close(self) -> None:
        """Unmap the table."""
        self._map.close()
        os.close(self._fd)
