"""Pure: model alias -> deployment by weight, sticky per key, in an immutable swappable table."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from router.config import MAX_WEIGHT, Config
from router.errors import InvalidRequest, NotFound, Unavailable

VERSION_HEADER = "x-router-model-version"


@dataclass(frozen=True, slots=True)
class Deployment:
    """One version of a model alias: where it runs and what the upstream calls it."""

    version: str
    upstream_model: str
    regions: tuple[str, ...] = ()
    """Regions that serve this version; empty means every region."""
    weight: float = 0.0


@dataclass(frozen=True, slots=True)
class Alias:
    """A client-facing model name and its deployments; `stable` is where a rollback goes."""

    name: str
    deployments: tuple[Deployment, ...]
    stable: str
    sticky: str = "user"
    """Which request attribute keeps a client on one version: "user" (falls back to the API key),
    "api_key", or "none"."""

    def deployment(self, version: str) -> Deployment:
        """The deployment with this version tag."""
        for d in self.deployments:
            if d.version == version:
                return d
        raise NotFound(
            f"model {self.name!r} has no version {version!r}",
            param="version",
            code="unknown_version",
        )

    def weights(self) -> dict[str, float]:
        """Version tag -> weight."""
        return {d.version: d.weight for d in self.deployments}


def validate_alias(alias: Alias) -> None:
    """Raise ValueError naming the problem if the alias cannot route anything."""
    if not alias.deployments:
        raise ValueError(f"model {alias.name!r}: no deployments")
    versions = [d.version for d in alias.deployments]
    dup = {v for v in versions if versions.count(v) > 1}
    if dup:
        raise ValueError(f"model {alias.name!r}: duplicate version {sorted(dup)[0]!r}")
    for d in alias.deployments:
        if not d.version:
            raise ValueError(f"model {alias.name!r}: empty version tag")
        if not d.upstream_model:
            raise ValueError(f"model {alias.name!r} version {d.version!r}: empty upstream_model")
        if not (math.isfinite(d.weight) and 0 <= d.weight <= MAX_WEIGHT):
            raise ValueError(
                f"model {alias.name!r} version {d.version!r}: weight must be a number from 0 "
                f"to {MAX_WEIGHT:.0e}"
            )
    if alias.stable not in versions:
        raise ValueError(f"model {alias.name!r}: stable version {alias.stable!r} is not deployed")
    if sum(d.weight for d in alias.deployments) <= 0:
        raise ValueError(f"model {alias.name!r}: all weights are zero")
    if alias.sticky not in ("user", "api_key", "none"):
        raise ValueError(f"model {alias.name!r}: sticky must be user, api_key or none")


def _unit(alias: str, version: str, key: str) -> float:
    """A stable uniform number in (0, 1) for (alias, version, key)."""
    digest = hashlib.blake2b(
        f"{alias}\x00{version}\x00{key}".encode(), digest_size=8, person=b"rollout"
    ).digest()
    return unit_of(int.from_bytes(digest, "big"))


def unit_of(h: int) -> float:
    """A 64-bit hash as a float strictly inside (0, 1)."""
    # 52 bits, so the largest value, 1 - 2**-53, is still below 1 as a float: -log(u) > 0.
    return ((h >> 12) + 0.5) / 2.0**52


def assign(alias: Alias, key: str) -> Deployment:
    """The deployment `key` sticks to: weighted rendezvous hashing.

    Each version scores w / -ln(u(key, version)) and the highest wins, so version v gets exactly
    w_v / sum(w) of keys and changing one weight moves keys only to or from that version.
    """
    best: Deployment | None = None
    best_score = -1.0
    for d in alias.deployments:
        if d.weight <= 0:
            continue
        score = d.weight / -math.log(_unit(alias.name, d.version, key))
        if score > best_score:
            best, best_score = d, score
    if best is None:
        raise Unavailable(f"model {alias.name!r} has no version with traffic", code="no_version")
    return best


def _sample(alias: Alias, rand: Callable[[], float]) -> Deployment:
    """A deployment drawn by weight, for requests without a sticky key."""
    live = [d for d in alias.deployments if d.weight > 0]
    point = rand() * sum(d.weight for d in live)
    for d in live:
        point -= d.weight
        if point < 0:
            return d
    return live[-1]


@dataclass(frozen=True, slots=True)
class RoutingTable:
    """Every alias's deployments; never mutated, so in-flight requests keep the one they read."""

    aliases: Mapping[str, Alias]
    generation: int = 0

    @classmethod
    def build(cls, aliases: Iterable[Alias], generation: int = 0) -> RoutingTable:
        """A validated table; ValueError names the alias and field at fault."""
        by_name: dict[str, Alias] = {}
        for a in aliases:
            validate_alias(a)
            if a.name in by_name:
                raise ValueError(f"model {a.name!r} defined twice")
            by_name[a.name] = a
        return cls(aliases=MappingProxyType(by_name), generation=generation)

    def alias(self, name: str) -> Alias:
        """The alias, or a 404 in OpenAI's shape."""
        found = self.aliases.get(name)
        if found is None:
            raise NotFound(
                f"The model {name!r} does not exist", param="model", code="model_not_found"
            )
        return found

    def pick(
        self,
        name: str,
        *,
        user: str | None = None,
        api_key: str | None = None,
        rand: Callable[[], float] = random.random,
    ) -> Deployment:
        """The deployment that serves this request: sticky when the request carries a key."""
        a = self.alias(name)
        live = [d for d in a.deployments if d.weight > 0]
        if len(live) == 1:
            return live[0]
        key = sticky_key(a, user=user, api_key=api_key)
        return assign(a, key) if key is not None else _sample(a, rand)

    def with_weights(self, name: str, weights: Mapping[str, float]) -> RoutingTable:
        """A new table where the named versions of `name` get new weights; others keep theirs."""
        a = self.alias(name)
        unknown = set(weights) - {d.version for d in a.deployments}
        if unknown:
            raise InvalidRequest(
                f"model {name!r} has no version {sorted(unknown)[0]!r}", param="weights"
            )
        new = replace(
            a,
            deployments=tuple(
                replace(d, weight=float(weights.get(d.version, d.weight))) for d in a.deployments
            ),
        )
        try:
            validate_alias(new)
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="weights") from None
        return self._with_alias(new)

    def rolled_back(self, name: str, to: str | None = None) -> RoutingTable:
        """A new table sending all of `name` to `to` (default the stable version).

        The other versions stay deployed at weight 0, so rolling forward again is one more swap.
        """
        a = self.alias(name)
        target = a.stable if to is None else to
        if all(d.version != target for d in a.deployments):
            raise NotFound(
                f"model {name!r} has no version {target!r}", param="to", code="unknown_version"
            )
        # The target keeps its weight, so rolling a canary forward again later gives it the
        # share asked for; one at weight 0 gets what all of them had.
        weights = {d.version: 0.0 for d in a.deployments}
        total = sum(d.weight for d in a.deployments)
        weights[target] = a.deployment(target).weight or min(total, MAX_WEIGHT)
        return self.with_weights(name, weights)

    def _with_alias(self, alias: Alias) -> RoutingTable:
        merged = dict(self.aliases)
        merged[alias.name] = alias
        return RoutingTable(aliases=MappingProxyType(merged), generation=self.generation + 1)


