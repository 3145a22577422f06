"""A byte-level TCP relay on uvloop: the least any Python hop can add (a floor for bench/overhead).

Each client connection gets its own upstream connection and bytes are copied both ways as they
arrive, with no HTTP parsing, so keep-alive and streaming work unchanged. What it adds to a
request is the event loop's wake-ups and the socket calls of one hop, nothing else.

    python -m bench.relay PORT UPSTREAM_PORT      # serves on 127.0.0.1:PORT until killed
"""

from __future__ import annotations

import asyncio
import sys
from typing import cast

import uvloop


class _Pipe(asyncio.Protocol):
    """One side of a relayed connection; writes what it receives to its peer."""

    def __init__(self) -> None:
        self.peer: asyncio.Transport | None = None
        self.transport: asyncio.Transport | None = None
        self.pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports quack like asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.peer is None:
            self.pending.append(data)  # the client spoke before the upstream connected
        else:
            self.peer.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None:
            self.peer.close()

    def attach(self, peer: asyncio.Transport) -> None:
        self.peer = peer
        for data in self.pending:
            peer.write(data)
        self.pending.clear()


async def serve(port: int, upstream_port: int) -> None:
    """Relay 127.0.0.1:port to 127.0.0.1:upstream_port until cancelled."""
    loop = asyncio.get_running_loop()
    connecting: set[asyncio.Task[None]] = set()

    def accepted() -> _Pipe:
        client = _Pipe()

        async def connect() -> None:
            try:
                transport, upstream = await loop.create_connection(
                    _Pipe, "127.0.0.1", upstream_port
                )
            except OSError:
                if client.transport is not None:
                    client.transport.close()
                return
            if client.transport is None or client.transport.is_closing():
                transport.close()
                return
            upstream.attach(client.transport)
            client.attach(transport)

        task = loop.create_task(connect())
        connecting.add(task)
        task.add_done_callback(connecting.discard)
        return client

    server = await loop.create_server(accepted, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    uvloop.run(serve(int(argv[0]), int(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
