"""The stage interfaces the driver calls; features implement them, build_app plugs them in.

Core never imports a feature: each feature depends on these Protocols, never the reverse.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Protocol

from router.core.context import (
    Assignment,
    BodyObserver,
    CacheMark,
    Grant,
    Principal,
    StreamGuard,
    UsageMeter,
)

if TYPE_CHECKING:
    from aiohttp import web

    from router.core.context import RequestContext
    from router.core.failure import AttemptError
    from router.core.upstream import Opened, Upstream, Upstreams
    from router.errors import ApiError

__all__ = [
    "Assignment",
    "AttemptObserver",
    "Authenticator",
    "BodyObserver",
    "CacheMark",
    "Continuer",
    "Discard",
    "ExchangeObserver",
    "FallbackPolicy",
    "Gate",
    "Grant",
    "Hedger",
    "Opener",
    "Origin",
    "Principal",
    "RequestFilter",
    "ResponseCache",
    "ResponseDecorator",
    "RetryPolicy",
    "Selector",
    "Slot",
    "SlotGate",
    "StateHomes",
    "StreamGuard",
    "StreamObserver",
    "Tap",
    "UsageMeter",
    "VersionRouter",
]


class Authenticator(Protocol):
    """Maps a request's headers to its principal, or raises 401."""

    def authenticate(self, headers: Mapping[str, str]) -> Principal: ...


class VersionRouter(Protocol):
    """Model alias -> version -> upstream model, and the regions that version runs in."""

    def assign(self, ctx: RequestContext, headers: Mapping[str, str]) -> object: ...
    def regions(
        self, ctx: RequestContext, candidates: Sequence[Upstream]
    ) -> Sequence[Upstream]: ...


class RequestFilter(Protocol):
    """Runs after parsing, before the cache: may refuse (ApiError) or fill ctx fields."""

    async def admit(self, ctx: RequestContext, headers: Mapping[str, str]) -> None: ...


class Selector(Protocol):
    """Orders the regions serving the request's model."""

    def __call__(self, ctx: RequestContext, upstreams: Upstreams, /) -> Sequence[Upstream]: ...


class RetryPolicy(Protocol):
    """Per-request retry decisions (Envoy's RetryState)."""

    def begin(self, ctx: RequestContext, headers: Mapping[str, str]) -> None: ...
    def allow(self, ctx: RequestContext) -> bool: ...
    def first_byte(self, ctx: RequestContext, configured: float) -> float: ...


class FallbackPolicy(Protocol):
    """Model fallbacks: the next models to try, and which failures move to them."""

    def chain(self, model: str) -> Sequence[str]: ...
    def moves(self, error: AttemptError | None) -> bool: ...


class Slot(Protocol):
    """A held in-flight slot of one region."""

    @property
    def wait_s(self) -> float: ...
    @property
    def queue_depth(self) -> int: ...
    def release(self) -> None: ...


class SlotGate(Protocol):
    """Admission: a region's in-flight slot, held from its attempt to the end of the answer."""

    async def acquire(self, region: str, *, priority: int = 0) -> Slot: ...
    def unavailable(self, region: str, reason: str) -> ApiError: ...


class AttemptObserver(Protocol):
    """Called after every attempt: (ctx, region, error or None, seconds to its first byte)."""

    def __call__(
        self,
        ctx: RequestContext,
        upstream: Upstream,
        error: AttemptError | None,
        seconds: float,
        /,
    ) -> None: ...


class StreamObserver(Protocol):
    """Hears how each stream that got its first byte ended (core.open_streams.OpenStreams
    tells it, once per stream). AttemptObservers hear of a stream at its first byte, which is
    not yet a success: a region that cuts every stream after it must still build up
    consecutive failures (ejection, circuits)."""

    def broke(self, ctx: RequestContext, region: str, model: str) -> None:
        """The stream from `region` (serving `model`) broke after its first byte."""
        ...

    def went_through(self, ctx: RequestContext, region: str, model: str, ttft_s: float) -> None:
        """The stream from `region` did not break (or its client left), `ttft_s` to its first
        byte."""
        ...

    def ended(self, ctx: RequestContext) -> None:
        """The request's attempts are over (after every stream's own report)."""
        ...


Opener = Callable[["Upstream"], Awaitable["Opened"]]
Gate = Callable[["RequestContext"], bool]
# Lets go of an answer nobody will use (a hedge's loser): its request closed, its slot given back.
Discard = Callable[["Opened"], None]


class Hedger(Protocol):
    """Wraps one request's opener so a slow attempt is hedged on the next region."""

    def __call__(
        self,
        ctx: RequestContext,
        candidates: Sequence[Upstream],
        open_one: Opener,
        observers: Sequence[AttemptObserver],
        gate: Gate,
        discard: Discard,
        /,
    ) -> Opener: ...


class Continuer(Protocol):
    """Continues a stream that broke after bytes reached the client (mid-stream policy)."""

    def track(self, ctx: RequestContext) -> StreamGuard | None: ...
    async def resume(
        self,
        ctx: RequestContext,
        write: Callable[[bytes], Awaitable[None]],
        open_one: Callable[[Upstream, bytes], Awaitable[Opened]],
        reason: str,
        idle_s: float,
        max_bytes: float = ...,
    ) -> bool: ...


class Tap(Protocol):
    """Sees what a cache miss sends the client (the response cache's tee)."""

    def chunk(self, data: bytes) -> None: ...
    def end(self, clean: bool, *, storable: bool = True) -> None:
        """The stream ended (`clean`: whole); one that may not be stored is only shared."""
        ...

    def body(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        """A whole answer relayed as it came (`headers`: what the client got of the region's)."""
        ...

    def refused(self, answer: web.Response) -> None:
        """The answer the router made when no region gave one (core.responses.failure_response),
        or instead of a region's that was no API error (core.responses.refusal_response)."""
        ...

    def wanted(self) -> bool:
        """Whether others read this exchange (coalesced requests): it outlives its client."""
        ...

    def detach(self) -> None:
        """The exchange goes on without the client that started it."""


Origin = Callable[["Tap | None"], Awaitable["web.StreamResponse"]]


class ResponseCache(Protocol):
    """Wraps selection + forward: answers from the cache, or tees the origin's answer."""

    async def serve(
        self, request: web.Request, ctx: RequestContext, origin: Origin
    ) -> web.StreamResponse: ...


class StateHomes(Protocol):
    """Which region holds state a request refers to (Responses API stored responses), per
    owning tenant: `home` raises NotFound for another tenant's."""

    def record(self, response_id: str, region: str, owner: str) -> None: ...
    async def home(self, response_id: str, owner: str) -> str | None: ...
    async def homes(self, ids: tuple[str, ...], owner: str) -> list[str | None]: ...


class ResponseDecorator(Protocol):
    """Adds a feature's headers to every answer of a proxied request, as it is prepared."""

    def __call__(self, ctx: RequestContext, headers: MutableMapping[str, str], /) -> None: ...


class ExchangeObserver(Protocol):
    """Times the exchange and records it once it is over (observability)."""

    def stamp(self, ctx: RequestContext, response: web.StreamResponse) -> None: ...
    def finish(
        self,
        request: web.Request,
        ctx: RequestContext,
        status: int,
        answer: web.StreamResponse | None,
    ) -> None: ...
