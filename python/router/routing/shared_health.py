"""Region health shared by the workers of one machine: the table one prober publishes for every
worker to route from, and the channel the workers report their attempts' outcomes on.

With `router serve --workers N` the supervisor runs the only prober (routing.machine_prober)
and writes its view of every region to the table every 50 ms; each worker maps the file
read-only. Writes are whole images under a POSIX record lock with a sequence number that
is odd while a write is under way (a seqlock); a reader compares the sequence number without a
system call and decodes only a new image, so routing from the table costs no system call per
request. Ages in an image (last probe, last TTFT sample) are as of its `at` (the system-wide
monotonic clock) and are brought up to date when read.

Workers send their outcomes on a Unix stream socket in batches (one per 2 ms at most; never
blocking: a prober that falls 1 MiB behind loses batches, counted), so passive ejection too is
decided once, from the whole machine's traffic.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import mmap
import os
import socket
import struct
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

import msgspec

log = logging.getLogger("router.health")

# Sequence number, then the image's length, then the image (msgpack).
_HEAD = struct.Struct("<QI")
_SEQ = struct.Struct("<Q")
FILE_BYTES = 1 << 20
_MAX_IMAGE = FILE_BYTES - _HEAD.size


class RegionView(Protocol):
    """What routing, status and the admin API read of a region's health (the native
    RegionHealth and the published RegionRecord both have it)."""

    @property
    def name(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def available(self) -> bool: ...
    @property
    def healthy(self) -> bool: ...
    @property
    def probed(self) -> bool: ...
    @property
    def ejected(self) -> bool: ...
    @property
    def ejected_for_s(self) -> float: ...
    @property
    def ejected_until(self) -> float | None: ...
    @property
    def ejections(self) -> int: ...
    @property
    def ewma_rtt_s(self) -> float | None: ...
    @property
    def rtt_p50_s(self) -> float | None: ...
    @property
    def rtt_p95_s(self) -> float | None: ...
    @property
    def ewma_ttft_s(self) -> float | None: ...
    @property
    def ttft_p50_s(self) -> float | None: ...
    @property
    def ttft_p95_s(self) -> float | None: ...
    @property
    def ttft_age_s(self) -> float | None: ...
    @property
    def consecutive_failures(self) -> int: ...
    @property
    def passive_failures(self) -> int: ...
    @property
    def probes(self) -> int: ...
    @property
    def probe_failures(self) -> int: ...
    @property
    def passive_reports(self) -> int: ...
    @property
    def last_probe_age_s(self) -> float | None: ...
    @property
    def last_error(self) -> str | None: ...


class RegionRecord(msgspec.Struct, frozen=True, array_like=True):
    """One region's health as published (the fields of the native RegionHealth)."""

    name: str
    url: str
    available: bool
    healthy: bool
    probed: bool
    ejected: bool
    ejected_for_s: float
    ejected_until: float | None
    ejections: int
    ewma_rtt_s: float | None
    rtt_p50_s: float | None
    rtt_p95_s: float | None
    ewma_ttft_s: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    ttft_age_s: float | None
    consecutive_failures: int
    passive_failures: int
    probes: int
    probe_failures: int
    passive_reports: int
    last_probe_age_s: float | None
    last_error: str | None

    @classmethod
    def of(cls, h: RegionView) -> RegionRecord:
        """A record of a region's health now."""
        return cls(*(getattr(h, f) for f in cls.__struct_fields__))

    def aged(self, by_s: float) -> RegionRecord:
        """The record `by_s` seconds later: its ages grown."""
        return msgspec.structs.replace(
            self,
            ttft_age_s=None if self.ttft_age_s is None else self.ttft_age_s + by_s,
            last_probe_age_s=None
            if self.last_probe_age_s is None
            else self.last_probe_age_s + by_s,
        )


class Image(msgspec.Struct, frozen=True, array_like=True):
    """One publication: when (monotonic), whether the prober runs, every region, and what
    operators set on regions (drained, disabled) through the supervisor."""

    at: float
    probing: bool
    regions: tuple[RegionRecord, ...]
    admin: dict[str, str] = msgspec.field(default_factory=dict)


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Image).decode

RoutingRow = tuple[str, bool, bool, float | None, float | None, float | None]

# One attempt's outcome: region, outcome, connect_s, ttft_s, total_s (Prober.report's arguments).
Report = tuple[str, str, float | None, float | None, float | None]
encode_reports = msgspec.msgpack.Encoder().encode
decode_reports = msgspec.msgpack.Decoder(list[Report]).decode
# How long a worker gathers reports before sending them in one frame; the most in one.
_BATCH_S = 0.02
_BATCH_MAX = 256
# A frame: its length, then the msgpack list of reports.
FRAME = struct.Struct("<I")

# Bytes a worker keeps for the prober while it is behind; beyond it, batches are dropped.
_PENDING_MAX = 1 << 20