def sticky_key(alias: Alias, *, user: str | None, api_key: str | None) -> str | None:
    """The string a request's version is hashed on, or None for a weighted random pick."""
    if alias.sticky == "none":
        return None
    if alias.sticky == "user" and user:
        return "u:" + user
    return "k:" + api_key if api_key else None


class Rollout:
    """The live routing table; each change is one reference assignment, atomic on the loop."""

    def __init__(self, table: RoutingTable) -> None:
        self._table = table

    @property
    def table(self) -> RoutingTable:
        """The current table; a request reads it once and keeps it to the end."""
        return self._table

    def replace(self, table: RoutingTable) -> None:
        """Serve `table` from the next request on (a reload)."""
        self._table = replace(table, generation=self._table.generation + 1)

    def set_weights(self, name: str, weights: Mapping[str, float]) -> RoutingTable:
        """Change some weights of one alias; returns the table now serving."""
        self._table = self._table.with_weights(name, weights)
        return self._table

    def rollback(self, name: str, to: str | None = None) -> RoutingTable:
        """Send all of one alias to its stable version (or `to`); returns the table now serving."""
        self._table = self._table.rolled_back(name, to)
        return self._table


def table_from_config(config: Config, generation: int = 0) -> RoutingTable:
    """Every model a client may name: [rollout] versions, [models] aliases, region models.

    A plain alias or model is one deployment whose version tag is the upstream model name, so
    every response can carry a version.
    """
    aliases: list[Alias] = []
    for name, spec in config.rollout.models.items():
        deployments = tuple(
            Deployment(d.version, d.model, tuple(d.regions), d.weight) for d in spec.deployments
        )
        stable = spec.stable if spec.stable is not None else deployments[0].version
        aliases.append(Alias(name, deployments, stable=stable, sticky=spec.sticky))
    plain = dict(config.models.aliases)
    for region in config.regions:
        for model in region.models:
            plain.setdefault(model, model)
    for name, target in plain.items():
        if name not in config.rollout.models:
            aliases.append(Alias(name, (Deployment(target, target, (), 1.0),), target, "none"))
    return RoutingTable.build(aliases, generation)


def describe(table: RoutingTable) -> dict[str, object]:
    """The table as JSON-ready data for the admin API."""
    return {
        "generation": table.generation,
        "models": {
            a.name: {
                "stable": a.stable,
                "sticky": a.sticky,
                "deployments": [
                    {
                        "version": d.version,
                        "upstream_model": d.upstream_model,
                        "regions": list(d.regions),
                        "weight": d.weight,
                    }
                    for d in a.deployments
                ],
            }
            for a in table.aliases.values()
        },
    }
