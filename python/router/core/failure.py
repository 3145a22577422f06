"""Why an attempt failed: one enum of kinds, one mapping to health, retryability as data."""

from __future__ import annotations

from enum import StrEnum

from multidict import CIMultiDict


class FailureKind(StrEnum):
    """What went wrong with one attempt at one region."""

    # No connection could be opened (refused, unreachable, connect timeout): nothing was sent.
    CONNECT = "connect"
    # No first byte within the first-byte timeout.
    TIMEOUT = "timeout"
    # The connection broke before the answer was usable.
    DISCONNECT = "disconnect"
    # The region answered a status another region may do better on (429, 5xx).
    STATUS = "status"
    # A 2xx that is not what was asked for (HTML page, cut JSON, a stream that is not SSE).
    INVALID = "invalid"
    # The answer passed [server] max_response_bytes.
    TOO_LARGE = "too_large"
    # Admission: the region is full here and now; says nothing of its health.
    SPILL = "spill"
    # The request caused it (a validation error, context length, content policy): every region
    # would answer the same, so it is returned as it is, retried nowhere, held against no one.
    REQUEST = "request"
    # The region cannot serve this request, and said so with a server error (llama-server
    # answers an input it has no model for, or a parameter it does not take, with a 500):
    # another region may serve it; held against no one, free of the retry budget.
    UNSUPPORTED = "unsupported"
    # The region answered 404 that it has no model by the name the config says it serves (the
    # region's config drifted): another region may serve it; held against that (region, model)
    # circuit, never against the region's health; free of the retry budget.
    UNSERVED = "unserved"


class Origin(StrEnum):
    """Which side a failure came from (pingora's ErrorSource)."""

    UPSTREAM = "upstream"
    DOWNSTREAM = "downstream"
    INTERNAL = "internal"


def health_outcome(kind: FailureKind | str | None, status: int | None) -> str | None:
    """A failure as a prober outcome (what it says about the region); None: nothing at all."""
    if kind is None:
        return "ok"
    if kind in (FailureKind.SPILL, FailureKind.REQUEST, FailureKind.UNSUPPORTED):
        return None
    if kind == FailureKind.CONNECT:
        return "connect_error"
    if kind == FailureKind.TIMEOUT:
        return "timeout"
    if kind == FailureKind.UNSERVED or (
        kind == FailureKind.STATUS and status is not None and status < 500
    ):
        # 429 (and other 4xx): the region is alive, just busy or refusing this one request (or
        # lacking this one model).
        return "neutral"
    return "server_error"


# How servers say a prompt is too long for the model's context: OpenAI's and llama-cpp-python's
# error code, llama-server's error type, vLLM's messages, and the router's own word for an
# empty stream (llama-cpp-python's answer to a streamed prompt over its context).
_OVERFLOWS = (
    b"context_length_exceeded",
    b"exceed_context_size_error",
    b"maximum context length",
    b"longer than the maximum model length",
    b'"empty_stream"',
)


def overflows_context(body: bytes) -> bool:
    """Whether an error answer says the prompt does not fit the model's context (another model,
    with a larger one, may take it)."""
    return any(words in body for words in _OVERFLOWS)


def unreachable(kind: FailureKind | str) -> bool:
    """Whether the failure means the region could not be reached at all."""
    return kind in (FailureKind.CONNECT, FailureKind.TIMEOUT)


class AttemptError(Exception):
    """One attempt at one region failed before anything reached the client."""

    def __init__(
        self,
        region: str,
        kind: FailureKind,
        detail: str,
        *,
        retryable: bool = True,
        status: int | None = None,
        headers: CIMultiDict[str] | None = None,
        body: bytes = b"",
        origin: Origin = Origin.UPSTREAM,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(f"{region}: {kind}: {detail}")
        self.region = region
        self.kind = kind
        # Whether another attempt (here or elsewhere) may follow this one.
        self.retryable = retryable
        self.origin = origin
        # For STATUS: the region's answer, relayed if no other region does better.
        self.status = status
        self.headers = headers
        self.body = body
        # What the region asked for (Retry-After, retry-after-ms), if it said.
        self.retry_after_s = retry_after_s

    @property
    def same_region(self) -> bool:
        """Whether trying this region again for the same request may go better: not after it
        stayed silent (never wait on the same silent region twice), sent something broken, or
        was full."""
        return self.retryable and self.kind in (
            FailureKind.STATUS,
            FailureKind.DISCONNECT,
            FailureKind.CONNECT,
        )


class Spill(Exception):
    """Admission: this region cannot take the request in time; try the next one."""

    def __init__(self, region: str, reason: str) -> None:
        super().__init__(f"{region}: {reason}")
        self.region = region
        self.reason = reason
