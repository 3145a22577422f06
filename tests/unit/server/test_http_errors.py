"""server.http_errors.install: aiohttp's defaults patched once however often apps are built."""

from __future__ import annotations

from aiohttp import web_protocol

from router.server import http_errors


def test_install_wraps_the_parser_feed_once() -> None:
    http_errors.install()
    feed = web_protocol.RequestHandler.data_received
    http_errors.install()
    assert web_protocol.RequestHandler.data_received is feed
