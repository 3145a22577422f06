"""RequestContext: what the router knows about one client request, as typed fields."""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import TYPE_CHECKING, Any, Protocol

from router.core.dialect import Dialect, dialect_of
from router.core.failure import FailureKind
from router.core.timing import StageTimer

if TYPE_CHECKING:
    from aiohttp import web

    from router.core.request import ParsedRequest
    from router.core.stream import EventState, StreamState
    from router.core.upstream import Upstream

# Request ids a client may choose: short, printable, no separators that would break a log line.
_ID_MAX = 128
_ID_OK = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")
# Ids correlate log lines, they guard nothing: each process draws its random bits once (no
# getrandbits or getrandom(2) per request) and then counts, each count scrambled by an odd
# multiplier (a bijection mod 2^62): every id is a distinct version-4 UUID, none looks like the
# one before, and ids of different processes do not meet.
_SEED = int.from_bytes(os.urandom(16), "big")
# Fixed per process: time_low, time_mid, the version (4) and time_hi.
_HEAD = f"{_SEED >> 96:08x}-{(_SEED >> 80) & 0xFFFF:04x}-4{(_SEED >> 68) & 0xFFF:03x}-"
_COUNT = itertools.count(_SEED & ((1 << 62) - 1))
_SCRAMBLE = 0x9E3779B97F4A7C15 | 1
_TAIL_MASK = (1 << 62) - 1
# The variant bits (RFC 4122) above the 62 bits of the tail.
_VARIANT = 0b10 << 62


def request_id(header: str | None) -> str:
    """The client's x-request-id if it is sane, otherwise a fresh random UUID (version 4)."""
    if (
        header
        and len(header) <= _ID_MAX
        and header.isascii()
        and _ID_OK.issuperset(header.encode())
    ):
        return header
    t = f"{(next(_COUNT) * _SCRAMBLE) & _TAIL_MASK | _VARIANT:016x}"
    return f"{_HEAD}{t[:4]}-{t[4:]}"


