"""Auth end to end: a real router and sim region; raw HTTP and the openai SDK see 401/403/429."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from router.access.auth import hash_key
from tests.integration.conftest import region_toml, sim_stats, start_router, start_sim
from tests.support import Proc

KEYS = {
    "alpha": "sk-alpha-0123456789abcdef",  # sim-1 only
    "beta": "sk-beta-0123456789abcdef",  # every model
    "tight": "sk-tight-0123456789abcdef",  # 2 requests, then one a minute
    "slow": "sk-slow-0123456789abcdef",  # 1 request, then one every 3 s
}
ADMIN = "admin-0123456789abcdef"
MESSAGES = [{"role": "user", "content": "hello"}]
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": MESSAGES, "max_tokens": 4},
    "/v1/completions": {"prompt": "hello", "max_tokens": 4},
    "/v1/embeddings": {"input": "hello"},
}


def _config(sim: Proc) -> str:
    keys = [
        ("alpha", 'models = ["sim-1"]'),
        ("beta", ""),
        ("tight", "requests_per_minute = 1\nrequest_burst = 2"),
        ("slow", "requests_per_minute = 20\nrequest_burst = 1"),
    ]
    entries = "".join(
        f'[[auth.keys]]\nsha256 = "{hash_key(KEYS[name])}"\ntenant = "{name}"\n{extra}\n'
        for name, extra in keys
    )
    head = f'[auth]\nadmin_token_sha256 = "{hash_key(ADMIN)}"\n{entries}\n'
    # The cache is on so its admin endpoints exist (and must refuse tenant keys too).
    return head + "[cache]\nenabled = true\n" + region_toml(sim, models=("sim-1", "sim-2"))


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    proc = start_sim(tmp_path_factory.mktemp("sim"), "a", models="sim-1,sim-2")
    yield proc
    proc.kill()


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory, sim: Proc) -> Iterator[Proc]:
    proc = start_router(tmp_path_factory.mktemp("auth"), _config(sim))
    yield proc
    proc.kill()


def _sdk(router: Proc, key: str, retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{router.url}/v1", api_key=key, max_retries=retries)


async def _post(
    router: Proc, path: str, headers: dict[str, str], model: str = "sim-1"
) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            router.url + path, json={"model": model, **BODIES[path]}, headers=headers
        ) as resp,
    ):
        return resp.status, await resp.json(), dict(resp.headers)


def _assert_openai_error(body: dict[str, Any], type_: str) -> dict[str, Any]:
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == type_
    assert error["message"]
    return error


@pytest.mark.parametrize("path", list(BODIES))
async def test_every_endpoint_refuses_a_missing_key(router: Proc, path: str) -> None:
    status, body, _ = await _post(router, path, {})
    assert status == 401
    assert _assert_openai_error(body, "authentication_error")["code"] == "missing_api_key"


@pytest.mark.parametrize("path", list(BODIES))
async def test_every_endpoint_refuses_a_wrong_key(router: Proc, path: str) -> None:
    wrong = "sk-wrong-0123456789abcdef"
    status, body, _ = await _post(router, path, {"Authorization": f"Bearer {wrong}"})
    assert status == 401
    error = _assert_openai_error(body, "authentication_error")
    assert error["code"] == "invalid_api_key"
    assert wrong not in error["message"]


@pytest.mark.parametrize("path", list(BODIES))
async def test_every_endpoint_refuses_another_tenants_model(router: Proc, path: str) -> None:
    status, body, _ = await _post(router, path, {"x-api-key": KEYS["alpha"]}, model="sim-2")
    assert status == 403
    error = _assert_openai_error(body, "permission_error")
    assert (error["code"], error["param"]) == ("model_not_allowed", "model")


@pytest.mark.parametrize("path", list(BODIES))
async def test_every_endpoint_serves_an_allowed_key(router: Proc, path: str) -> None:
    status, _, _ = await _post(router, path, {"Authorization": f"Bearer {KEYS['beta']}"}, "sim-2")
    assert status == 200


@pytest.mark.parametrize(
    ("method", "path", "status", "allow"),
    [
        ("POST", "/v1/responses/resp_1", 405, "DELETE,GET,HEAD"),
        ("PUT", "/v1/responses/resp_1", 405, "DELETE,GET,HEAD"),
        ("GET", "/v1/responses/resp_1/cancel", 405, "POST"),
        ("POST", "/v1/responses/resp_1/input_items", 405, "GET,HEAD"),
        ("GET", "/v1/chat/completions", 405, "POST"),
        ("DELETE", "/v1/embeddings", 405, "POST"),
        ("GET", "/v1/messages", 405, "POST"),
        ("GET", "/v1/nothing", 404, None),
        ("DELETE", "/v1/nothing", 404, None),
        ("POST", "/v1/nothing", 404, None),
        ("POST", "/v1", 404, None),
        ("GET", "/v1", 404, None),
    ],
)
async def test_what_is_not_served_is_authenticated_first(
    router: Proc, method: str, path: str, status: int, allow: str | None
) -> None:
    # A wrong method, or any method but POST on an unknown path, was answered 405 or 404 to
    # anyone: without a key, which paths exist showed. Now 401 as on a served path, then the
    # 405 (with Allow) or 404, in the shape of the path's API.
    anthropic = path == "/v1/messages"
    async with aiohttp.ClientSession() as session:
        for headers in ({}, {"x-api-key": KEYS["beta"]}):
            async with session.request(method, router.url + path, headers=headers) as resp:
                body = await resp.json()
                assert resp.status == (status if headers else 401)
                assert resp.headers.get("Allow") == (allow if headers else None)
            if anthropic:
                assert body["type"] == "error"
                kind = "invalid_request_error" if headers else "authentication_error"
                assert body["error"]["type"] == kind
            elif headers:
                _assert_openai_error(body, "invalid_request_error")
            else:
                assert _assert_openai_error(body, "authentication_error")["code"] == (
                    "missing_api_key"
                )


async def test_model_list_needs_a_key(router: Proc) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(router.url + "/v1/models") as resp:
            assert resp.status == 401
        headers = {"x-api-key": KEYS["beta"]}
        async with session.get(router.url + "/v1/models", headers=headers) as resp:
            assert resp.status == 200


async def test_model_list_shows_only_the_keys_models(router: Proc) -> None:
    async with aiohttp.ClientSession() as session:
        for name, expected in (("alpha", ["sim-1"]), ("beta", ["sim-1", "sim-2"])):
            headers = {"Authorization": f"Bearer {KEYS[name]}"}
            async with session.get(router.url + "/v1/models", headers=headers) as resp:
                listed = [m["id"] for m in (await resp.json())["data"]]
            assert listed == expected, name


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/admin/rollout"),
        ("POST", "/admin/rollout/weights"),
        ("POST", "/admin/rollout/rollback"),
        ("POST", "/admin/reload"),
        ("GET", "/admin/health"),
        ("POST", "/admin/regions/a/drain"),
        ("POST", "/admin/regions/a/disable"),
        ("POST", "/admin/regions/a/enable"),
        ("GET", "/admin/cache/stats"),
        ("POST", "/admin/cache/purge"),
    ],
)
async def test_admin_endpoints_refuse_tenant_keys(router: Proc, method: str, path: str) -> None:
    async with aiohttp.ClientSession() as session:
        for key, status in [(None, 401), (KEYS["beta"], 403), ("not-a-key-at-all", 401)]:
            headers = {} if key is None else {"Authorization": f"Bearer {key}"}
            async with session.request(method, router.url + path, headers=headers) as resp:
                assert resp.status == status, (key, await resp.text())
                kind = "authentication_error" if status == 401 else "permission_error"
                _assert_openai_error(await resp.json(), kind)
        headers = {"Authorization": f"Bearer {ADMIN}"}
        async with session.get(router.url + "/admin/rollout", headers=headers) as resp:
            assert resp.status == 200


def test_sdk_raises_authentication_error(router: Proc) -> None:
    with pytest.raises(openai.AuthenticationError) as caught:
        _sdk(router, "sk-wrong-0123456789abcdef").chat.completions.create(
            model="sim-1", messages=MESSAGES, max_tokens=4
        )
    assert caught.value.status_code == 401
    assert caught.value.code == "invalid_api_key"
    assert caught.value.type == "authentication_error"


def test_sdk_raises_permission_denied(router: Proc) -> None:
    with pytest.raises(openai.PermissionDeniedError) as caught:
        _sdk(router, KEYS["alpha"]).chat.completions.create(
            model="sim-2", messages=MESSAGES, max_tokens=4
        )
    assert caught.value.code == "model_not_allowed"


def test_sdk_raises_rate_limit_error_with_retry_headers(router: Proc) -> None:
    sdk = _sdk(router, KEYS["tight"])
    for _ in range(2):
        raw = sdk.chat.completions.with_raw_response.create(
            model="sim-1", messages=MESSAGES, max_tokens=4
        )
        assert raw.headers["x-ratelimit-limit-requests"] == "1"
    assert raw.headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(openai.RateLimitError) as caught:
        sdk.chat.completions.create(model="sim-1", messages=MESSAGES, max_tokens=4)
    assert caught.value.code == "rate_limit_exceeded"
    assert caught.value.type == "rate_limit_error"
    headers = caught.value.response.headers
    assert 1 <= int(headers["retry-after"]) <= 60
    assert int(headers["retry-after-ms"]) > 1000 * (int(headers["retry-after"]) - 1)
    assert headers["x-ratelimit-remaining-requests"] == "0"


def test_sdk_retry_waits_as_the_headers_say(router: Proc) -> None:
    # One request per 3 s: the SDK's own backoff (0.5 s, then 1 s) would give up after two
    # retries; only waiting the Retry-After it was told gets the second call through.
    sdk = _sdk(router, KEYS["slow"], retries=2)
    sdk.chat.completions.create(model="sim-1", messages=MESSAGES, max_tokens=4)
    began = time.monotonic()
    answer = sdk.chat.completions.create(model="sim-1", messages=MESSAGES, max_tokens=4)
    assert answer.choices
    assert time.monotonic() - began >= 2.0


def test_refused_requests_never_reach_a_region(router: Proc, sim: Proc) -> None:
    before = sim_stats(sim)["requests"]
    with pytest.raises(openai.AuthenticationError):
        _sdk(router, "sk-nope-0123456789abcdef").chat.completions.create(
            model="sim-1", messages=MESSAGES, max_tokens=4
        )
    with pytest.raises(openai.PermissionDeniedError):
        _sdk(router, KEYS["alpha"]).chat.completions.create(
            model="sim-2", messages=MESSAGES, max_tokens=4
        )
    assert sim_stats(sim)["requests"] == before


async def test_undecodable_key_bytes_get_401_not_500(router: Proc) -> None:
    body = b'{"model": "sim-1", "messages": [{"role": "user", "content": "hi"}]}'
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nAuthorization: Bearer \xff\xfe\xfd-key-bytes\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    try:
        writer.write(head + body)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()
        await writer.wait_closed()
    assert status_line.split()[1] == b"401"


async def test_reload_adds_revokes_and_relimits_keys(tmp_path: Path, sim: Proc) -> None:
    router = start_router(tmp_path, _config(sim))
    path = tmp_path / f"router-{router.port}.toml"
    fresh = "sk-fresh-0123456789abcdef"
    admin = {"Authorization": f"Bearer {ADMIN}"}
    try:
        text = path.read_text()
        beta = f'[[auth.keys]]\nsha256 = "{hash_key(KEYS["beta"])}"\ntenant = "beta"\n'
        assert beta in text
        # beta revoked, alpha limited to 1 request (burst 1), a new key added.
        text = text.replace(
            beta, f'[[auth.keys]]\nsha256 = "{hash_key(fresh)}"\ntenant = "fresh"\n'
        )
        alpha = 'tenant = "alpha"\nmodels = ["sim-1"]\n'
        text = text.replace(alpha, alpha + "requests_per_minute = 1\nrequest_burst = 1\n")
        path.write_text(text)
        async with aiohttp.ClientSession() as session:
            async with session.post(router.url + "/admin/reload", headers=admin) as resp:
                assert resp.status == 200, await resp.text()
            path_ = "/v1/chat/completions"
            assert (await _post(router, path_, {"x-api-key": fresh}))[0] == 200
            assert (await _post(router, path_, {"x-api-key": KEYS["beta"]}))[0] == 401
            assert (await _post(router, path_, {"x-api-key": KEYS["alpha"]}))[0] == 200
            assert (await _post(router, path_, {"x-api-key": KEYS["alpha"]}))[0] == 429
            # The admin token is fixed at startup: changing it is refused, naming the field.
            path.write_text(text.replace(hash_key(ADMIN), hash_key("another-admin-token")))
            async with session.post(router.url + "/admin/reload", headers=admin) as resp:
                assert resp.status == 400
                assert "auth.admin_token_sha256" in (await resp.json())["error"]["message"]
            assert (await _post(router, path_, {"x-api-key": fresh}))[0] == 200
    finally:
        router.kill()


async def test_disabled_auth_serves_anyone_and_says_so_once(tmp_path: Path, sim: Proc) -> None:
    router = start_router(tmp_path, "[auth]\nenabled = false\n" + region_toml(sim))
    try:
        status, _, _ = await _post(router, "/v1/chat/completions", {})
        assert status == 200
        assert router.output().count("AUTH IS DISABLED") == 1
    finally:
        router.kill()
