"""Rollout on the request path: pick a version, restrict regions, record outcomes, tag responses."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass

import msgspec
from aiohttp import web

from router.access.auth import presented_key
from router.config import Commit, Config
from router.core.context import RequestContext
from router.core.failure import AttemptError, FailureKind
from router.core.stages import AttemptObserver
from router.core.upstream import Upstream
from router.errors import InvalidRequest
from router.rollout.canary import CanaryMonitor
from router.rollout.table import VERSION_HEADER, Alias, Deployment, Rollout, table_from_config


@dataclass(frozen=True, slots=True)
class Assignment:
    """The version one request was given."""

    alias: str
    deployment: Deployment

    @property
    def version(self) -> str:
        """The version tag (x-router-model-version)."""
        return self.deployment.version

    @property
    def distinct(self) -> tuple[str, tuple[str, ...]] | None:
        """The version's tag and regions when the upstream model alone does not tell it apart
        (two versions may call one upstream model, in regions of their own); None for a
        plain alias, whose model is the answer's whole story."""
        d = self.deployment
        if d.version == d.upstream_model and not d.regions:
            return None
        return d.version, d.regions


class _User(msgspec.Struct):
    user: str | None = None


_USER = msgspec.json.Decoder(_User)


class RolloutRuntime:
    """The live routing table and the canary monitor fed by every attempt."""

    def __init__(self, config: Config) -> None:
        self.rollout = Rollout(table_from_config(config))
        self.canary = CanaryMonitor(self.rollout, config.rollout.canary)

    def assign(self, ctx: RequestContext, headers: Mapping[str, str]) -> Assignment:
        """Pick the request's version and point its body at that version's upstream model."""
        table = self.rollout.table  # read once: a swap mid-request does not move this request
        parsed = ctx.request
        alias = table.alias(parsed.model)
        deployments = alias.deployments
        if len(deployments) == 1 and deployments[0].weight > 0:
            deployment = deployments[0]  # nothing to pick (a plain model, or one version)
        else:
            user = _user(parsed.body) if _needs_user(alias) else None
            deployment = table.pick(parsed.model, user=user, api_key=presented_key(headers))
        ctx.parsed = parsed.with_model(deployment.upstream_model)
        assigned = ctx.assignment = Assignment(alias.name, deployment)
        return assigned

    def regions(self, ctx: RequestContext, candidates: Sequence[Upstream]) -> Sequence[Upstream]:
        """The candidates the request's version runs in; none left counts against the version."""
        a = ctx.assignment
        if not isinstance(a, Assignment):
            return candidates
        if a.deployment.regions:
            candidates = restrict(ctx, candidates)
        if not candidates:
            # With every region of a canary down or ejected no attempt happens, yet its users
            # fail: that must weigh in the comparison with stable, or it would never roll back.
            self.canary.record(a.alias, a.deployment.version, ok=False, ttft_s=None)
        return candidates

    def prepare_reload(self, old: Config, new: Config) -> Commit:
        """A reload's rollout part: the new table is built (and checked) before anything swaps."""
        table = table_from_config(new)
        policy = new.rollout.canary

        def commit() -> None:
            self.rollout.replace(table)
            if policy != self.canary.policy:
                self.canary.set_policy(policy)

        return commit


ROLLOUT = web.AppKey("router.rollout", RolloutRuntime)


def _needs_user(alias: Alias) -> bool:
    """Only a split alias keyed on `user` needs the body decoded a second time."""
    return alias.sticky == "user" and sum(d.weight > 0 for d in alias.deployments) > 1


def _user(body: bytes) -> str | None:
    """The request's `user` field; 400 if it is there but not a string."""
    try:
        return _USER.decode(body).user
    except msgspec.ValidationError:
        raise InvalidRequest("`user` must be a string.", param="user") from None


def assignment(ctx: RequestContext | None) -> Assignment | None:
    """The version this request was given, if it got that far."""
    if ctx is None:
        return None
    found = ctx.assignment
    return found if isinstance(found, Assignment) else None


def restrict(ctx: RequestContext, candidates: Sequence[Upstream]) -> Sequence[Upstream]:
    """Drop candidate regions the request's version is not deployed in."""
    a = assignment(ctx)
    if a is None or not a.deployment.regions:
        return candidates
    allowed = a.deployment.regions
    return [u for u in candidates if u.name in allowed]


def canary_hook(runtime: RolloutRuntime) -> AttemptObserver:
    """An attempt hook: each attempt's outcome counts for its version's error rate and TTFT."""

    def hook(ctx: RequestContext, upstream: Upstream, error: AttemptError | None, s: float) -> None:
        a = assignment(ctx)
        if a is None:
            return
        if error is not None and (error.status == 429 or error.kind == FailureKind.SPILL):
            return  # the region (or the router's admission for it) is full: not the version
        runtime.canary.record(
            a.alias,
            a.deployment.version,
            ok=error is None,
            ttft_s=s if error is None else None,
            stream=ctx.request.stream,
        )

    return hook


def version_header(ctx: RequestContext, headers: MutableMapping[str, str]) -> None:
    """A response decorator: a routed request's answer names its version.

    Applied to every answer (streams, relayed errors, cache hits), not set in the relay.
    """
    a = ctx.assignment
    if a is not None:
        headers[VERSION_HEADER] = a.version
