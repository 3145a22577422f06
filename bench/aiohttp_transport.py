"""The upstream seam on aiohttp's ClientSession: what `router.net.http1` replaced, kept so
bench/overhead can measure the two side by side in one run (`router-core-aiohttp`)."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

import aiohttp
from multidict import CIMultiDictProxy

from router.net import http1


class _Response:
    """aiohttp's ClientResponse as a core.transport.UpstreamResponse."""

    __slots__ = ("_resp",)

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp

    @property
    def status(self) -> int:
        return self._resp.status

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        return self._resp.headers

    @property
    def content(self) -> aiohttp.StreamReader:
        return self._resp.content

    @property
    def content_length(self) -> int | None:
        return self._resp.content_length

    def release(self) -> None:
        self._resp.release()

    def close(self) -> None:
        self._resp.close()


class AiohttpTransport:
    """One region's keep-alive pool in an aiohttp ClientSession (created in the running loop)."""

    def __init__(self, base_url: str, *, limit: int, keepalive_s: float) -> None:
        url = urlsplit(base_url)
        self._origin = f"{url.scheme}://{url.netloc}"
        connector = aiohttp.TCPConnector(limit=limit, keepalive_timeout=keepalive_s)
        # As the router's own client: no decompression, no headers of aiohttp's own.
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",)
        )

    async def post(self, path: str, body: bytes, headers: Iterable[tuple[str, str]]) -> _Response:
        # aiohttp's failures as the upstream seam names them; no stale keep-alive retry here
        # (router.net.http1 has one): a region closing an idle connection costs an attempt.
        try:
            resp = await self._session.post(self._origin + path, data=body, headers=list(headers))
        except aiohttp.ClientConnectorError as exc:
            raise http1.ConnectError(str(exc)) from None
        except aiohttp.ClientError as exc:
            raise http1.ClientError(str(exc) or type(exc).__name__) from None
        return _Response(resp)

    def retire(self) -> None:
        """The bench never reloads its regions: aiohttp's idle connections go with close()."""

    async def close(self) -> None:
        await self._session.close()