def create(path: str) -> None:
    """Make the empty table file (the supervisor, before starting workers)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, FILE_BYTES)
    finally:
        os.close(fd)


class TableWriter:
    """The one writer (the supervisor's prober)."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, FILE_BYTES)
        self._seq = _SEQ.unpack_from(self._map, 0)[0] & ~1

    def publish(
        self, probing: bool, regions: Iterable[RegionView], admin: Mapping[str, str]
    ) -> None:
        """Write a new image of every region."""
        records = tuple(RegionRecord.of(h) for h in regions)
        image = _encode(Image(time.monotonic(), probing, records, dict(admin)))
        if len(image) > _MAX_IMAGE:
            raise ValueError(f"health image of {len(image)} bytes exceeds the table")
        fcntl.lockf(self._fd, fcntl.LOCK_EX, _HEAD.size, 0)
        try:
            # Odd while writing: a reader that sees it (or a change) takes the lock and rereads.
            _SEQ.pack_into(self._map, 0, self._seq + 1)
            self._map[_HEAD.size : _HEAD.size + len(image)] = image
            self._seq += 2
            _HEAD.pack_into(self._map, 0, self._seq, len(image))
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN, _HEAD.size, 0)

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)


class TableReader:
    """A worker's read-only view of the table."""

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._fd = os.open(path, os.O_RDONLY)
        self._map = mmap.mmap(self._fd, FILE_BYTES, prot=mmap.PROT_READ)
        self._clock = clock
        self._seq = 0
        self._image: Image | None = None

    def image(self) -> Image | None:
        """The newest image; None before the first publication."""
        seq = _SEQ.unpack_from(self._map, 0)[0]
        if seq == self._seq:
            return self._image
        fcntl.lockf(self._fd, fcntl.LOCK_SH, _HEAD.size, 0)
        try:
            seq, length = _HEAD.unpack_from(self._map, 0)
            raw = self._map[_HEAD.size : _HEAD.size + length]
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN, _HEAD.size, 0)
        if seq:
            self._image = _decode(raw)
        self._seq = seq
        return self._image

    def probing(self) -> bool:
        """Whether the machine's prober is running."""
        image = self.image()
        return image is not None and image.probing

    def admin(self) -> Mapping[str, str]:
        """What operators set on regions, by name (values of selection.AdminState)."""
        image = self.image()
        return {} if image is None else image.admin

    def snapshot(self) -> Mapping[str, RegionRecord]:
        """Every published region's health now, by name."""
        image = self.image()
        if image is None:
            return {}
        elapsed = max(0.0, self._clock() - image.at)
        return {r.name: r.aged(elapsed) for r in image.regions}

    def routing_view(self) -> list[RoutingRow]:
        """The native Prober.routing_view() rows, from the published image."""
        image = self.image()
        if image is None:
            return []
        elapsed = max(0.0, self._clock() - image.at)
        return [
            (
                r.name,
                r.available,
                r.healthy,
                r.ewma_rtt_s,
                r.ewma_ttft_s,
                None if r.ttft_age_s is None else r.ttft_age_s + elapsed,
            )
            for r in image.regions
        ]

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)


class ReportSender:
    """A worker's side of the report channel: outcomes batched into length-prefixed frames on
    a Unix stream socket, never blocking the worker (what the prober has not taken yet waits in
    a bounded buffer; beyond it, batches are dropped and counted)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._sock: socket.socket | None = None
        self._batch: list[Report] = []
        self._pending = bytearray()
        self._timer: asyncio.TimerHandle | None = None
        self.dropped = 0
        self._dropping = False

    def report(
        self,
        region: str,
        outcome: str,
        connect_s: float | None,
        ttft_s: float | None,
        total_s: float | None,
    ) -> None:
        """Queue one attempt's outcome for the machine's prober."""
        self._batch.append((region, outcome, connect_s, ttft_s, total_s))
        if len(self._batch) >= _BATCH_MAX:
            self.flush()
        elif self._timer is None:
            self._later()

    def _later(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a test, or shutting down): the next report or close sends
        self._timer = loop.call_later(_BATCH_S, self.flush)

    def flush(self) -> None:
        """Send what is queued, as far as the socket takes it now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._batch = self._batch, []
        if batch:
            if len(self._pending) > _PENDING_MAX:
                self._drop(len(batch), "the machine's prober is behind")
            else:
                payload = encode_reports(batch)
                self._pending += FRAME.pack(len(payload)) + payload
        if not self._pending:
            return
        try:
            if self._sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.connect(self._path)  # local: at once, or refused
                except OSError:
                    sock.close()
                    raise
                sock.setblocking(False)
                self._sock = sock
            sent = self._sock.send(self._pending)
            del self._pending[:sent]
            if not self._pending:
                self._dropping = False  # caught up: a later drop is news again
        except BlockingIOError:
            pass
        except OSError:
            # The prober is gone (the supervisor stopping) or not there: what waited is lost
            # (a cut frame included); the next flush connects again.
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            self._pending.clear()
            self._drop(len(batch), "the machine's prober is not reachable")
        if self._pending and self._timer is None:
            self._later()

    def _drop(self, reports: int, why: str) -> None:
        self.dropped += reports
        if not self._dropping:
            # Once per spell of drops: a stuck supervisor must not flood the log.
            log.warning("health reports dropped: %s (probes go on)", why)
        self._dropping = True

    def close(self) -> None:
        self.flush()
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class SharedHealth:
    """A worker's health source: the published table to read, the report channel to write."""

    def __init__(self, table: str, reports: str) -> None:
        self.table = TableReader(table)
        self.sender = ReportSender(reports)

    def close(self) -> None:
        self.sender.close()
        self.table.close()
