"""Model fallbacks: which failures move a request to the next model, as `fallback_on` lists."""

from __future__ import annotations

import pytest

from router.config import ModelsConfig
from router.core.failure import AttemptError, FailureKind
from router.routing.fallback import Fallbacks, reason

FAILURES: dict[str, AttemptError | None] = {
    "unavailable": None,
    "overloaded": AttemptError("a", FailureKind.STATUS, "HTTP 429", status=429),
    "server_error": AttemptError("a", FailureKind.STATUS, "HTTP 503", status=503),
    "timeout": AttemptError("a", FailureKind.TIMEOUT, "no first byte"),
    "context_length": AttemptError(
        "a", FailureKind.REQUEST, "HTTP 400", status=400, body=b'{"code":"context_length_exceeded"}'
    ),
    "unsupported": AttemptError("a", FailureKind.UNSUPPORTED, "HTTP 500: image input", status=400),
}


def test_every_failure_has_its_name() -> None:
    assert {name: reason(error) for name, error in FAILURES.items()} == {n: n for n in FAILURES}
    refusal = AttemptError("a", FailureKind.REQUEST, "HTTP 400", status=400, body=b"policy")
    assert reason(refusal) is None
    # No region has the model after all (each said so): as if none served it.
    unserved = AttemptError("a", FailureKind.UNSERVED, "HTTP 404", status=404)
    assert reason(unserved) == "unavailable"


@pytest.mark.parametrize(
    "listed", [("timeout",), ("overloaded", "context_length"), ("unsupported",), ()]
)
def test_only_the_listed_failures_move_a_request_on(listed: tuple[str, ...]) -> None:
    fallbacks = Fallbacks(ModelsConfig(fallbacks={"big": ("small",)}, fallback_on=listed))  # type: ignore[arg-type]
    assert {n for n, error in FAILURES.items() if fallbacks.moves(error)} == set(listed)
    assert fallbacks.chain("big") == ("small",)
