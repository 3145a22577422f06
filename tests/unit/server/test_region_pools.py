"""Region pools on reload: kept, opened, retired after the grace, all closed at cleanup."""

from __future__ import annotations

import asyncio

import msgspec

from router.config import Config, loads
from router.core.upstream import open_upstreams
from router.server.pools import RegionPools, regions_preparer


def config(*regions: tuple[str, int]) -> Config:
    tables = "".join(
        f'[[regions]]\nname = "{name}"\nbase_url = "http://127.0.0.1:{port}"\nmodels = ["m"]\n'
        for name, port in regions
    )
    return loads(tables + "\n[timeouts]\ntotal = 0.05\n")


async def test_kept_opened_and_retired_pools() -> None:
    old = config(("a", 1), ("b", 2), ("c", 3))
    pools = RegionPools(open_upstreams(old))
    before = {u.name: u for u in pools.current}
    new = config(("c", 3), ("a", 1), ("b", 9), ("d", 4))  # b re-pointed, d added, order changed
    regions_preparer(pools, None)(old, new)()
    now = {u.name: u for u in pools.current}
    assert [u.name for u in pools.current] == ["c", "a", "b", "d"]
    assert now["a"] is before["a"]
    assert now["c"] is before["c"]
    assert now["b"] is not before["b"]
    assert now["b"].base == "http://127.0.0.1:9"
    assert not before["b"].pool.closed  # in-flight requests may still use it
    await asyncio.sleep(0.2)  # past timeouts.total
    assert before["b"].pool.closed
    assert not now["b"].pool.closed
    await pools.close()
    assert all(u.pool.closed for u in now.values())


async def test_unchanged_regions_are_a_no_op() -> None:
    old = config(("a", 1))
    pools = RegionPools(open_upstreams(old))
    current = pools.current
    regions_preparer(pools, None)(old, config(("a", 1)))()
    assert pools.current is current
    await pools.close()


async def test_close_at_cleanup_also_closes_pools_still_retiring() -> None:
    old = config(("a", 1), ("b", 2))
    pools = RegionPools(open_upstreams(old))
    b = next(u for u in pools.current if u.name == "b")
    short = config(("a", 1))
    new = msgspec.structs.replace(
        short, timeouts=msgspec.structs.replace(short.timeouts, total=600.0)
    )
    regions_preparer(pools, None)(old, new)()
    assert not b.pool.closed
    await pools.close()
    assert b.pool.closed


async def test_a_retired_pool_keeps_no_connection_idle() -> None:
    # A region answering keep-alive: one exchange through the pool, its connection idle after.
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                await reader.readexactly(2)  # the request's body, "{}"
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the router closed it
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    old = loads(f'[[regions]]\nname = "a"\nbase_url = "http://127.0.0.1:{port}"\nmodels = ["m"]\n')
    pools = RegionPools(open_upstreams(old))
    (a,) = pools.current
    try:
        for _ in range(2):
            resp = await a.pool.post("/v1/x", b"{}", [("Content-Type", "application/json")])
            while await resp.content.readany():
                pass
            resp.release()
            if not a.pool.retiring:
                assert a.pool.idle_count == 1
                # A reload re-points the region: its old pool is retired, not closed yet.
                new = msgspec.structs.replace(
                    old, regions=(msgspec.structs.replace(old.regions[0], bias_ms=1.0),)
                )
                regions_preparer(pools, None)(old, new)()
                assert not a.pool.closed
                assert a.pool.idle_count == 0  # closed at once, not after timeouts.total
        # A request still using it got a fresh connection, not kept afterwards either.
        assert a.pool.idle_count == 0
    finally:
        await pools.close()
        server.close()
        await server.wait_closed()
