"""Server-sent events: incremental decoding of `data:` payloads and their encoding."""

from __future__ import annotations

DONE = b"[DONE]"


def encode(payload: bytes) -> bytes:
    """One SSE event carrying `payload` as its data (single line, as OpenAI sends)."""
    return b"data: " + payload + b"\n\n"


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
        # One split per chunk: re-slicing the buffer line by line was quadratic in the chunk.
        lines = (self._buf + chunk if self._buf else chunk).split(b"\n")
        self._buf = lines.pop()  # the unfinished last line, b"" when the chunk ended one
        out: list[bytes] = []
        data = self._data
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if data:
                    out.append(b"\n".join(data))
                    data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
            # Comments (":"), `event:`, `id:` and `retry:` lines carry nothing the cache replays.
        self._data = data
        return out

    @property
    def pending(self) -> bool:
        """True when bytes of an unfinished event are buffered."""
        return bool(self._buf) or bool(self._data)
