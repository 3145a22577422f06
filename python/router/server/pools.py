"""The region connection pools in use, swapped whole when a reload changes the regions."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import msgspec
from aiohttp import web

from router.config import Commit, Config, Preparer
from router.core.upstream import Upstream, Upstreams, open_upstreams
from router.native import Prober
from router.routing.health import Health, prober_kwargs

log = logging.getLogger("router")


class RegionPools:
    """`current` serves new requests; retired pools close once no request can still use them."""

    def __init__(self, current: Upstreams, config: Config | None = None) -> None:
        self.current = current
        self._config = config
        self._retiring: dict[asyncio.TimerHandle, list[Upstream]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    @classmethod
    def opening(cls, config: Config) -> RegionPools:
        """Pools for `config`'s regions, opened with the app (see `lifetime`)."""
        return cls(Upstreams(()), config)

    async def lifetime(self, app: web.Application) -> AsyncIterator[None]:
        """A cleanup_ctx: region connection pools live exactly as long as the app."""
        if self._config is not None:
            self.current = open_upstreams(self._config)
        yield
        await self.close()

    def retire(self, upstreams: list[Upstream], after_s: float) -> None:
        """Close these pools after `after_s`: the longest an in-flight request may still run;
        until then they keep no connection idle."""
        if not upstreams:
            return
        for u in upstreams:
            u.pool.retire()
        loop = asyncio.get_running_loop()

        def close() -> None:
            self._retiring.pop(handle, None)
            task = loop.create_task(_close(upstreams))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

        handle = loop.call_later(after_s, close)
        self._retiring[handle] = upstreams

    async def close(self) -> None:
        """Close every pool, current and retiring (app cleanup)."""
        retiring = [u for group in self._retiring.values() for u in group]
        for handle in self._retiring:
            handle.cancel()
        self._retiring.clear()
        await _close([*self.current, *retiring])
        if self._closing:
            await asyncio.gather(*self._closing)


async def _close(upstreams: list[Upstream]) -> None:
    for u in upstreams:
        await u.pool.close()


def regions_preparer(pools: RegionPools, health: Health | None) -> Preparer:
    """[[regions]] on reload: unchanged pools kept, new ones opened, dropped ones retired."""

    def prepare(old: Config, new: Config) -> Commit:
        if old.regions == new.regions:
            return lambda: None
        if health is not None:
            # The native prober refuses some URLs; find out before anything swaps.
            check = Prober(**prober_kwargs(new.health))
            for region in new.regions:
                check.upsert_region(region.name, region.base_url, path=region.probe_path())

        def commit() -> None:
            live = {u.name: u for u in pools.current}
            kept = {
                r.name: live[r.name]
                for r in new.regions
                if r.name in live and live[r.name].config == r
            }
            fresh_config = msgspec.structs.replace(
                new, regions=tuple(r for r in new.regions if r.name not in kept)
            )
            fresh = {u.name: u for u in open_upstreams(fresh_config)}
            pools.current = Upstreams([kept.get(r.name) or fresh[r.name] for r in new.regions])
            if health is not None:
                health.set_regions(new.regions)
            pools.retire([u for u in live.values() if u.name not in kept], new.timeouts.total)
            log.info(
                "regions now %s (kept %d pools, opened %d)",
                ", ".join(r.name for r in new.regions),
                len(kept),
                len(fresh),
            )

        return commit

    return prepare


POOLS = web.AppKey("router.region_pools", RegionPools)