class Principal(Protocol):
    """Who a request belongs to (access.auth.Tenant)."""

    @property
    def name(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def cache_namespace(self) -> str: ...
    def allows(self, model: str) -> bool:
        """Whether this principal may use `model` (a fallback model too)."""
        ...


class Assignment(Protocol):
    """The version the rollout gave one request."""

    @property
    def version(self) -> str: ...
    @property
    def distinct(self) -> tuple[str, tuple[str, ...]] | None:
        """Its tag and regions when the upstream model alone does not tell it apart."""
        ...


class Grant(Protocol):
    """An admitted request's reservation: headers to send, then finish() exactly once."""

    @property
    def headers(self) -> dict[str, str]: ...
    def settle(self, answer: web.StreamResponse | None, generated: bool | None) -> None:
        """Reconcile with what the answer used: `generated` False means nothing (an error
        before any region answered), None unknown (the client left)."""


class BodyObserver(Protocol):
    """Sees the bytes of a streamed answer as they are relayed to the client."""

    def feed(self, chunk: bytes) -> None: ...


class UsageMeter(BodyObserver, Protocol):
    """A stream's token usage, read once it ended."""

    def used(self) -> int | None: ...


class StreamGuard(Protocol):
    """Holds back partial SSE events so a broken stream can be continued cleanly."""

    def feed(self, chunk: bytes) -> bytes: ...
    def settle(self) -> None: ...
    def flush(self) -> bytes: ...


class CacheMark(Protocol):
    """The response cache's outcome for one request (x-cache, Age)."""

    @property
    def outcome(self) -> str: ...
    @property
    def age(self) -> int | None: ...


class RequestContext:
    """One client request: identity, parsed body, what each stage decided, timings.

    Every feature's per-request state is a named field here; the driver fills them in request
    order (auth, rollout, limits, deadline, cache, selection, attempts, relay).
    """

    __slots__ = (
        "answer",
        "assignment",
        "at_headers",
        "attempts",
        "auth_ns",
        "background",
        "broken",
        "cache",
        "candidates",
        "deadline",
        "dialect",
        "endpoint",
        "fallback",
        "free_retry",
        "grant",
        "hedged",
        "last_failure",
        "loop",
        "meter",
        "model_base",
        "more_models",
        "outcomes",
        "parsed",
        "queue_depth",
        "region",
        "reported",
        "request_id",
        "shut_down",
        "spills",
        "streaming",
        "tenant",
        "timer",
        "tracker",
        "tried",
    )

    def __init__(
        self, request_id: str, endpoint: str, loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        self.request_id = request_id
        # The loop serving it, when the driver knows it (asyncio finds it with a getpid()).
        self.loop = loop
        # The upstream path, e.g. "/v1/chat/completions".
        self.endpoint = endpoint
        # The API the endpoint speaks: error shape, stream grammar.
        self.dialect: Dialect = dialect_of(endpoint)
        self.parsed: ParsedRequest | None = None
        # Name of the region that answered (or the last one tried).
        self.region: str | None = None
        self.attempts = 0
        # Attempts that spilled past a full admission queue (no region saw them).
        self.spills = 0
        self.timer = StageTimer()
        # Who asked (auth), and how long finding out took.
        self.tenant: Principal | None = None
        self.auth_ns = 0
        # The version the rollout gave the request.
        self.assignment: Assignment | None = None
        # The admitted request's token reservation and, for a stream, its usage meter.
        self.grant: Grant | None = None
        self.meter: UsageMeter | None = None
        # The monotonic time the client stops waiting (its timeout header), if it said.
        self.deadline: float | None = None
        # The response cache's outcome.
        self.cache: CacheMark | None = None
        # The regions this request may use, in order, and those attempts went to, in order.
        self.candidates: list[Upstream] = []
        self.tried: list[str] = []
        # The fallback model that answered instead of the one asked for; whether another model
        # is still there to try after the current one.
        self.fallback: str | None = None
        self.more_models = False
        # Attempts (spills aside) made for the models before the current one: each model gets
        # its own `max_attempts`, and a fallback model's first attempt is not a retry.
        self.model_base = 0
        # The region a hedge was sent to, and why the last failed attempt failed.
        self.hedged: str | None = None
        self.last_failure: FailureKind | None = None
        # Whether the next attempt costs the retry budget nothing: the failed one never reached
        # its region, or broke its connection and the next goes to another region.
        self.free_retry = False
        # A stream that may be continued elsewhere: what was sent so far.
        self.tracker: StreamGuard | None = None
        # Streams whose first byte came and whose end is not known yet: (region, model,
        # seconds to the first byte), noted by the attempt path. A first byte is not yet a
        # success: the stream may break after it (core.open_streams.OpenStreams resolves them).
        self.streaming: list[tuple[str, str, float]] = []
        # What reads the stream on after the client left (for the cache's other readers): its
        # streams end when it does.
        self.background: asyncio.Future[Any] | None = None
        # Other attempts' (region, outcome), counted once the answer left (None: from then on,
        # at once), so the count costs the answer nothing.
        self.outcomes: list[tuple[str, str]] | None = []
        self.queue_depth: int | None = None
        # Stage durations fixed when the headers went out, so the header and the log agree.
        self.at_headers: dict[str, int] | None = None
        # A relayed stream's events that reported usage (core.stream.kept_usage).
        self.reported: list[bytes] = []
        # The response whose head went (or is going) out: past it, nothing may answer again.
        self.answer: web.StreamResponse | None = None
        # Why the router ended the stream as a failure (the access record's `error`).
        self.broken: str | None = None
        # Cancelled by the end of a drain (Pipeline.shut_down), not by its client leaving.
        self.shut_down = False

    def stream_failure(
        self, message: str, state: StreamState | EventState, code: str = "upstream_stream_error"
    ) -> bytes:
        """The event ending a stream the router could not finish (Dialect.stream_failure),
        the failure noted for the access record and the metrics."""
        self.broken = message
        return self.dialect.stream_failure(message, state, code)

    @property
    def request(self) -> ParsedRequest:
        """The parsed request; only valid after the parse stage."""
        assert self.parsed is not None, "request not parsed yet"
        return self.parsed

    @property
    def owner(self) -> str:
        """Whose stored responses these are (Responses API state): the tenant's name, or ""."""
        return self.tenant.name if self.tenant is not None else ""

    @property
    def failovers(self) -> int:
        """Attempts that moved to another region after a failure (a hedge is not one)."""
        tried = self.tried
        moves = 0
        for i in range(1, len(tried)):
            if tried[i] != tried[i - 1]:
                moves += 1
        return max(0, moves - (1 if self.hedged is not None else 0))
