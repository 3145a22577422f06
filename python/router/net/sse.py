"""Server-sent events: incremental decoding of `data:` payloads and their encoding.

A line ends with CR LF, a lone LF or a lone CR (the WHATWG HTML spec's event stream); a CR
that ends one read and an LF that starts the next are one line ending, not two."""

from __future__ import annotations

import re
from collections.abc import Callable

DONE = b"[DONE]"
# Where an event ends: a line ending, then the blank line's (matched from the first LF, so an
# event ended by CR LF CR LF keeps its first CR, as it always did). A lone CR last in the
# bytes may be the first half of a CR LF still on its way: after an LF it waits for the next
# byte (a CR LF stream cut between the two); after a lone CR (a CR stream) it ends the event
# at once, and an LF that follows is the next event's first byte (an empty line there).
_BLANK = re.compile(rb"\n\r?\n|\n\r(?=[^\n])|\r\r\n?")
# _BLANK's matches, found faster (it tries every CR and LF), in bytes without a CR (an LF
# stream's), without an LF (a CR stream's), without a lone CR (CR LF, LF lines mixed in).
_LF_BLANK = re.compile(rb"\n\n")
_CR_BLANK = re.compile(rb"\r\r")
_CRLF_BLANK = re.compile(rb"\n\r?\n")
_LONE_CR = re.compile(rb"\r(?!\n)")
# The same in bytes known to hold whole events: a CR last ends its blank line.
_BLANK_WHOLE = re.compile(rb"\n\r?\n|\n\r|\r\r\n?")


def last_boundary(data: bytes) -> int:
    """Index just past the last blank line in `data` (0 if none): the end of its whole events."""
    lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\n\r\n")
    end = max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)
    if data.find(b"\r", end) >= 0:
        # Blank lines ended by a lone CR after the last LF-ended one.
        for blank in _BLANK_WHOLE.finditer(data, end):
            end = blank.end()
    return end


def split_events(whole: bytes) -> list[bytes]:
    """The raw events (their lines, without the blank line ending each) of whole events."""
    return [event for event in _BLANK_WHOLE.split(whole) if event.strip(b"\r\n")]


def events_of(whole: bytes) -> list[bytes]:
    """Whole events cut apart byte for byte, each with the blank line ending it, where the
    Splitter cut them (joined, they are `whole` again): what a relayed stream sent, one event
    at a time. An empty event stays with the one before it; bytes after the last blank line
    are one more piece."""
    if whole.endswith(b"\n\n") and b"\r" not in whole and b"\n\n\n" not in whole:
        # The common shape: LF lines, one blank line after each event.
        events = whole.split(b"\n\n")
        events.pop()
        return [event + b"\n\n" for event in events]
    out: list[bytes] = []
    start = 0
    for blank in _BLANK_WHOLE.finditer(whole):
        end = blank.end()
        piece = whole[start:end]
        if out and not piece.strip(b"\r\n"):
            out[-1] += piece
        else:
            out.append(piece)
        start = end
    if start < len(whole):
        out.append(whole[start:])
    return out


def whole_event(chunk: bytes) -> bool:
    """Whether `chunk` ends where an event does (at a blank line): a stored event cut short
    would run into the next one."""
    return bool(chunk) and last_boundary(chunk) == len(chunk)


def data_of(event: bytes) -> bytes | None:
    """The data payload of one raw event (its lines joined by LF, as the Decoder joins them);
    None for an event without data (a comment, a bare `event:` line)."""
    lines = []
    # bytes.splitlines ends lines at CR LF, LF and CR: SSE's line endings, and only those.
    for line in event.splitlines():
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

    __slots__ = ("_buf", "_cr", "_data")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []
        # The last bytes ended with a CR inside an event: an LF first in the next ones is the
        # rest of that CR LF, not a blank line ending the event.
        self._cr = False

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
        """The general parser: line by line, CR LF, LF or CR, comments and other fields skipped."""
        if self._cr:
            if not data:
                return []
            self._cr = False
            if data.startswith(b"\n"):
                data = data[1:]
        # One split per chunk: re-slicing the buffer line by line was quadratic in the chunk.
        lines = data.splitlines()
        # The unfinished last line waits for more bytes (none when the chunk ended one).
        self._buf = b"" if data.endswith((b"\n", b"\r")) or not lines else lines.pop()
        out: list[bytes] = []
        data_lines = self._data
        for line in lines:
            if not line:
                if data_lines:
                    out.append(b"\n".join(data_lines))
                    data_lines = []
            elif line.startswith(b"data:"):
                value = line[5:]
                data_lines.append(value[1:] if value.startswith(b" ") else value)
            # Comments (":"), `event:`, `id:` and `retry:` lines carry nothing the cache replays.
        self._data = data_lines
        # Only inside an event can an LF change anything (as a blank line it would end it),
        # and then the next bytes come here (feed's fast path takes none while one is open).
        self._cr = bool(data_lines) and data.endswith(b"\r")
        return out

    @property
    def pending(self) -> bool:
        """True when bytes of an unfinished event are buffered."""
        return bool(self._buf) or bool(self._data)


