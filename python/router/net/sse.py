"""Server-sent events: incremental decoding of `data:` payloads and their encoding."""

from __future__ import annotations

import re
from collections.abc import Callable

DONE = b"[DONE]"
# A blank line, the end of an event: LF LF, or CR LF CR LF (and the mixes) as the Decoder reads.
_BLANK = re.compile(rb"\n\r?\n")


def last_boundary(data: bytes) -> int:
    """Index just past the last blank line in `data` (0 if none): the end of its whole events."""
    lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)


def split_events(whole: bytes) -> list[bytes]:
    """The raw events (their lines, without the blank line ending each) of whole events."""
    return [event for event in _BLANK.split(whole) if event.strip(b"\r\n")]


def data_of(event: bytes) -> bytes | None:
    """The data payload of one raw event (its lines joined by LF, as the Decoder joins them);
    None for an event without data (a comment, a bare `event:` line)."""
    lines = []
    for line in event.split(b"\n"):
        line = line.removesuffix(b"\r")
        if line.startswith(b"data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(lines) if lines else None


def encode(payload: bytes) -> bytes:
    """One SSE event carrying `payload` as its data: each of its lines a `data:` line (the
    Decoder joins an event's data lines with LF, so a payload of two lines was sent as two)."""
    return b"data: " + payload.replace(b"\n", b"\ndata: ") + b"\n\n"


def encode_done() -> bytes:
    """The terminating `data: [DONE]` event."""
    return encode(DONE)


class Decoder:
    """Splits an SSE byte stream into the data payload of each event, across arbitrary chunking."""

    __slots__ = ("_buf", "_data")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        """Consume bytes; the data payloads of the events completed by them, in order."""
        data = self._buf + chunk if self._buf else chunk
        if self._data or b"\r" in data:
            return self._lines(data)
        # The common shape (OpenAI, vLLM, llama.cpp): `data: ...` events ended by "\n\n", one
        # split per chunk and one slice per event; anything else goes through the line parser.
        blocks = data.split(b"\n\n")
        rest = blocks.pop()
        out: list[bytes] = []
        for block in blocks:
            if block.startswith(b"data:") and b"\n" not in block:
                value = block[5:]
                out.append(value[1:] if value.startswith(b" ") else value)
            else:
                out += self._lines(block + b"\n\n")
        self._buf = b""
        if rest:
            out += self._lines(rest)
        return out

    def _lines(self, data: bytes) -> list[bytes]:
        """The general parser: line by line, CR LF or LF, comments and other fields skipped."""
        # One split per chunk: re-slicing the buffer line by line was quadratic in the chunk.
        lines = data.split(b"\n")
        self._buf = lines.pop()  # the unfinished last line, b"" when the chunk ended one
        out: list[bytes] = []
        data_lines = self._data
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if data_lines:
                    out.append(b"\n".join(data_lines))
                    data_lines = []
            elif line.startswith(b"data:"):
                value = line[5:]
                data_lines.append(value[1:] if value.startswith(b" ") else value)
            # Comments (":"), `event:`, `id:` and `retry:` lines carry nothing the cache replays.
        self._data = data_lines
        return out

    @property
    def pending(self) -> bool:
        """True when bytes of an unfinished event are buffered."""
        return bool(self._buf) or bool(self._data)


class EventTooLarge(Exception):
    """One SSE event grew past the splitter's bound before it ended."""


class Splitter:
    """Cuts an SSE byte stream into whole raw events (each with its ending blank line), linear
    in the bytes however they are chunked; an event longer than `max_bytes` raises
    EventTooLarge, so a never-ending line costs a bounded buffer and one scan of its bytes."""

    __slots__ = ("_buf", "_scan", "max_bytes")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._buf = bytearray()
        # Where the next boundary search starts: bytes before it hold no blank line.
        self._scan = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        """The events `chunk` completes, in order (raw bytes, blank line included)."""
        if not self._buf and chunk.endswith(b"\n\n") and b"\r" not in chunk:
            # The common shape: whole `data:` events ended by LF LF, one split.
            parts = chunk.split(b"\n\n")
            parts.pop()
            if len(chunk) > self.max_bytes and max(map(len, parts)) + 2 > self.max_bytes:
                raise EventTooLarge(f"an SSE event passed {self.max_bytes} bytes")
            return [part + b"\n\n" for part in parts if part]
        buf = self._buf
        buf += chunk
        events: list[bytes] = []
        start = 0
        pos = max(self._scan, 0)
        # Each kind of boundary is searched for again only once the one found was passed (a
        # search that found none holds for the rest): one scan of the bytes, not one per event.
        lf = buf.find(b"\n\n", pos)
        crlf = buf.find(b"\n\r\n", pos)
        while lf >= 0 or crlf >= 0:
            end = lf + 2 if crlf < 0 or 0 <= lf < crlf else crlf + 3
            event = bytes(buf[start:end])
            if event.strip(b"\r\n"):
                events.append(event)
            start = end
            if 0 <= lf < end:
                lf = buf.find(b"\n\n", end)
            if 0 <= crlf < end:
                crlf = buf.find(b"\n\r\n", end)
        if start:
            del buf[:start]
        # A boundary may straddle this chunk and the next: rescan the last two bytes.
        self._scan = max(0, len(buf) - 2)
        if len(buf) > self.max_bytes:
            raise EventTooLarge(f"an SSE event passed {self.max_bytes} bytes")
        return events

    def first(self, chunk: bytes, wanted: Callable[[bytes], bool]) -> bytes | None:
        """Feed `chunk` up to the first event it completes that is `wanted`: that event, or None
        while none is (the events before it passed over, each looked at once); once one is
        found, nothing more is fed."""
        buf = self._buf
        buf += chunk
        start = 0
        found = None
        lf = buf.find(b"\n\n", self._scan)
        crlf = buf.find(b"\n\r\n", self._scan)
        while lf >= 0 or crlf >= 0:
            end = lf + 2 if crlf < 0 or 0 <= lf < crlf else crlf + 3
            event = bytes(buf[start:end])
            start = end
            if wanted(event):
                found = event
                break
            if 0 <= lf < end:
                lf = buf.find(b"\n\n", end)
            if 0 <= crlf < end:
                crlf = buf.find(b"\n\r\n", end)
        if start:
            del buf[:start]
        self._scan = max(0, len(buf) - 2)
        if len(buf) > self.max_bytes:
            raise EventTooLarge(f"an SSE event passed {self.max_bytes} bytes")
        return found

    def end(self) -> list[bytes]:
        """At the stream's end: its last event when only its blank line is missing (every line
        ended, as in `data: [DONE]\\n`), else nothing; what stays pending is a cut event."""
        if not self._buf.endswith(b"\n"):
            return []
        return self.feed(b"\n")

    @property
    def pending(self) -> int:
        """Bytes of an unfinished event held back."""
        return len(self._buf)
