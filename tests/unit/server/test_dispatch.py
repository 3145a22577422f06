"""server.dispatch: forwarded POSTs skip aiohttp's resolve, and answer as they did through it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from router.errors import InvalidRequest
from router.server import dispatch
from router.server.app import error_middleware
from router.server.dispatch import Handler


async def _forwarded(request: web.Request) -> web.StreamResponse:
    if request.headers.get("X-Fail"):
        raise InvalidRequest("refused", param="x")
    # Match info as a resolved request has it.
    assert request.match_info.route.resource is not None
    assert request.match_info.current_app is request.app
    return web.json_response({"path": request.path, "body": (await request.read()).decode()})


async def _other(request: web.Request) -> web.StreamResponse:
    return web.json_response({"other": request.path})


@pytest.fixture
async def client(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[TestClient, list[str]]]:
    resolved: list[str] = []
    resolve = web.UrlDispatcher.resolve

    async def counting(self: web.UrlDispatcher, request: web.Request) -> object:
        resolved.append(request.path)
        return await resolve(self, request)

    monkeypatch.setattr(web.UrlDispatcher, "resolve", counting)
    app = web.Application()
    errors = error_middleware()
    app.middlewares.append(errors)

    async def prepare(request: web.Request, response: web.StreamResponse) -> None:
        response.headers["X-Hook"] = "ran"

    app.on_response_prepare.append(prepare)
    route = app.router.add_post("/v1/chat/completions", _forwarded)
    app.router.add_get("/v1/chat/completions", _other)
    app.router.add_post("/v1/other", _other)
    dispatch.install(app, {"/v1/chat/completions": route}, errors)
    async with TestClient(TestServer(app)) as test_client:
        yield test_client, resolved


async def test_a_forwarded_post_is_not_resolved_and_keeps_its_hooks_and_errors(
    client: tuple[TestClient, list[str]],
) -> None:
    test_client, resolved = client
    resp = await test_client.post("/v1/chat/completions", data=b"hi")
    assert resp.status == 200
    assert await resp.json() == {"path": "/v1/chat/completions", "body": "hi"}
    assert resp.headers["X-Hook"] == "ran"
    # The error middleware wraps it as it wrapped the resolved handler.
    resp = await test_client.post("/v1/chat/completions", headers={"X-Fail": "1"})
    assert resp.status == 400
    assert (await resp.json())["error"]["message"] == "refused"
    assert resp.headers["X-Hook"] == "ran"
    assert resolved == []


@pytest.mark.parametrize(
    ("method", "path", "headers", "status", "body"),
    [
        ("GET", "/v1/chat/completions", {}, 200, {"other": "/v1/chat/completions"}),
        ("POST", "/v1/other", {}, 200, {"other": "/v1/other"}),
        (
            "POST",
            "/v1/chat/completions?x=1",
            {},
            200,
            {"path": "/v1/chat/completions", "body": ""},
        ),
        # An escaped path is not the route (aiohttp matches it undecoded): its 404.
        ("POST", "/v1/chat%2Fcompletions", {}, 404, None),
        (
            "POST",
            "/v1/chat/completions",
            {"Expect": "100-continue"},
            200,
            {"path": "/v1/chat/completions", "body": ""},
        ),
    ],
)
async def test_anything_else_takes_aiohttps_own_path(
    client: tuple[TestClient, list[str]],
    method: str,
    path: str,
    headers: dict[str, str],
    status: int,
    body: object,
) -> None:
    test_client, resolved = client
    resp = await test_client.request(method, path, headers=headers)
    assert resp.status == status
    if body is not None:
        assert await resp.json() == body
    else:
        assert (await resp.json())["error"]["code"] == "not_found"
    assert len(resolved) == 1


async def test_a_wrong_method_is_a_405_that_says_what_is_allowed(
    client: tuple[TestClient, list[str]],
) -> None:
    # aiohttp's 405 names the methods in Allow; the error middleware's OpenAI-shaped answer
    # dropped it.
    test_client, _ = client
    resp = await test_client.delete("/v1/chat/completions")
    assert resp.status == 405
    assert resp.headers["Allow"] == "GET,HEAD,POST"
    assert (await resp.json())["error"]["type"] == "invalid_request_error"


async def test_an_app_with_another_middleware_keeps_aiohttps_path() -> None:
    app = web.Application()
    errors = error_middleware()
    app.middlewares.append(errors)

    @web.middleware
    async def outer(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        response.headers["X-Outer"] = "ran"
        return response

    app.middlewares.insert(0, outer)
    route = app.router.add_post("/v1/chat/completions", _forwarded)
    dispatch.install(app, {"/v1/chat/completions": route}, errors)
    async with TestClient(TestServer(app)) as test_client:
        resp = await test_client.post("/v1/chat/completions", data=b"hi")
        assert resp.status == 200
        assert resp.headers["X-Outer"] == "ran"