class EventTooLarge(Exception):
    """One SSE event grew past the splitter's bound before it ended."""


class Splitter:
    """Cuts an SSE byte stream into whole raw events (each with its ending blank line), linear
    in the bytes however they are chunked; an event longer than `max_bytes` (its blank line
    included) raises EventTooLarge however the stream is cut, so a never-ending line costs a
    bounded buffer and one scan of its bytes."""

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
        if (
            not self._buf
            and chunk.endswith(b"\r\n\r\n")
            and chunk.count(b"\r") == chunk.count(b"\r\n") == chunk.count(b"\n")
        ):
            # Whole events of CR LF lines only (sse-starlette's: llama-cpp-python), one split
            # (unless an empty line follows the last: that is the next event's first line).
            parts = chunk.split(b"\r\n\r\n")
            if not parts.pop():
                if len(chunk) > self.max_bytes and max(map(len, parts)) + 4 > self.max_bytes:
                    raise EventTooLarge(f"an SSE event passed {self.max_bytes} bytes")
                return [part + b"\r\n\r\n" for part in parts if part.strip(b"\r\n")]
        return self._cut(chunk, None)

    def first(self, chunk: bytes, wanted: Callable[[bytes], bool]) -> bytes | None:
        """Feed `chunk` up to the first event it completes that is `wanted`: that event, or None
        while none is (the events before it passed over, each looked at once); once one is
        found, nothing more is fed."""
        found = self._cut(chunk, wanted)
        return found[0] if found else None

    def _cut(self, chunk: bytes, wanted: Callable[[bytes], bool] | None) -> list[bytes]:
        """The events `chunk` completes, blank ones left out; with `wanted`, only the first that
        is wanted (asked of blank ones too), the bytes after it left unread."""
        buf = self._buf
        buf += chunk
        events: list[bytes] = []
        start = 0
        if b"\r" not in buf:
            search = _LF_BLANK.search
        elif b"\n" not in buf:
            search = _CR_BLANK.search
        else:
            search = (_BLANK if _LONE_CR.search(buf) else _CRLF_BLANK).search
        # One scan of the bytes, not one per event: each search starts where the last ended.
        blank = search(buf, self._scan)
        limit = self.max_bytes
        while blank is not None:
            end = blank.end()
            if end - start > limit:
                # Bounded as the one-split paths bound it, however the event arrived: whole in
                # this read, or in pieces each under the bound.
                raise EventTooLarge(f"an SSE event passed {limit} bytes")
            event = bytes(buf[start:end])
            start = end
            if wanted is None:
                if event.strip(b"\r\n"):
                    events.append(event)
            elif wanted(event):
                events.append(event)
                break
            blank = search(buf, end)
        if start:
            del buf[:start]
        # A boundary may straddle this chunk and the next: rescan the last two bytes.
        self._scan = max(0, len(buf) - 2)
        if len(buf) > limit:
            raise EventTooLarge(f"an SSE event passed {limit} bytes")
        return events

    def end(self) -> list[bytes]:
        """At the stream's end: its last event when only its blank line is missing (every line
        ended, as in `data: [DONE]\\n`), else nothing; what stays pending is a cut event."""
        buf = self._buf
        if buf.endswith(b"\n") or buf.endswith(b"\n\r"):
            # (A blank line's CR after an LF waited for an LF: CR LF's LF completes it.)
            return self.feed(b"\n")
        if buf.endswith(b"\r"):
            return self.feed(b"\r")  # a lone CR ended the last line: the blank line's
        return []

    @property
    def pending(self) -> int:
        """Bytes of an unfinished event held back."""
        return len(self._buf)
