"""Rate-limit buckets, `max_concurrent` and admission counts shared by the workers of one machine.

`router serve --workers N` makes one file (on tmpfs, in the supervisor's private directory)
that every worker maps; a key's slot is found by a stable 64-bit hash with linear probing and
updated under a POSIX record lock on that slot's bytes, so two workers never interleave on one
key and a worker that dies never leaves a slot locked (the kernel drops its locks). The bucket
arithmetic is the native BucketTable's (rust/bucket.rs), on the system-wide monotonic clock.
In-flight counts are kept per worker: the supervisor clears a dead worker's the moment it exits
(and a restarted worker its own again), so what it held is never lost to the machine.

Like nginx's `limit_req` zone shared by its workers; across machines, use Redis.
"""

from __future__ import annotations

import fcntl
import hashlib
import math
import mmap
import os
import struct
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# One slot: key hash, requests (capacity, per second, level), tokens (same), last refill; then
# one in-flight count per worker.
_HEAD = struct.Struct("<Q7d")
MAX_WORKERS = 64
_COUNTS = struct.Struct(f"<{MAX_WORKERS}i")
SLOT_BYTES = _HEAD.size + _COUNTS.size
_INT = struct.Struct("<i")
_unpack = _HEAD.unpack_from
_pack = _HEAD.pack_into
_lockf = fcntl.lockf
_EX, _UN = fcntl.LOCK_EX, fcntl.LOCK_UN
SLOTS = 4096
FILE_BYTES = SLOT_BYTES * SLOTS


def create(path: str) -> None:
    """Make the zeroed table file (the supervisor, before starting workers)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, FILE_BYTES)
    finally:
        os.close(fd)


def forget_worker(path: str, worker: int) -> None:
    """Clear a dead worker's in-flight counts (the supervisor, when it sees the worker exit)."""
    SharedBucketTable(path, worker).close()


def _hash(key: str) -> int:
    # Stable across processes (Python's hash() is salted per process); 0 marks an empty slot.
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") or 1


