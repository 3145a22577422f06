"""Model fallbacks: which model to try next when no region could answer, and after what."""

from __future__ import annotations

from collections.abc import Sequence

from router.config import Commit, Config, ModelsConfig
from router.core.failure import AttemptError, FailureKind, overflows_context

# What each [models] fallback_on name covers.
_STATUS_KINDS = frozenset({FailureKind.INVALID, FailureKind.DISCONNECT, FailureKind.TOO_LARGE})


def reason(error: AttemptError | None) -> str | None:
    """The fallback_on name of a request's last failure (None: no answer at all, or one that
    no fallback can change, such as a content-policy refusal)."""
    if error is None:
        return "unavailable"
    kind = error.kind
    if kind == FailureKind.REQUEST:
        return "context_length" if overflows_context(error.body) else None
    if kind == FailureKind.UNSUPPORTED:
        return "unsupported"
    if kind == FailureKind.SPILL or (kind == FailureKind.STATUS and error.status == 429):
        return "overloaded"
    if kind in (FailureKind.TIMEOUT, FailureKind.CONNECT):
        return "timeout" if kind == FailureKind.TIMEOUT else "unavailable"
    if kind == FailureKind.UNSERVED:
        return "unavailable"  # no region has the model now, as if none served it
    if kind == FailureKind.STATUS or kind in _STATUS_KINDS:
        return "server_error"
    return None


class Fallbacks:
    """The [models] fallback chains (core.stages.FallbackPolicy)."""

    __slots__ = ("_chains", "_on")

    def __init__(self, config: ModelsConfig) -> None:
        self._chains = {model: tuple(chain) for model, chain in config.fallbacks.items()}
        self._on = frozenset(config.fallback_on)

    def chain(self, model: str) -> Sequence[str]:
        """The models to try after `model`, in order."""
        return self._chains.get(model, ())

    def prepare_reload(self, old: Config, new: Config) -> Commit:
        """[models] fallbacks on reload: the new chains, swapped in one step."""
        fresh = Fallbacks(new.models)

        def commit() -> None:
            self._chains, self._on = fresh._chains, fresh._on

        return commit

    def moves(self, error: AttemptError | None) -> bool:
        """Whether this failure moves the request to the next model."""
        why = reason(error)
        return why is not None and why in self._on