class SharedBucketTable:
    """The native BucketTable's interface (set_limits, try_acquire, reconcile, refund) plus
    `enter`/`leave` for in-flight counts, over the shared file at `path`."""

    def __init__(self, path: str, worker: int, clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 <= worker < MAX_WORKERS:
            raise ValueError(f"worker index must be in [0, {MAX_WORKERS}), got {worker}")
        self._fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, FILE_BYTES)
        self.worker = worker
        # Where this worker's in-flight count sits inside a slot.
        self._column = _HEAD.size + 4 * worker
        self._clock = clock
        self._slots: dict[str, int] = {}
        self._forget_own_counts()

    # ---- slots ----

    @contextmanager
    def _locked(self, index: int) -> Iterator[int]:
        offset = index * SLOT_BYTES
        fcntl.lockf(self._fd, fcntl.LOCK_EX, SLOT_BYTES, offset)
        try:
            yield offset
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN, SLOT_BYTES, offset)

    def _find(self, key: str, claim: bool) -> int | None:
        """The slot of `key`; with `claim`, an empty one is taken for it. Locked while looked at."""
        cached = self._slots.get(key)
        if cached is not None:
            return cached
        wanted = _hash(key)
        start = wanted % SLOTS
        for step in range(SLOTS):
            index = (start + step) % SLOTS
            with self._locked(index) as offset:
                (found,) = struct.unpack_from("<Q", self._map, offset)
                if found == wanted:
                    self._slots[key] = index
                    return index
                if found == 0:
                    if not claim:
                        return None
                    struct.pack_into("<Q", self._map, offset, wanted)
                    self._slots[key] = index
                    return index
        if claim:
            raise ValueError(f"shared rate-limit table is full ({SLOTS} keys)")
        return None

    def _slot(self, key: str) -> int:
        index = self._find(key, claim=False)
        if index is None:
            raise KeyError(key)
        return index

    def _forget_own_counts(self) -> None:
        """A (re)started worker has nothing in flight: clear its column everywhere."""
        at = _HEAD.size + 4 * self.worker
        for index in range(SLOTS):
            offset = index * SLOT_BYTES
            if struct.unpack_from("<i", self._map, offset + at)[0] != 0:
                with self._locked(index):
                    struct.pack_into("<i", self._map, offset + at, 0)

    # ---- buckets ----

    def set_limits(
        self,
        key: str,
        *,
        requests_per_minute: float,
        tokens_per_minute: float,
        request_burst: float | None = None,
        token_burst: float | None = None,
    ) -> None:
        """Add a key with full buckets, or change its limits keeping its levels (the same call
        from every worker at start or reload changes nothing)."""
        for name, value in (
            ("requests_per_minute", requests_per_minute),
            ("tokens_per_minute", tokens_per_minute),
            ("request_burst", request_burst),
            ("token_burst", token_burst),
        ):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        r_cap = float(request_burst if request_burst is not None else requests_per_minute)
        t_cap = float(token_burst if token_burst is not None else tokens_per_minute)
        r_rate, t_rate = requests_per_minute / 60.0, tokens_per_minute / 60.0
        index = self._find(key, claim=True)
        assert index is not None
        now = self._clock()
        with self._locked(index) as offset:
            h, rc, _rr, rl, tc, _tr, tl, last = _HEAD.unpack_from(self._map, offset)
            if rc == 0 and tc == 0 and last == 0:
                rl, tl = r_cap, t_cap  # new: full
            else:
                rl, tl, last = _refilled(rc, _rr, rl, tc, _tr, tl, last, now)
                rl, tl = min(rl, r_cap), min(tl, t_cap)
            _HEAD.pack_into(self._map, offset, h, r_cap, r_rate, rl, t_cap, t_rate, tl, now)

    def try_acquire(self, key: str, tokens: int = 0) -> tuple[bool, float, int, int, float, float]:
        """Take 1 request + `tokens` from both buckets or neither: (allowed, retry_after,
        remaining requests, remaining tokens, reset requests, reset tokens)."""
        index = self._slots.get(key)
        if index is None:
            index = self._slot(key)
        offset = index * SLOT_BYTES
        now = self._clock()
        # The hot path: the lock taken and dropped inline (a context manager costs as much as
        # the two system calls).
        _lockf(self._fd, _EX, SLOT_BYTES, offset)
        try:
            h, rc, rr, rl, tc, tr, tl, last = _unpack(self._map, offset)
            elapsed = now - last
            if elapsed > 0:
                rl = min(rl + rr * elapsed, rc)
                tl = min(tl + tr * elapsed, tc)
                last = now
            need = float(tokens)
            allowed = rl >= 1.0 and tl >= need
            if allowed:
                rl -= 1.0
                tl -= need
                retry = 0.0
            else:
                retry = max(_wait(rc, rr, rl, 1.0), _wait(tc, tr, tl, need))
            _pack(self._map, offset, h, rc, rr, rl, tc, tr, tl, last)
        finally:
            _lockf(self._fd, _UN, SLOT_BYTES, offset)
        return (
            allowed,
            retry,
            max(0, math.floor(rl)),
            max(0, math.floor(tl)),
            _wait(rc, rr, rl, rc),
            _wait(tc, tr, tl, tc),
        )

    def reconcile(self, key: str, reserved: int, actual: int) -> None:
        """Give back `reserved - actual` tokens, or take the excess (may go into debt)."""
        self._add(key, 0.0, float(reserved - actual))

    def refund(self, key: str, requests: int = 1, tokens: int = 0) -> None:
        """Give back requests and tokens acquired but not used."""
        self._add(key, float(requests), float(tokens))

    def _add(self, key: str, requests: float, tokens: float) -> None:
        index = self._slot(key)
        now = self._clock()
        with self._locked(index) as offset:
            h, rc, rr, rl, tc, tr, tl, last = _HEAD.unpack_from(self._map, offset)
            rl, tl, last = _refilled(rc, rr, rl, tc, tr, tl, last, now)
            rl, tl = min(rl + requests, rc), min(tl + tokens, tc)
            _HEAD.pack_into(self._map, offset, h, rc, rr, rl, tc, tr, tl, last)

    # ---- in flight ----

    def enter(self, key: str, limit: int) -> bool:
        """Count one more request of `key` in flight on this worker, unless the machine already
        has `limit` of them."""
        index = self._slots.get(key)
        if index is None:
            index = self._find(key, claim=True)
            assert index is not None
        offset = index * SLOT_BYTES
        _lockf(self._fd, _EX, SLOT_BYTES, offset)
        try:
            counts = _COUNTS.unpack_from(self._map, offset + _HEAD.size)
            if sum(counts) >= limit:
                return False
            _INT.pack_into(self._map, offset + self._column, counts[self.worker] + 1)
            return True
        finally:
            _lockf(self._fd, _UN, SLOT_BYTES, offset)

    def leave(self, key: str) -> None:
        """One request of `key` on this worker is over."""
        index = self._slots.get(key)
        if index is None:
            index = self._find(key, claim=False)
            if index is None:
                return
        # No lock: only this worker writes its column (its enter and leave never interleave, one
        # thread), and a sibling's enter that reads it mid-change sees the old count or the new,
        # each a whole aligned int; the old one is higher, so the limit still holds.
        at = index * SLOT_BYTES + self._column
        (count,) = _INT.unpack_from(self._map, at)
        _INT.pack_into(self._map, at, max(0, count - 1))

    def peek(self, key: str) -> int:
        """Requests of `key` in flight on the whole machine, read without the lock: a hint that
        may miss a change under way."""
        index = self._slots.get(key)
        if index is None:
            index = self._find(key, claim=True)
            assert index is not None
        return sum(_COUNTS.unpack_from(self._map, index * SLOT_BYTES + _HEAD.size))

    def in_flight(self, key: str) -> int:
        """Requests of `key` in flight on the whole machine."""
        index = self._find(key, claim=False)
        if index is None:
            return 0
        with self._locked(index) as offset:
            return sum(_COUNTS.unpack_from(self._map, offset + _HEAD.size))

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)


def _refilled(
    rc: float, rr: float, rl: float, tc: float, tr: float, tl: float, last: float, now: float
) -> tuple[float, float, float]:
    """Levels brought up to `now` (a clock that seems to go back adds nothing)."""
    elapsed = max(0.0, now - last)
    return min(rl + rr * elapsed, rc), min(tl + tr * elapsed, tc), max(last, now)


def _wait(capacity: float, per_second: float, level: float, need: float) -> float:
    """Seconds until `level` reaches `need` (0 now, inf never)."""
    if level >= need:
        return 0.0
    if need > capacity or per_second <= 0:
        return math.inf
    return (need - level) / per_second
